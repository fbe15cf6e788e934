"""What training is for, checked cheaply: a short distill on a bundled target is no worse than the raw MTP head on
held-out prompts it never trained on.

Every other distill test checks the mechanics (the loss falls, checkpoints resume, the math equals serving); this one
fails when training teaches the wrong thing. The score is measured here from the definition, not with the code under
test's loss or mask: the target's own logits on each held-out sequence, the draft's unrolled step logits, and the
share of positions where the draft's top-1 at step s equals the target's next-token choice there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.evaluation.decode import TargetRunner
from mtp2draft.target.hidden import Features, TargetModel
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData
from mtp2draft.train.ttt import ttt_logits

ROOT = Path(__file__).resolve().parents[1]
TINY_MIMO = ROOT / "examples" / "targets" / "tiny-mimo"
DATA = ROOT / "examples" / "data"
STEPS, K, LENGTH = 20, 3, 64
HELD_OUT = slice(100, 108)  # heldout.jsonl lines 101-108: not the prompts results.md reports, never trained on
MARGIN = 0.15


def implied_acceptance(draft_dir: Path, target: TargetModel, sequences: list[list[int]]) -> float:
    """sum_j prod_{i<=j} a_i, a_i = P(the draft's top-1 at step i equals the target's greedy token there), teacher
    forced: step s at origin p predicts token p + s + 2, whose greedy choice is the argmax of the target's logits at
    position p + s + 1."""
    draft = load_draft(draft_dir).eval()
    draft.attach_target(target.embedding().float(), target.lm_head().float())
    runner = TargetRunner(target, draft)
    hits, counts = [0] * K, [0] * K
    with torch.no_grad():
        for seq in sequences:
            logits, step0 = runner.forward(seq, runner.start())  # [T, V], [1, T, H]
            ids = torch.tensor([seq])
            steps = ttt_logits(draft, Features(step0, None), ids, K)
            for s in range(K):
                n = len(seq) - s - 2  # origins whose predicted token exists
                hits[s] += int((steps[s][0, :n].argmax(-1) == logits[s + 1 : s + 1 + n].argmax(-1)).sum())
                counts[s] += n
    total, run = 0.0, 1.0
    for h, c in zip(hits, counts, strict=True):
        run *= h / c
        total += run
    return total


def held_out_sequences() -> list[list[int]]:
    import json

    tok = load_tokenizer(TINY_MIMO)
    lines = (DATA / "heldout.jsonl").read_text().splitlines()[HELD_OUT]
    return [tok(json.loads(line)["text"])["input_ids"][:LENGTH] for line in lines]


def short_distill(raw: Path, out: Path, seed: int = 0) -> None:
    cfg = DistillConfig(steps=STEPS, ttt_steps=K, lr=1e-3, batch_size=4, max_length=LENGTH, save_every=STEPS, seed=seed)
    distill(
        DistillJob(
            draft_dir=raw, out=out, target=str(TINY_MIMO), data=TrainingData(data=DATA / "train.jsonl"), config=cfg
        )
    )


@pytest.mark.slow
def test_a_short_distill_is_no_worse_than_the_raw_head_on_held_out_prompts(tmp_path: Path) -> None:
    """tiny-mimo, 20 steps (3 TTT steps, lr 1e-3, batch 4 x 64 tokens of train.jsonl), against the raw head.

    Margin 0.15, from measured run-to-run noise: the raw head scores 1.164 on these prompts; three data-order seeds
    of this distill scored 1.124, 1.094, 1.161 (a 20-step distill moves a good head by at most 0.07 either way);
    0.15 is twice the largest such move. The same distill with the teacher read one token late scores 0.371."""
    convert(str(TINY_MIMO), tmp_path / "raw", dtype="float32")
    short_distill(tmp_path / "raw", tmp_path / "ft")
    target, sequences = TargetModel(str(TINY_MIMO)), held_out_sequences()
    raw, trained = (implied_acceptance(tmp_path / d, target, sequences) for d in ("raw", "ft"))
    assert trained >= raw - MARGIN, (raw, trained)
