"""Serving speed with and without the draft, from vLLM's own clock.

For each bundled target (examples/targets) the raw MTP head (`convert`, bf16 like the target) is served in vLLM the
way `evaluate --engine vllm` serves it (stitched export over the target, `{"method": "mtp"}`, the checkpoint's own
dtype), and the same target is served without it. Each engine decodes rounds of N requests submitted together
(N = 1, 8, 32, 64 in flight), every request `--new-tokens` tokens long (`ignore_eos`, so both sides emit the same
tokens' count), greedy, the rounds interleaved (1, 8, 32, 64, 1, 8, ...) `--repeats` times so that load drift on a
shared machine spreads over all of them. Per round, from the engine core's per-request timestamps
(vllm_side/serve_driver.py): output tokens/s = all output tokens / (last token - first scheduling), time per
output token = mean over requests of (last - first token) / (tokens - 1). Reported: the median of the repeats and
their range. The 1-minute load average is sampled every 5 s while it runs (the machine is shared).

    python benchmarks/bench_engine.py [--k 3] [--new-tokens 64] [--repeats 3] [--json out.json]

What it does not do: distill (the raw head is what `convert` gives), or measure acceptance against mtp2draft's own
decoding (the engine tests do that).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# name -> (target, its held-out prompts): the bundled targets (examples/targets/README.md)
TARGETS = {
    name: (ROOT / "examples" / "targets" / name, ROOT / "examples" / "data" / "heldout.jsonl")
    for name in ("tiny-mimo", "tiny-deepseek-v3")
}
DEFAULT_TARGETS = "tiny-mimo,tiny-deepseek-v3"
CONCURRENCY = (1, 8, 32, 64)


def log(msg: str) -> None:
    print(f"[bench-engine] {msg}", file=sys.stderr, flush=True)


class LoadSampler:
    """The 1-minute load average every `every` seconds, in a thread."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(every)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        s = self.samples or [os.getloadavg()[0]]
        return {"min": min(s), "median": statistics.median(s), "max": max(s), "samples": len(s)}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def bench_target(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from mtp2draft.conversion import convert
    from mtp2draft.data import load_tokenizer
    from mtp2draft.engines.vllm_evaluate import acceptance, serve_runs
    from mtp2draft.engines.vllm_serve import EngineSetup, Generation, run_vllm
    from mtp2draft.evaluation.decode import load_prompts
    from mtp2draft.kinds import DraftKind

    target, heldout = TARGETS[name]
    w = work / name.replace("/", "-")
    raw = w / "raw"
    convert(str(target), raw, to="mtp")
    tok = load_tokenizer(target)
    prompts = load_prompts(heldout, tok, args.prompts, args.prompt_length)
    runs = serve_runs([("mtp", str(raw))], {"mtp": DraftKind.MTP}, target, w, args.k, "bfloat16")
    rounds = [c for _ in range(args.repeats) for c in CONCURRENCY]
    started = time.perf_counter()
    generation = Generation(max_new_tokens=args.new_tokens, rounds=rounds, ignore_eos=True)
    setup = EngineSetup(dtype="auto", max_model_len=args.prompt_length + args.new_tokens + args.k + 8)
    version, results = run_vllm(runs, prompts, generation, setup, log=log)
    out: dict[str, Any] = {"vllm_version": version, "wall_s": round(time.perf_counter() - started, 1), "runs": {}}
    for run_name, r in results.items():
        r.check()
        by_c: dict[int, dict[str, list[float]]] = {}
        for rd in r.rounds:
            t = rd["timing"] or {}
            by_c.setdefault(rd["size"], {"tokens_per_s": [], "tpot_ms": []})
            by_c[rd["size"]]["tokens_per_s"].append(t.get("output_tokens_per_s") or 0.0)
            by_c[rd["size"]]["tpot_ms"].append(t.get("tpot_ms") or 0.0)
        out["runs"][run_name] = {
            "start_s": r.start_s,
            "acceptance": acceptance(r.metrics, args.k) if r.metrics else None,
            "concurrency": {c: {m: spread(v) for m, v in d.items()} for c, d in sorted(by_c.items())},
        }
    return out


def table(name: str, res: dict[str, Any]) -> str:
    plain, mtp = res["runs"]["plain"]["concurrency"], res["runs"]["mtp"]["concurrency"]
    acc = res["runs"]["mtp"]["acceptance"]
    lines = [
        f"{name}: vLLM {res['vllm_version']}, raw MTP head, acceptance length {acc['mean_acceptance_length']:.2f}",
        "| in flight | output tok/s, no draft | output tok/s, MTP | speedup | TPOT ms, no draft | TPOT ms, MTP |",
        "|---|---|---|---|---|---|",
    ]

    def cell(s: dict[str, float], fmt: str) -> str:
        return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"

    for c in plain:
        p, m = plain[c], mtp[c]
        ratio = m["tokens_per_s"]["median"] / p["tokens_per_s"]["median"] if p["tokens_per_s"]["median"] else 0
        lines.append(
            f"| {c} | {cell(p['tokens_per_s'], '.0f')} | {cell(m['tokens_per_s'], '.0f')} | {ratio:.2f}x | "
            f"{cell(p['tpot_ms'], '.2f')} | {cell(m['tpot_ms'], '.2f')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step (vLLM's num_speculative_tokens)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16, help="distinct held-out prompts, cycled to fill a round")
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--targets", default=DEFAULT_TARGETS, help=f"comma-separated, of: {', '.join(TARGETS)}")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp, LoadSampler() as load:
        for name in args.targets.split(","):
            log(f"{name}: serving with and without the raw MTP head")
            report["targets"][name] = bench_target(name, Path(tmp), args)
    report["load_average_1min"] = load.summary()
    for name, res in report["targets"].items():
        print(table(name, res) + "\n")
    la = report["load_average_1min"]
    print(f"load average (1 min) while it ran: median {la['median']:.2f}, {la['min']:.2f}-{la['max']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
