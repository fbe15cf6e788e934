"""The vLLM CPU-build workarounds that need no vLLM to check (engines/vllm_side/cpu_fixes.py); the engine tests
(`pytest -m engine`) check them inside vLLM."""

from __future__ import annotations

import torch

from mtp2draft.engines.vllm_launch import vllm_environment
from mtp2draft.engines.vllm_side.cpu_fixes import NATIVE_EXPAND, NATIVE_ROPE, engine_options, expand_batch_to_tokens


def test_expand_batch_to_tokens_repeats_each_request_by_its_draft_count() -> None:
    """What vLLM 0.32's Triton kernel computes: request i's value once per token of its span in cu_num_tokens,
    `replace_from` values replaced (temperature 0 -> 1 for greedy rows), past the spans zero."""
    x = torch.tensor([1.0, 0.7, 0.0, 0.5])
    cu = torch.tensor([2, 5, 5, 6], dtype=torch.int32)  # spans of 2, 3, 0, 1 tokens
    got = expand_batch_to_tokens(x, cu, 8, replace_from=0, replace_to=1)
    want = [1.0, 1.0, 0.7, 0.7, 0.7, 0.5, 0.0, 0.0]
    assert torch.allclose(got, torch.tensor(want)) and got.dtype == x.dtype
    ints = expand_batch_to_tokens(torch.tensor([3, 0]), torch.tensor([1, 3]), 3, replace_from=0, replace_to=9)
    assert ints.tolist() == [3, 9, 9]


def test_the_expand_fix_is_asked_for_on_every_model_and_can_be_turned_off(monkeypatch) -> None:
    monkeypatch.delenv(NATIVE_EXPAND, raising=False)
    assert vllm_environment()[NATIVE_EXPAND] == "1"
    monkeypatch.setenv(NATIVE_EXPAND, "0")
    assert vllm_environment()[NATIVE_EXPAND] == "0"


def _fake_vllm_platform(monkeypatch, cpu: bool) -> None:
    """vllm.platforms.current_platform as the drivers see it (vLLM is not installed beside mtp2draft)."""
    import sys
    import types

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: cpu)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def test_an_mla_target_on_cpu_gets_the_reference_mla_backend_for_target_and_draft(monkeypatch) -> None:
    """vLLM 0.32 gives a draft no inherited backend: the target's CPU_MLA alone leaves an MTP draft on AMX_MLA and
    the engine refuses to start ("No common block size"), so the draft's config names the backend too."""
    _fake_vllm_platform(monkeypatch, cpu=True)
    monkeypatch.setenv(NATIVE_ROPE, "1")
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    got = engine_options(spec)
    assert got["attention_config"] == {"backend": "CPU_MLA"}
    assert got["speculative_config"] == {**spec, "attention_backend": "CPU_MLA"}
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}  # the caller's dict untouched
    assert engine_options(None) == {"speculative_config": None, "attention_config": {"backend": "CPU_MLA"}}


def test_other_targets_and_gpus_get_the_speculative_config_as_given(monkeypatch) -> None:
    spec = {"method": "eagle3", "num_speculative_tokens": 2, "model": "d"}
    monkeypatch.delenv(NATIVE_ROPE, raising=False)
    assert engine_options(spec) == {"speculative_config": spec}  # no MLA target: vLLM never imported
    _fake_vllm_platform(monkeypatch, cpu=False)
    monkeypatch.setenv(NATIVE_ROPE, "1")
    assert engine_options(spec) == {"speculative_config": spec}
