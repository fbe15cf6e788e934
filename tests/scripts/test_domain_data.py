"""scripts/domain_data.py: the in-domain distillation data never holds an evaluation prompt, and its split refuses
held-out prompts it cannot rebuild."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import domain_data  # noqa: E402


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


def test_committed_domain_data_holds_no_evaluation_prompt() -> None:
    prompts = _texts(ROOT / "examples/data/heldout.jsonl")
    domain = _texts(ROOT / "examples/data/domain.jsonl")
    assert len(domain) > 1000
    joined = "\x00".join(domain)
    # a prompt is 400-800 characters of one file: any shared file would put one inside a record
    assert not [i for i, p in enumerate(prompts) if p in joined]
    # and no record is training text the targets saw
    train = "\x00".join(_texts(ROOT / "examples/data/train.jsonl"))
    assert not [i for i, r in enumerate(domain[:200]) if r in train]


def _file(n: int) -> str:
    # each line is 60 characters, so text_chunks(400..800) cuts several prompt chunks out of 40 lines
    return "".join(f"# file {n:03d} line {i:03d} " + "x" * 38 + "\n" for i in range(40))


def test_split_leaves_out_the_files_behind_the_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [(f"k{n}", _file(n)) for n in range(10)]
    prompts = [c for _, text in files for c in domain_data.tt.spread(domain_data.tt.text_chunks(text, 400, 800), 3)]
    monkeypatch.setattr(domain_data, "PROMPTS", 7)  # the seventh prompt is the third file's first
    behind, rest = domain_data.split(files, prompts[:7])
    assert behind == 3
    assert rest == files[3:]
    with pytest.raises(SystemExit, match="differ from the committed file"):
        domain_data.split(files, [*prompts[:6], "another prompt"])
