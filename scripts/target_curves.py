"""Read a bundled target's training curves and say what more training would buy.

    python scripts/target_curves.py examples/targets/tiny-deepseek-v3/training.json [--bar 0.40] [--json]

For each joint-phase curve point of `training.json` (scripts/train_target.py writes them: held-out next-token top-1,
MTP t+2 top-1, MTP = trunk on greedy t+2, 4-gram repeats of greedy continuations, CPU seconds) it prints the curve
and fits next-token top-1 against log(tokens seen) over the last half of the joint steps of the last joint phase
(least squares; a curve this short is close to log-linear there). It then says how many tokens, and how many CPU
hours at the run's own tokens per CPU second, the fit puts the `--bar` at. An extrapolation, labelled as one: it
assumes the learning rate schedule is stretched to the new length and that the model does not saturate first, so
it is a lower bound on what reaching the bar costs, not a promise.

What it does not do: train, or read anything but the one training.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def fit(points: list[dict]) -> tuple[float, float]:
    """top-1 = a + b * ln(tokens), least squares over `points`."""
    xs = [math.log(p["tokens"]) for p in points]
    ys = [p["heldout_next_token_top1"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def analyse(report: dict, bar: float) -> dict:
    curves = report["curves"]
    phases = report.get("phases") or [
        {"phase": "joint", "first_step": 0, "steps": report["joint_steps"]},
        {"phase": "mtp_only", "first_step": report["joint_steps"], "steps": report["mtp_only_steps"]},
    ]
    last_joint = [p for p in phases if p["phase"] == "joint"][-1]
    lo, hi = last_joint["first_step"] + last_joint["steps"] // 2, last_joint["first_step"] + last_joint["steps"]
    tail = [c for c in curves if lo <= c["step"] <= hi and c["phase"] == "joint"]
    best = max(curves, key=lambda c: c["heldout_next_token_top1"])
    out = {
        "family": report["family"],
        "cpu_minutes": round(report["cpu_time_s"] / 60, 1),
        "tokens_seen": report["tokens_seen"],
        "final": {
            "next_token_top1": report["next_token_top1"],
            "greedy_repeat_rate": report["greedy_repeat_rate"],
            "mtp_vs_trunk_greedy_t2": report["mtp_vs_trunk_greedy_t2"],
        },
        "best_curve_point": {"step": best["step"], "next_token_top1": best["heldout_next_token_top1"]},
        "fit_points": len(tail),
    }
    if len(tail) >= 3:
        a, b = fit(tail)
        out["fit"] = {"intercept": a, "per_ln_token": b, "steps": [tail[0]["step"], tail[-1]["step"]]}
        if b > 0 and report["next_token_top1"] < bar:
            need = math.exp((bar - a) / b)
            rate = report["tokens_seen"] / report["cpu_time_s"]
            out["bar"] = {"top1": bar, "tokens": int(need), "cpu_hours": round(need / rate / 3600, 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("training_json", type=Path)
    ap.add_argument("--bar", type=float, default=0.40, help="next-token top-1 to extrapolate to")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = json.loads(args.training_json.read_text())
    res = analyse(report, args.bar)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("| step | phase | tokens | CPU min | next top-1 | MTP t+2 top-1 | MTP = trunk greedy t+2 | 4-gram repeats |")
    print("|---|---|---|---|---|---|---|---|")
    for c in report["curves"]:
        if c["step"] % 500 == 0 or c is report["curves"][-1]:
            print(
                f"| {c['step']} | {c['phase']} | {c['tokens'] / 1e6:.1f}M | {c['cpu_s'] / 60:.0f} | "
                f"{c['heldout_next_token_top1']:.3f} | {c['heldout_mtp_t2_top1']:.3f} | "
                f"{c['mtp_vs_trunk_greedy_t2']:.3f} | {c['repeated_4gram_fraction_greedy']:.3f} |"
            )
    print(
        f"\n{res['family']}: {res['cpu_minutes']} CPU minutes, {res['tokens_seen'] / 1e6:.1f}M tokens; {res['final']}"
    )
    if "fit" in res:
        f = res["fit"]
        print(
            f"fit over steps {f['steps'][0]}..{f['steps'][1]}: top-1 = {f['intercept']:.3f} + {f['per_ln_token']:.4f} ln(tokens)"
        )
    if "bar" in res:
        b = res["bar"]
        print(
            f"extrapolated: top-1 {b['top1']} at {b['tokens'] / 1e6:.0f}M tokens, ~{b['cpu_hours']} CPU hours at this rate"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
