"""Does distilling harm a good raw MTP head? The raw head against `distill`'s defaults and the demo's settings.

    python benchmarks/bench_do_no_harm.py TARGET_DIR DATA_DIR WORK [--prompts 64] [--settings NAME ...]
        [--max-k 5] [--table-only]

TARGET_DIR is a runnable target (examples/targets/tiny-mimo), DATA_DIR holds train.jsonl and heldout.jsonl (prompts
from packages the target never trained on). It converts the raw native head, distills it twice (the defaults; the
demo's 150 steps at lr 1e-3 and 4 TTT steps), and evaluates both beside the raw head on the same held-out prompts at
k = 1..5 greedy and k = 4 at temperature 1, each `evaluate` run written to WORK/k*.eval.json. Then it prints, per k and
setting, mean acceptance length and position-1 per-draft acceptance of the raw and the distilled head with the
difference's 95 % paired bootstrap interval over prompts (`mtp2draft.evaluation.compare`). `--settings "demo settings"`
runs one setting only, `--max-k 4` stops the greedy runs at k = 4 (for a slower target). Steps already done (their
output present in WORK) are not redone; `--table-only` only prints.

It calls the `mtp2draft` CLI, so it measures what a user runs. About 40 minutes on 2 shared cores for tiny-mimo.
docs/results.md ("Do no harm") holds its figures for both bundled targets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from mtp2draft.evaluation.compare import paired_bootstrap

SETTINGS = {  # name: distill options
    "defaults": [],
    "demo settings": ["--steps", "150", "--ttt-steps", "4", "--lr", "1e-3", "--save-every", "150"],
}


def runs(max_k: int) -> list[tuple[int, float]]:
    """(k, temperature) of every evaluate run: greedy at k = 1..max_k, then k = 4 at temperature 1."""
    return [(k, 0.0) for k in range(1, max_k + 1)] + [(4, 1.0)]


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mtp2draft", *args], check=True)


def run_file(work: Path, k: int, temperature: float) -> Path:
    return work / (f"k{k}.eval.json" if not temperature else f"k{k}-t{temperature:g}.eval.json")


def measure(target: Path, data: Path, work: Path, prompts: int, settings: list[str], max_k: int) -> None:
    raw = work / "raw"
    if not (raw / "config.json").is_file():
        cli("convert", str(target), "--out", str(raw), "--dtype", "float32")
    drafts = []
    for name in settings:
        options = SETTINGS[name]
        out = work / name.replace(" ", "-")
        if not (out / "config.json").is_file():
            train = ["--data", str(data / "train.jsonl"), "--device", "cpu", *options]
            cli("distill", str(raw), "--target", str(target), *train, "--out", str(out))
        drafts.append(out)
    for k, temperature in runs(max_k):
        path = run_file(work, k, temperature)
        if path.is_file():
            continue
        # results[0] is the first setting's draft, results[1] the raw head, results[2:] the other settings'
        args = ["evaluate", str(drafts[0]), "--target", str(target), "--data", str(data / "heldout.jsonl")]
        args += ["--baseline", str(raw), *(a for d in drafts[1:] for a in ("--baseline", str(d)))]
        args += ["-k", str(k), "--max-new-tokens", "64"]
        args += ["--max-prompts", str(prompts), "--device", "cpu", "--json"]
        if temperature:
            args += ["--temperature", f"{temperature:g}", "--seed", "0"]
        with path.with_suffix(".tmp").open("w") as fh:
            subprocess.run([sys.executable, "-m", "mtp2draft", *args], check=True, stdout=fh)
        path.with_suffix(".tmp").rename(path)


def table(work: Path, settings: list[str], max_k: int) -> str:
    lines = [
        "| k | T | setting | accept len: raw -> distilled (difference, 95 % CI) | position 1 per draft: raw -> "
        "distilled (difference, 95 % CI) |",
        "|---|---|---|---|---|",
    ]
    for k, temperature in runs(max_k):
        results = json.loads(run_file(work, k, temperature).read_text())["results"]
        raw, by_name = results[1], dict(zip(settings, [results[0], *results[2:]], strict=True))
        for name, draft in by_name.items():
            d = paired_bootstrap(draft, raw)["difference"]
            m, p = d["mean_acceptance_length"], d["per_draft_acceptance_1"]
            lines.append(
                f"| {k} | {temperature:g} | {name} | {raw['mean_acceptance_length']:.3f} -> "
                f"{draft['mean_acceptance_length']:.3f} ({m['value']:+.3f}, {m['low']:+.3f} .. {m['high']:+.3f}) | "
                f"{raw['per_draft_acceptance'][0]:.3f} -> {draft['per_draft_acceptance'][0]:.3f} "
                f"({p['value']:+.3f}, {p['low']:+.3f} .. {p['high']:+.3f}) |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--max-k", type=int, default=5)
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        measure(args.target, args.data, args.work, args.prompts, args.settings, args.max_k)
    print(table(args.work, args.settings, args.max_k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
