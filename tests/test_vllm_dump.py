"""`dump-hidden --engine vllm` (engines/vllm_dump.py) without vLLM: the layer-id mapping, the view vLLM's extraction loads, the two computations done here
(the final norm, the top-k handed to the writer) and the CLI's --engine. The real engine: tests/testing/
test_engine_vllm.py (marker `engine`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from mtp2draft.cli.app import main
from mtp2draft.engines.choice import DUMP_ENGINES
from mtp2draft.engines.vllm_dump import VllmTarget, extract_view, vllm_layer_ids
from mtp2draft.family.spec import get_spec

ROOT = Path(__file__).resolve().parents[1]
MIMO, DEEPSEEK = ROOT / "examples" / "targets" / "tiny-mimo", ROOT / "examples" / "targets" / "tiny-deepseek-v3"


def test_layer_ids_are_vllm_inputs_of_the_next_layer_ascending() -> None:
    assert vllm_layer_ids([6, 1, 4], 8, want_final=True) == [2, 5, 7, 8]
    assert vllm_layer_ids([], 8, want_final=True) == [8]
    assert vllm_layer_ids([7], 8, want_final=True) == [8]  # the last layer's output is the pre-norm final hidden


def _keys(directory: Path) -> set[str]:
    out: set[str] = set()
    for shard in directory.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:
            out.update(fh.keys())  # noqa: SIM118 - safe_open handles are not iterable
    return out


def test_mimo_view_is_qwen2_without_the_mtp_layer(tmp_path: Path) -> None:
    view = extract_view(MIMO, tmp_path / "view", get_spec("mimo"))
    config = json.loads((view / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    mtp = {k for k in _keys(MIMO) if k.startswith("model.mtp_layers.")}
    assert mtp and _keys(view) == _keys(MIMO) - mtp
    index = json.loads((view / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == _keys(view)
    assert (view / "tokenizer.json").is_symlink()
    assert not (MIMO / "config.json").read_text().count("qwen2")  # the target itself is untouched


def test_a_target_vllm_extracts_from_as_is_gets_no_view(tmp_path: Path) -> None:
    assert extract_view(DEEPSEEK, tmp_path / "view", get_spec("deepseek_v3")) == DEEPSEEK
    assert not (tmp_path / "view").exists()


def test_a_target_giving_only_its_top_k_writes_the_same_dump(tmp_path: Path) -> None:
    """What VllmTarget hands the writer (top-k log-probs, no logits) is written exactly as the top-k of full logits."""
    from mtp2draft.settings import DumpConfig
    from mtp2draft.target.dumps import OfflineHiddenStates, dump_hidden_states
    from mtp2draft.target.hidden import Features, TargetModel

    target = TargetModel(str(MIMO))
    seqs = [{"input_ids": list(range(5 + n, 29 + n)), "loss_mask": [True] * 24} for n in range(3)]
    dump_hidden_states(target, seqs, tmp_path / "logits", DumpConfig(aux_layers=[1, 4], top_k=8))
    run = target.features

    def top_k_only(*args, **kwargs) -> Features:  # as an engine returns them: more than asked, sorted
        f = run(*args, **kwargs)
        values, ids = torch.log_softmax(f.logits.float(), dim=-1).topk(16, dim=-1)
        return Features(f.final, f.aux, topk_logprobs=values, topk_ids=ids)

    target.features = top_k_only
    dump_hidden_states(target, seqs, tmp_path / "top-k", DumpConfig(aux_layers=[1, 4], top_k=8))
    a, b = OfflineHiddenStates(tmp_path / "logits"), OfflineHiddenStates(tmp_path / "top-k")
    for n in range(len(seqs)):
        x, y = a.sequence(n), b.sequence(n)
        assert x.keys() == y.keys() and y["topk_ids"].shape[-1] == 8
        assert all(torch.equal(x[key], y[key]) for key in x), n


@pytest.mark.parametrize("norm", ["standard", "zero_centered"])
def test_post_norm_final_is_the_targets_rmsnorm(norm: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    weight, pre = torch.randn(32), torch.randn(5, 32) * 4
    fake = SimpleNamespace(
        final="post_norm", spec=SimpleNamespace(layer=SimpleNamespace(norm=norm)), _norm=weight, _eps=1e-6
    )
    reference = LlamaRMSNorm(32, eps=1e-6)
    reference.weight.data = weight + 1 if norm == "zero_centered" else weight
    torch.testing.assert_close(VllmTarget._final(fake, pre), reference(pre).detach())
    fake.final = "pre_norm"
    assert VllmTarget._final(fake, pre) is pre


def test_cli_engine_choices_come_from_the_registry(capsys, tmp_path: Path) -> None:
    assert main(["dump-hidden", "--help"]) == 0
    assert " | ".join(DUMP_ENGINES) in " ".join(capsys.readouterr().out.split()).replace("│ ", "")
    data = ROOT / "examples" / "data" / "heldout.jsonl"
    base = ["dump-hidden", "--target", str(MIMO), "--data", str(data), "--out", str(tmp_path / "out")]
    assert main([*base, "--engine", "sglang"]) == 2
    assert "--engine must be one of transformers, vllm" in capsys.readouterr().err
    assert main([*base, "--tensor-parallel-size", "2"]) == 2
    assert "--tensor-parallel-size is for --engine vllm" in capsys.readouterr().err


def test_cli_vllm_without_its_venv_is_one_line(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(tmp_path / "no-venv"))
    data = ROOT / "examples" / "data" / "heldout.jsonl"
    code = main(
        ["dump-hidden", "--target", str(MIMO), "--data", str(data), "--out", str(tmp_path / "out")]
        + ["--engine", "vllm", "--max-length", "16"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "no complete vLLM venv" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
