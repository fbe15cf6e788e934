"""Data reading limits: a huge record costs what the truncated sequence needs, an over-long line is a bad line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp2draft import data
from mtp2draft.data import CHARS_PER_TOKEN, encode, prompt_ids, read_records
from mtp2draft.errors import DataError


class _SpyTokenizer:
    """Character-level stand-in that records how many characters it was asked to tokenise."""

    chat_template = None

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        self.seen.append(len(text))
        return {"input_ids": [ord(c) % 256 for c in text]}


def test_a_huge_text_record_is_capped_before_tokenising() -> None:
    tok = _SpyTokenizer()
    text = "abcdefghij" * 4_000_000  # 40 MB: tokenised whole it took 6.2 GB with a real tokenizer
    ex = encode({"text": text}, tok, max_length=64)
    assert tok.seen == [64 * CHARS_PER_TOKEN] and ex.input_ids == [ord(c) for c in text[:64]]
    ids = prompt_ids({"text": text + "END"}, tok, max_length=8)  # prompts keep their end
    assert tok.seen[-1] == 8 * CHARS_PER_TOKEN and ids == [ord(c) for c in (text + "END")[-8:]]


def test_a_line_over_the_limit_is_a_bad_line_read_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "x" * 5000}) + "\n" + json.dumps({"text": "ok"}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl:1: line is longer than"):
        read_records(path)
    records, skipped = read_records(path, skip_bad=True)
    assert records == [{"text": "ok"}] and skipped == 1
