#!/usr/bin/env python3
"""Acceptance along ONE distillation run per initialisation, and the time to 90 % of the final acceptance (issue 12).

Sibling of scripts/bench_unseen.py (same unseen data, settings `BASE` and draft vocabulary; its `--work` layout):
one run of `--steps` steps per init (`e3-mtp`: EAGLE-3 converted from the MTP layer; `e3-rand`: random-init EAGLE-3
as bench_acceptance.py builds it; `native`: the native MTP draft) is cut at the `--points` with distill's
`stop_after` and continued with `resume=True` (tests/test_distill.py checks that a resumed run reaches the same
weights as an uninterrupted one; `--check` compares the final draft byte for byte with bench_unseen's uninterrupted
row of the same steps when there is one). At each point a copy of the newest checkpoint is written out as a draft by
a `resume=True` call whose `steps` is that point: it trains nothing and writes the checkpoint's weights (the
schedule's `steps` is outside the resume guard's settings hash, and nothing else differs). Step 0 is the start
draft: the calibrated-only EAGLE-3 (`e3-mtp-0`), the random-init one as built, or the raw MTP head.

`--evaluate K` measures every point with `evaluate` (16 prompts, 48 new tokens by default, lossless checked) and
prints, per init, acceptance vs step, the cumulative training seconds (each segment's distill time, its setup
included), and the first measured step (and its seconds) reaching 90 % of the final mean acceptance length and 90 %
of the final gain over 1 token. Figures go to `--work/curves.json` (`evaluate` for 16 prompts, `evaluate-<n>p`
for another count). `--seed N` runs a second curve per init on distill seed N (another data order), stored as
`<init>-seedN`, without a step-0 point.

What it does not do: change any distill option between segments, or read the prompts before the runs are done.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp2draft.io import write_json  # noqa: E402
from mtp2draft.train.recipe import distill  # noqa: E402
from mtp2draft.train.settings import DistillConfig  # noqa: E402

# init -> (bench_unseen source key, the uninterrupted bench_unseen row of 240 / 120 steps to compare with, step 0)
INITS = {
    "e3-mtp": ("eagle3", "e3-mtp-{steps}", "e3-mtp-0"),
    "e3-rand": ("eagle3-random", "e3-rand-{steps}", "src-e3-rand"),
    "native": ("mtp", "native-{steps}", "src-mtp"),
}


def _unseen():
    spec = importlib.util.spec_from_file_location("bench_unseen", ROOT / "scripts" / "bench_unseen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config(init: str, steps: int, save_every: int, seed: int = 0) -> DistillConfig:
    bu = _unseen()
    extra = {} if init == "native" else {"draft_vocab_size": bu.DRAFT_VOCAB}
    return DistillConfig(**{**bu.BASE, "steps": steps, "save_every": save_every, "seed": seed, **extra})


def key(init: str, seed: int) -> str:
    """The curve's name in curves.json: the init, with `-seed<N>` for a run of another distill seed (data order)."""
    return init if seed == 0 else f"{init}-seed{seed}"


def train_curve(target: Path, w: Path, init: str, steps: int, points: list[int], seed: int = 0) -> dict[str, Any]:
    """One run cut at `points`; a draft written at each point; returns per-point cumulative seconds."""
    bu = _unseen()
    src = bu.sources(target, w)[INITS[init][0]]
    name = f"curve-{key(init, seed)}-{steps}"
    ckpt = w / f"{name}.checkpoints"
    data = w.parent / "data" / "train.jsonl"
    save_every = math.gcd(*points)
    record: dict[str, Any] = {"points": {}, "write_seconds": {}}
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(w / name, ignore_errors=True)
    done, total = 0, 0.0
    for p in [*points, steps]:
        t = time.perf_counter()
        res = distill(
            src,
            w / name,
            data,
            str(target),
            config=config(init, steps, save_every, seed),
            resume=done > 0,
            checkpoint_dir=ckpt,
            stop_after=None if p == steps else p - done,
            progress=lambda m: log(f"{name}: {m}"),
        )
        total += res.seconds
        log(f"{name}: steps {done}..{p} in {time.perf_counter() - t:.0f} s wall ({res.seconds:.0f} s distill)")
        done = p
        record["points"][p] = round(total, 1)
        if p == steps:
            break
        # write the checkpoint at step p as a draft: a resumed call with steps = p trains nothing, then saves
        copy = w / f"{name}.at{p}.checkpoints"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ckpt, copy)
        t = time.perf_counter()
        distill(
            src,
            w / f"{name}-step{p}",
            data,
            str(target),
            config=config(init, p, save_every, seed),
            resume=True,
            checkpoint_dir=copy,
            overwrite=True,
            progress=lambda m, p=p: log(f"{name} write {p}: {m}"),
        )
        record["write_seconds"][p] = round(time.perf_counter() - t, 1)
        shutil.rmtree(copy, ignore_errors=True)
    row = w / INITS[init][1].format(steps=steps) / "model.safetensors"
    if row.is_file() and seed == 0:  # the uninterrupted rows are seed 0's
        same = row.read_bytes() == (w / name / "model.safetensors").read_bytes()
        record["same_bytes_as_uninterrupted"] = same
        log(f"{name}: final draft {'==' if same else '!='} uninterrupted {row.parent.name}")
    return record


