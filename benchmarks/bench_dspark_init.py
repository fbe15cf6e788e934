"""Does a DSpark drafter whose stages start from the target's MTP layer beat one that starts from random weights, at
equal training steps? (docs/notes/2026-12-06-dspark-from-mtp.md)

    python benchmarks/bench_dspark_init.py WORK [--target examples/targets/tiny-deepseek-v4] [--steps 150]
        [--table-only]

For a DeepSeek-V4-layout target that ships an MTP layer and no DSpark drafter, it builds two DeepSeek-V4 DSpark
drafters with `draft.dspark_v4_init.init_dspark_v4_from_mtp` that differ only in `init` ("mtp": every stage the MTP
block, the context projection the MTP layer's h_proj folded with its norm; "random": transformers' DeepSeek-V4 init;
the Markov and confidence heads start alike, seeded the same), then trains each with `mtp2draft distill` on the same
data, steps, learning rate and seed, and evaluates both with `mtp2draft evaluate --baseline` (real block drafting,
greedy, lossless checked) on two held-out prompt sets: A, the first `--prompts` prompts of heldout.jsonl (the set
docs/results.md uses), and B, the next `--prompts` (written to WORK/heldout-b.jsonl). Nothing is chosen on either set:
the protocol below is fixed before the run and run once. Printed per set: mean acceptance length, acceptance per
slot, and the MTP-minus-random difference with its 95 % paired bootstrap interval over prompts; also each drafter
before training.

It calls the `mtp2draft` CLI, so it measures what a user runs. Steps already done (their output present in WORK) are
not redone; `--table-only` only prints. About 40 minutes on 2 shared CPU cores at 150 steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from mtp2draft.data import load_tokenizer
from mtp2draft.draft.dspark_v4_init import INITS, init_dspark_v4_from_mtp
from mtp2draft.draft.dspark_v4_io import save_dspark_v4
from mtp2draft.draft.layout import load_native
from mtp2draft.family.dspark import DSparkFields

REPO = Path(__file__).resolve().parents[1]
# the protocol, fixed before the first run (one variant, not tuned): DSpark's block of 4, two stages reading the
# trunk's last three layers, a Markov head of rank 32 (the target's hidden is 128), the bundled targets' lr
PROTOCOL = {
    "num_stages": 2,
    "block_size": 4,
    "target_layer_ids": [1, 2, 3],
    "markov_rank": 32,
    "seed": 0,
    "distill": ["--lr", "1e-3", "--batch-size", "8", "--max-length", "256", "--seed", "0"],
    "evaluate": ["--max-new-tokens", "64", "--device", "cpu"],
}


def cli(*args: str, stdout=None) -> None:
    subprocess.run([sys.executable, "-m", "mtp2draft", *args], check=True, stdout=stdout)


def fields_for(target: Path) -> DSparkFields:
    tok = load_tokenizer(target)
    return DSparkFields(
        block_size=PROTOCOL["block_size"],
        target_layer_ids=tuple(PROTOCOL["target_layer_ids"]),
        noise_token_id=tok.pad_token_id,  # the rule of `distill --new-dspark`: no mask token here, so the pad token
        markov_rank=PROTOCOL["markov_rank"],
        n_routed_experts=None,
        num_experts_per_tok=None,
        section="config.json",
    )


def prompt_sets(data: Path, work: Path, prompts: int) -> dict[str, Path]:
    lines = (data / "heldout.jsonl").read_text().splitlines(keepends=True)
    if len(lines) < 2 * prompts:
        raise SystemExit(f"{data / 'heldout.jsonl'} has {len(lines)} prompts, fewer than 2 x {prompts}")
    a, b = work / "heldout-a.jsonl", work / "heldout-b.jsonl"
    a.write_text("".join(lines[:prompts]))
    b.write_text("".join(lines[prompts : 2 * prompts]))
    return {"A": a, "B": b}


def measure(target: Path, data: Path, work: Path, steps: int, prompts: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    mtp = load_native(str(target))
    fields = fields_for(target)
    for init in INITS:
        start = work / f"{init}-init"
        if not (start / "config.json").is_file():
            draft = init_dspark_v4_from_mtp(
                mtp, fields, num_stages=PROTOCOL["num_stages"], init=init, seed=PROTOCOL["seed"]
            )
            save_dspark_v4(draft, start)
        trained = work / f"{init}-{steps}"
        if not (trained / "config.json").is_file():
            train = ["--data", str(data / "train.jsonl"), "--steps", str(steps), "--save-every", str(steps)]
            cli("distill", str(start), "--target", str(target), *train, *PROTOCOL["distill"], "--out", str(trained))
    for name, prompts_file in prompt_sets(data, work, prompts).items():
        for stage, suffix in (("trained", f"-{steps}"), ("start", "-init")):
            out = work / f"{name}-{stage}.eval.json"
            if out.is_file():
                continue
            run = ["--target", str(target), "--data", str(prompts_file), *PROTOCOL["evaluate"], "--json"]
            partial = out.with_suffix(".partial")  # renamed when evaluate is done: a killed run leaves no result
            with partial.open("w") as f:
                cli("evaluate", str(work / f"mtp{suffix}"), *run, "--baseline", str(work / f"random{suffix}"), stdout=f)
            partial.replace(out)


def table(work: Path, steps: int) -> dict:
    summary = {"protocol": PROTOCOL, "steps": steps, "sets": {}}
    print(
        "| set | drafters | MTP-init: mean length | per draft | random: mean length | per draft | MTP - random [95 %] |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in ("A", "B"):
        for stage in ("start", "trained"):
            path = work / f"{name}-{stage}.eval.json"
            if not path.is_file():
                continue
            run = json.loads(path.read_text())
            mtp, rnd = run["results"][:2]
            diff = run["comparison"][0]["difference"]["mean_acceptance_length"]
            assert mtp["lossless"] and rnd["lossless"], f"{path}: not lossless"
            label = f"after {steps} steps" if stage == "trained" else "before training"
            slots = lambda r: " / ".join(f"{a:.3f}" for a in r["per_draft_acceptance"])  # noqa: E731
            print(
                f"| {name} ({run['num_prompts']} prompts) | {label} | {mtp['mean_acceptance_length']:.3f} | "
                f"{slots(mtp)} | {rnd['mean_acceptance_length']:.3f} | {slots(rnd)} | "
                f"{diff['value']:+.3f} [{diff['low']:.3f}, {diff['high']:.3f}] |"
            )
            summary["sets"][f"{name}-{stage}"] = {
                "mtp": {
                    k: mtp[k]
                    for k in ("mean_acceptance_length", "acceptance_per_position", "per_draft_acceptance", "lossless")
                },
                "random": {
                    k: rnd[k]
                    for k in ("mean_acceptance_length", "acceptance_per_position", "per_draft_acceptance", "lossless")
                },
                "difference": diff,
            }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--target", type=Path, default=REPO / "examples" / "targets" / "tiny-deepseek-v4")
    parser.add_argument("--data", type=Path, default=REPO / "examples" / "data")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    if not args.table_only:
        measure(args.target, args.data, args.work, args.steps, args.prompts)
    summary = table(args.work, args.steps)
    (args.work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
