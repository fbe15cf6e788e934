"""Teacher-forced top-1 of drafts, per draft step, on the evaluation's own prompts and the target's greedy continuations.

    python scripts/teacher_forced.py TARGET_DIR HELDOUT.jsonl DRAFT [DRAFT ...] [--prompts 64] [--max-new-tokens 64]
        [--steps 3]

`evaluate` reports acceptance by position over verification rounds: a round starts just after the target corrected
the draft, so position 1 is scored at the places the draft has just been wrong, which are harder than the average
token. This scores the same tokens without that selection: the prompts `evaluate` reads (its `--max-prompt-length`
256), each continued greedily by the target for `--max-new-tokens` (the text `evaluate` decodes, every draft's output
being lossless), then every draft unrolled over every continuation position at once with the data tokens forced
(`train.ttt.ttt_forward`, what `distill` trains and logs as top-1), so step s's figure is how often the draft's
token for x[p + s + 2] equals the target's greedy one given the true tokens before it. Against `distill`'s training
top-1 it separates what the draft does on unseen training text from what it does on the evaluation's text; against
`evaluate`'s position 1 it measures the round-start selection. It prints one line per draft; CPU, fp32, nothing
written. docs/benchmarks.md ("Chain drafts") quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mtp2draft.data import Example, load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.evaluation.decode import TargetRunner, greedy_reference, load_prompts
from mtp2draft.target.hidden import TargetModel
from mtp2draft.train import ttt
from mtp2draft.train.teacher import collate


def continuations(tm: TargetModel, tok, draft, heldout: Path, prompts: int, new_tokens: int) -> list[Example]:
    """The evaluation's prompts, each with the target's greedy continuation; loss positions on the continuation."""
    runner = TargetRunner(tm, draft)  # the draft is not used by the greedy reference, the runner needs one
    out = []
    for ids in load_prompts(heldout, tok, prompts, 256):
        ref = greedy_reference(runner, ids, new_tokens, tok.eos_token_id)
        out.append(Example(ids + ref, [False] * len(ids) + [True] * len(ref), len(ids)))
    return out


def top1(tm: TargetModel, draft, examples: list[Example], pad: int, steps: int) -> list[float]:
    """Teacher-forced top-1 agreement with the target per draft step, over every continuation position."""
    correct, count = top1_counts(tm, draft, examples, pad, steps)
    return [c / max(n, 1) for c, n in zip(correct, count, strict=True)]


def top1_counts(tm: TargetModel, draft, examples: list[Example], pad: int, steps: int) -> tuple[list[int], list[int]]:
    """Per draft step: (positions where the draft's token is the target's, positions scored)."""
    correct, count = [0] * steps, [0] * steps
    with torch.no_grad():
        for i in range(0, len(examples), 8):
            batch = collate(examples[i : i + 8], pad)  # [8, T] right-padded, loss on continuation tokens only
            feats = tm.features(
                batch["input_ids"], batch["attention_mask"], want_final=True, final=getattr(draft, "input_hidden", None)
            )
            stats = ttt.ttt_forward(draft, feats, batch["input_ids"], batch["loss_mask"], steps, [1.0] * steps)
            correct = [a + c for a, c in zip(correct, stats.per_step_correct, strict=True)]
            count = [a + n for a, n in zip(count, stats.per_step_count, strict=True)]
    return correct, count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("heldout", type=Path)
    ap.add_argument("drafts", type=Path, nargs="+")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="draft steps unrolled per position")
    args = ap.parse_args()
    tm = TargetModel(str(args.target), dtype="float32", device="cpu")
    tok = load_tokenizer(tm.path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    examples: list[Example] | None = None
    for path in args.drafts:
        draft = load_draft(path, dtype=tm.dtype).eval()
        draft.attach_target(tm.embedding(), tm.lm_head())
        if examples is None:
            examples = continuations(tm, tok, draft, args.heldout, args.prompts, args.max_new_tokens)
            print(
                f"{len(examples)} prompts, {sum(sum(e.loss_mask) for e in examples)} continuation tokens",
                file=sys.stderr,
            )
        acc = top1(tm, draft, examples, pad, args.steps)
        print(f"{path.name}: teacher-forced top-1 per step " + " ".join(f"{a:.3f}" for a in acc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