def curve_drafts(w: Path, init: str, steps: int, points: list[int], seed: int = 0) -> dict[int, Path]:
    """Each point's draft; step 0 only for seed 0 (another seed calibrates on another first batch)."""
    name = f"curve-{key(init, seed)}-{steps}"
    out = {0: w / INITS[init][2]} if seed == 0 else {}
    out.update({p: w / f"{name}-step{p}" for p in points})
    out[steps] = w / name
    return out


def first_reaching(curve: dict[int, float], seconds: dict[int, float], gain: bool) -> dict[str, Any]:
    final = curve[max(curve)]
    goal = 1 + 0.9 * (final - 1) if gain else 0.9 * final
    step = min(s for s, v in curve.items() if v >= goal)
    return {"goal": round(goal, 3), "step": step, "seconds": seconds.get(step, 0.0)}


def section(prompts: int) -> str:
    """Where a curve's figures go: `evaluate` for the protocol's 16 prompts, `evaluate-<n>p` for another count."""
    return "evaluate" if prompts == 16 else f"evaluate-{prompts}p"


def table(fig: dict[str, Any], k: int, sec: str = "evaluate") -> str:
    steps = sorted({int(s) for c in fig["curves"].values() for s in c.get(sec, {}).get(str(k), {})})
    lines = [
        "| init | "
        + " | ".join(f"step {s}" for s in steps)
        + " | 90 % of final (steps / s) | 90 % of gain (steps / s) |",
        "|---|" + "---|" * len(steps) + "---|---|",
    ]
    for init, c in fig["curves"].items():
        ev = {int(s): v for s, v in c.get(sec, {}).get(str(k), {}).items()}
        if not ev:
            continue
        secs = {0: 0.0, **{int(s): v for s, v in c["train"]["points"].items()}}
        cells = [f"{ev[s]:.3f} ({secs.get(s, 0):.0f} s)" if s in ev else "" for s in steps]
        a, g = first_reaching(ev, secs, False), first_reaching(ev, secs, True)
        lines.append(
            f"| {init} | "
            + " | ".join(cells)
            + f" | >= {a['goal']:.3f}: {a['step']} / {a['seconds']:.0f} s | >= {g['goal']:.3f}: {g['step']} / "
            f"{g['seconds']:.0f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="bench_unseen's --work (its data and sources)")
    ap.add_argument("--target", default="tiny-mimo")
    ap.add_argument("--inits", default="e3-mtp,e3-rand")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--points", default="30,60,120", help="steps at which the run is cut and a draft written")
    ap.add_argument("--seed", type=int, default=0, help="distill seed (data order); not 0: a second run per init")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--evaluate", default="", help="k values, e.g. 4")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()
    bu = _unseen()
    target = bu.TARGETS / args.target
    w = args.work / target.name
    points = [int(p) for p in args.points.split(",")]
    inits = args.inits.split(",")
    fig_file = args.work / "curves.json"
    sec = section(args.prompts)

    def update(fn) -> dict[str, Any]:
        import fcntl

        with open(args.work / "figures.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fig = json.loads(fig_file.read_text()) if fig_file.is_file() else {"curves": {}}
            fn(fig)
            write_json(fig_file, fig)
            return fig

    if args.train:
        for init in inits:
            rec = train_curve(target, w, init, args.steps, points, args.seed)
            name = key(init, args.seed)
            update(lambda f, name=name, rec=rec: f["curves"].setdefault(name, {}).update(train=rec, steps=args.steps))
    fig = update(lambda f: None)
    for k in [int(x) for x in args.evaluate.split(",") if x]:
        from mtp2draft.evaluation.decode import evaluate
        from mtp2draft.evaluation.settings import EvaluateConfig
        from mtp2draft.target.hidden import TargetModel

        tm = TargetModel(str(target))
        drafts = {
            f"{key(i, args.seed)}@{s}": d
            for i in inits
            for s, d in curve_drafts(w, i, args.steps, points, args.seed).items()
        }
        t = time.perf_counter()
        report = evaluate(
            [(n, str(d)) for n, d in drafts.items()],
            tm,
            args.work / "data" / "prompts.jsonl",
            EvaluateConfig(
                num_draft_tokens=k,
                max_new_tokens=args.new_tokens,
                max_prompts=args.prompts,
                max_prompt_length=args.prompt_len,
            ),
        )
        log(f"evaluate k={k}, {len(drafts)} drafts, in {time.perf_counter() - t:.0f} s")
        for r in report["results"]:
            if not r["lossless"]:
                raise SystemExit(f"{r['name']} was not lossless at k={k}")

        def put(f, k=k, report=report):
            for r in report["results"]:
                init, step = r["name"].split("@")
                c = f["curves"].setdefault(init, {}).setdefault(sec, {}).setdefault(str(k), {})
                c[step] = round(r["mean_acceptance_length"], 3)
                pp = f["curves"][init].setdefault(f"per_position-{sec}", {}).setdefault(str(k), {})
                pp[step] = [round(a, 3) for a in r["acceptance_per_position"]]

        fig = update(put)
    for k in sorted({k for c in fig["curves"].values() for k in c.get(sec, {})}):
        print(f"### k = {k}, {args.prompts} prompts\n\n{table(fig, int(k), sec)}\n")


if __name__ == "__main__":
    main()
