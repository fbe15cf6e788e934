"""Smoke test of scripts/train_target.py: a few steps on a dozen stdlib files must write every target in its hub
layout (loadable by transformers and by mtp2draft), the tokenizer, training.json and the data files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_target.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out, data = tmp_path_factory.mktemp("targets"), tmp_path_factory.mktemp("data")
    cmd = [sys.executable, str(SCRIPT), "--family", "all", "--out", str(out), "--data-out", str(data)]
    cmd += ["--steps", "2", "--max-files", "12", "--batch-size", "2", "--seq-len", "64"]
    cmd += ["--eval-windows", "2", "--gen-prompts", "2", "--gen-tokens", "4"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == ""  # logs go to stderr; nothing (no text, no tokens) to stdout
    return out, data


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "cls", "spec", "layers"),
    [
        ("tiny-deepseek-v3", "DeepseekV3ForCausalLM", "deepseek_v3", 1),
        ("tiny-mimo", "Qwen2ForCausalLM", "mimo", 1),
        ("tiny-mimo-3mtp", "Qwen2ForCausalLM", "mimo", 3),  # warm-started from tiny-mimo's run
        ("tiny-deepseek-v4", "DeepseekV4ForCausalLM", "deepseek_v4", 1),  # 4 residual streams, release key names
    ],
)
def test_target_loads(trained: tuple[Path, Path], name: str, cls: str, spec: str, layers: int) -> None:
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoTokenizer

    import mtp2draft
    from mtp2draft.draft.layout import load_native

    target = trained[0] / name
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    for shard in shards:
        with safe_open(str(target / shard), "pt") as fh:
            for key in sorted(fh.keys()):
                # fp32 as the releases keep them: router biases; V4's hyper-connection mixes and sink logits
                fp32 = key.endswith(("e_score_correction_bias", "gate.bias", "attn_sink")) or "hc_" in key
                want = "I64" if key.endswith("tid2eid") else "F32" if fp32 else "BF16"
                assert fh.get_slice(key).get_dtype() == want, key

    info = mtp2draft.inspect_checkpoint(str(target))
    assert info["spec"] == spec and info["num_mtp_layers"] == layers

    mtp = load_native(str(target))
    assert mtp.spec.name == spec and mtp.embed_weight is not None
    model = getattr(transformers, cls).from_pretrained(str(target), dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, 4096) and torch.isfinite(logits).all()
    logits, _ = mtp(ids[:, 1:], torch.randn(1, 3, *mtp.hidden_shape), torch.arange(3)[None])
    assert logits.shape == (1, 3, 4096)

    tok = AutoTokenizer.from_pretrained(str(target))
    assert tok.is_fast and tok.eos_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    chat = tok.apply_chat_template([{"role": "user", "content": "x = 1"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nx = 1<|im_end|>\n<|im_start|>assistant\n"

    report = json.loads((target / "training.json").read_text())
    assert report["steps"] == 2 and report["tokens_seen"] == 2 * 2 * 64
    assert report["heldout"]["next_token_loss"] > 0 and "mtp_vs_trunk_greedy_t2" in report["heldout"]["greedy"]
    assert len(report["script_sha256"]) == 64
    assert report["mtp_layers"] == layers
    if layers > 1:  # every depth measured, and every layer written under its own keys
        assert len(report["chain_top1_by_depth"]) == layers
        assert {k.split(".")[2] for k in index["weight_map"] if ".mtp_layers." in k} == {str(i) for i in range(layers)}


@pytest.mark.slow
def test_data_files(trained: tuple[Path, Path]) -> None:
    data = trained[1]
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (data / "heldout.jsonl").read_text().splitlines()]
    chat = [json.loads(line) for line in (data / "chat.jsonl").read_text().splitlines()]
    assert train and held and chat
    assert all(1000 <= len(r["text"]) <= 2000 for r in train)
    assert all(400 <= len(r["text"]) <= 800 for r in held)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in chat)
    assert not {r["text"] for r in held} & {r["text"] for r in train}
