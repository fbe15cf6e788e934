"""scripts/teacher_forced.py: its text is the target's own greedy continuations, and it scores each continuation token
once per step whatever the batching (no padding position counted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.target.hidden import TargetModel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import teacher_forced as tf  # noqa: E402


def test_continuations_are_greedy_and_every_token_is_scored_once_per_step(target, tmp_path: Path) -> None:
    src = target("mimo", num_nextn_predict_layers=3)
    convert(str(src), tmp_path / "chain", all_layers=True, dtype="float32")
    heldout = tmp_path / "heldout.jsonl"
    texts = [f"def f{i}(x):\n    return x * {i}" + " + x" * (3 * i) for i in range(11)]  # 11 lengths: two batches
    heldout.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tm = TargetModel(str(src), dtype="float32", device="cpu")
    tok = load_tokenizer(tm.path)
    draft = load_draft(tmp_path / "chain", dtype=tm.dtype).eval()
    draft.attach_target(tm.embedding(), tm.lm_head())

    examples = tf.continuations(tm, tok, draft, heldout, prompts=11, new_tokens=10)
    assert len(examples) == 11
    for e in examples:
        n = e.prompt_length
        assert e.loss_mask == [False] * n + [True] * (len(e.input_ids) - n) and len(e.input_ids) > n
        with torch.no_grad():
            logits = tm.model(torch.tensor([e.input_ids])).logits[0]  # [T, V]
        assert logits[n - 1 : -1].argmax(-1).tolist() == e.input_ids[n:]  # each scored token is the target's greedy one

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    as_read = tf.top1_counts(tm, draft, examples, pad, steps=3)
    # reversed, the 8-example batches hold other examples, so each is padded to another width
    other = tf.top1_counts(tm, draft, list(reversed(examples)), pad, steps=3)
    tokens = sum(sum(e.loss_mask) for e in examples)
    # every step scores each continuation token once (step s from the position s + 2 before it, prompt positions
    # included), and never a padding position, however the batches pad
    assert as_read[1] == other[1] == [tokens] * 3
    assert tf.top1(tm, draft, examples, pad, 3) == [c / n for c, n in zip(*as_read, strict=True)]
