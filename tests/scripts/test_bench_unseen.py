"""scripts/bench_unseen.py's data: named, deterministic, and prompts never drawn from a training file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_unseen.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_unseen", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unseen_data_is_deterministic_and_prompts_are_disjoint_from_training(tmp_path: Path) -> None:
    mod = _module()
    info = mod.build_data(tmp_path / "a")
    mod.build_data(tmp_path / "b")
    for name in ("train.jsonl", "prompts.jsonl", "data.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert info["source"].startswith("huggingface_hub ")
    assert 0 < info["prompt_files"] < info["files"] and info["train_records"] > 0 and info["prompts"] > 0
    train = [json.loads(line)["text"] for line in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    prompts = [json.loads(line)["text"] for line in (tmp_path / "a" / "prompts.jsonl").read_text().splitlines()]
    corpus = "\n".join(train)
    # a prompt chunk is whole lines of a prompt file: found verbatim in the training text only if a file leaked
    # (short, boilerplate-only chunks could repeat across files; every chunk here is 400+ characters)
    leaked = [p for p in prompts if p in corpus]
    assert len(leaked) <= len(prompts) // 20, f"{len(leaked)} of {len(prompts)} prompts occur verbatim in training"
