"""The vLLM CPU-build workarounds that need no vLLM to check (target/vllm_side/cpu_fixes.py); the engine tests
(`pytest -m engine`) check them inside vLLM."""

from __future__ import annotations

import torch

from mtp2draft.target.backend import vllm_environment
from mtp2draft.target.vllm_side.cpu_fixes import NATIVE_EXPAND, expand_batch_to_tokens


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
