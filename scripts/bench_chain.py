"""Chain drafts on a target with three MTP layers: every layer chained against layer 0 reused, raw and distilled.

    python scripts/bench_chain.py TARGET_DIR DATA_DIR WORK [--prompts 64] [--vllm] [--table-only]
        [--regenerated] [--domain] [--probes] [--wide SITE_PACKAGES [--sharpen [--passes N]]]

TARGET_DIR is a runnable target with several MTP layers (examples/targets/tiny-mimo-3mtp), DATA_DIR holds train.jsonl
and heldout.jsonl (prompts from packages the target never trained on). Into WORK it writes, through the `mtp2draft`
CLI (what a user runs):

- `raw-chain`: `convert --all-layers` (layer i at step i, `step_layers: cycle`), and `raw-first`, the same weights
  with `step_layers: first` (layer 0 reused at every step, what vLLM 0.32 runs);
- `distilled-chain`: `distill raw-chain` (the chain's layers trained jointly with TTT under `cycle`);
- `distilled-first`: `distill raw-chain --serving-engine vllm` (vLLM's computation and rule for the family: `first`,
  so layer 0 is trained for every step);

then evaluates all four on the same held-out prompts, greedy, at k = 3 and 6 (WORK/k*.eval.json), and with `--vllm`
serves the target in vLLM with `raw-chain` and `distilled-first` (vLLM applies its own rule) beside `evaluate` in
bf16 under `--step-layers first` (WORK/k*-vllm.json, WORK/k*-bf16-first.json). It prints mean acceptance length per
draft, the ratio of each distilled draft to the raw draft under the same rule with the difference's 95 % paired
bootstrap interval over prompts (`mtp2draft.evaluation.compare`), and vLLM's figures beside `evaluate`'s. With
`--regenerated` it adds `distilled-chain-regen` (600 steps on the target's own greedy continuations of the training
prompts, `distill --regenerate`) against the raw chain. With `--domain` it distils both ways again on the serving
domain, DATA_DIR/domain.jsonl (the held-out packages' files that no evaluation prompt comes from, written by
scripts/domain_data.py), the same 600 regenerated steps: `domain-chain` (cycle) and `domain-first` (vLLM's rule),
evaluated beside the raw drafts (WORK/k*-domain.eval.json) and, with `--vllm`, `domain-first` in vLLM
(WORK/k*-domain-vllm.json, WORK/k*-domain-bf16-first.json). `--probes` adds `domain-chain-long` (in-domain, 1500
steps, 3 TTT steps) and `oracle-chain` (600 steps on the evaluation's own prompts and the target's continuations of
them: an upper bound, never a result), evaluated beside the raw and the 600-step in-domain chain
(WORK/k*-probes.eval.json). `--wide SITE_PACKAGES` mixes domain.jsonl with Python from the packages of another
environment that no target trained on (scripts/wide_data.py writes WORK/wide.jsonl, some 14,000 records from the vLLM
venv; not committed) and distils both ways on it for one pass (1500 regenerated steps, 3 TTT steps): `wide-chain` and
`wide-first`, evaluated beside the raw drafts (WORK/k*-wide.eval.json) and, with `--vllm`, `wide-first` in vLLM
(WORK/k*-wide-vllm.json, WORK/k*-wide-bf16-first.json). `--sharpen` (with `--wide`) repeats both runs with
`distill --teacher-temperature 0.5`: `wide-chain-t05` and `wide-first-t05` (WORK/k*-sharp.eval.json and, with
`--vllm`, WORK/k*-sharp-vllm.json, WORK/k*-sharp-bf16-first.json). `--passes N` (with `--sharpen`) goes on from the two T = 0.5
drafts (pass 1): pass n = 2..N distils pass n-1's drafts once more, 1500 regenerated steps at
`--teacher-temperature 0.25` and lr 5e-4, on 12,000 records no earlier pass read (WORK/wide{n}.jsonl, see
later_pass_args; where fewer are left, one step per 8 of them: pass 4 has 10,487, so 1310 steps): `pass{n}-chain` and `pass{n}-first`, evaluated beside the raw drafts and pass n-1's
(WORK/k*-pass{n}.eval.json) and, with `--vllm`, `pass{n}-first` in vLLM. Steps whose output is in WORK are not redone;
`--table-only` only prints. Timed here with other work on the 2 cores: 31 minutes with `--vllm`, 54 more with
`--regenerated`; `--domain`'s two distills took 28 and 30 minutes (started by hand side by side, one thread each;
the script runs them one after the other), its evaluations and vLLM runs about 10 more; `--probes` 37 minutes of
distillation (beside the vLLM runs) and 8 (alone), 2 of evaluation; `--wide`'s two distills 50 and 52 minutes (side by
side, one thread each), its evaluations and vLLM runs 25 more beside two other distills; `--passes 3`'s four distills
52-60 minutes (two side by side), each pass's evaluations and vLLM runs 5 more alone, 10 beside two distills; pass 4's
two distills (1310 steps) 47-48 minutes side by side, its evaluations and vLLM runs 6 alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from mtp2draft.evaluation.compare import paired_bootstrap

KS = (3, 6)
DISTILL = ["--steps", "300", "--ttt-steps", "6", "--lr", "1e-3", "--save-every", "300"]
# --regenerated: a longer distill on the target's own greedy continuations of the training prompts
REGENERATED = ["--steps", "600", "--ttt-steps", "6", "--lr", "1e-3", "--save-every", "600", "--regenerate"]
DRAFTS = ("distilled-chain", "raw-chain", "raw-first", "distilled-first")  # evaluate's order: the first is "draft"
DOMAIN = ("domain-chain", "raw-chain", "domain-first", "raw-first")  # --domain: distilled on the serving domain
# --probes: how far k = 3 moves with a longer in-domain run, and an oracle (see oracle_data)
LONG = ["--steps", "1500", "--ttt-steps", "3", "--save-every", "250"]
ORACLE = ["--steps", "600", "--ttt-steps", "3", "--lr", "1e-3", "--save-every", "600"]
PROBES = ("domain-chain-long", "raw-chain", "domain-chain", "oracle-chain")
# --wide: in-domain records mixed with Python from packages no target saw (scripts/wide_data.py), one pass
WIDE = ["--steps", "1500", "--ttt-steps", "3", "--lr", "1e-3", "--save-every", "250", "--regenerate"]
WIDE_DATA = ["--cap", "1500000", "--per-file", "6"]
WIDE_DRAFTS = ("wide-chain", "raw-chain", "wide-first", "raw-first")
# --sharpen (with --wide): the same runs learning the target's distribution at temperature 0.5 (p^2, renormalised)
SHARP = [*WIDE, "--teacher-temperature", "0.5"]
SHARP_DRAFTS = ("wide-chain-t05", "raw-chain", "wide-first-t05", "raw-first")
# --passes N (with --sharpen): pass n = 2..N distils pass n-1's drafts (pass 1: the T = 0.5 ones) once more, on
# 12,000 records no earlier pass read, with a sharper teacher and half the peak lr
PASS = ["--steps", "1500", "--ttt-steps", "3", "--lr", "5e-4", "--save-every", "250", "--regenerate"]
PASS += ["--teacher-temperature", "0.25"]
PASS_STEPS = int(PASS[PASS.index("--steps") + 1])
MAX_PASSES = 5


def pass_steps(records: Path) -> int:
    """A later pass's steps: PASS's 1500, fewer where its set holds under 1500 batches (pass 4's does: the venv's files
    run out of unread chunks), so that no record is read twice."""
    count = sum(1 for line in records.read_text().splitlines() if line.strip())
    return min(PASS_STEPS, count // 8)


def pass_drafts(n: int) -> tuple[str, str]:
    """Pass n's (chain, first) drafts; pass 1 is --sharpen's."""
    return ("wide-chain-t05", "wide-first-t05") if n == 1 else (f"pass{n}-chain", f"pass{n}-first")


def pass_order(n: int) -> tuple[str, ...]:
    """Pass n's evaluation, in evaluate's order: its chain (the "draft"), then the baselines."""
    return (pass_drafts(n)[0], "raw-chain", pass_drafts(n)[1], "raw-first", *pass_drafts(n - 1))


# the wide runs' evaluations: (extra, file tag, drafts in evaluate's order)
WIDE_EVALUATIONS = [
    ("wide", "-wide", WIDE_DRAFTS),
    ("sharpen", "-sharp", SHARP_DRAFTS),
    *[(f"pass{n}", f"-pass{n}", pass_order(n)) for n in range(2, MAX_PASSES + 1)],
]
# the drafts served in vLLM with --vllm (beside the raw chain), by the extra that makes them and the files' tag
SERVED = [
    (None, "", "distilled-first"),
    ("domain", "-domain", "domain-first"),
    ("wide", "-wide", "wide-first"),
    ("sharpen", "-sharp", "wide-first-t05"),
    *[(f"pass{n}", f"-pass{n}", f"pass{n}-first") for n in range(2, MAX_PASSES + 1)],
]


def cli(*args: str, stdout=None) -> None:
    subprocess.run([sys.executable, "-m", "mtp2draft", *args], check=True, stdout=stdout)


def to_file(path: Path, *args: str) -> None:
    if path.is_file():
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as fh:
        cli(*args, stdout=fh)
    tmp.rename(path)


def oracle_data(target: Path, data: Path, work: Path, prompts: int) -> Path:
    """WORK/oracle.jsonl: the evaluation's own prompts, each with the target's greedy continuation (what `evaluate`
    decodes), as text records. A draft distilled on it has seen the evaluated text: an upper bound on what the draft's
    layers can represent there, never a result."""
    path = work / "oracle.jsonl"
    if path.is_file():
        return path
    from mtp2draft.data import load_tokenizer
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.evaluation.decode import TargetRunner, greedy_reference, load_prompts
    from mtp2draft.target.hidden import TargetModel

    tm = TargetModel(str(target), dtype="float32", device="cpu")
    tok = load_tokenizer(tm.path)
    draft = load_draft(work / "raw-chain", dtype=tm.dtype).eval()
    draft.attach_target(tm.embedding(), tm.lm_head())
    runner = TargetRunner(tm, draft)
    rows = []
    for ids in load_prompts(data / "heldout.jsonl", tok, prompts, 256):  # evaluate's prompts (--max-prompt-length)
        ref = greedy_reference(runner, ids, 64, tok.eos_token_id)
        rows.append(json.dumps({"text": tok.decode(ids + ref, skip_special_tokens=True)}) + "\n")
    path.with_suffix(".tmp").write_text("".join(rows))
    path.with_suffix(".tmp").rename(path)
    return path


def wide_data(site: Path, data: Path, work: Path) -> Path:
    """WORK/wide.jsonl: DATA_DIR/domain.jsonl's records mixed with Python from the packages of `site` that no target
    trained on (scripts/wide_data.py; not committed, its sha256 printed)."""
    path = work / "wide.jsonl"
    if not path.is_file():
        script = Path(__file__).resolve().parent / "wide_data.py"
        args = [str(site), "--out", str(path), "--with", str(data / "domain.jsonl"), *WIDE_DATA]
        subprocess.run([sys.executable, str(script), *args], check=True)
    return path


def later_pass_data(site: Path, work: Path, n: int) -> Path:
    """WORK/wide{n}.jsonl, pass n's records (written by scripts/wide_data.py with `later_pass_args`)."""
    path = work / f"wide{n}.jsonl"
    if not path.is_file():
        script = Path(__file__).resolve().parent / "wide_data.py"
        subprocess.run([sys.executable, str(script), *later_pass_args(site, work, n)], check=True)
    return path


def later_pass_args(site: Path, work: Path, n: int) -> list[str]:
    """wide_data.py's arguments for pass n's set: none of the records an earlier pass read. Pass n-1's set is mixed
    in, less its first `pass_steps` x 8 records (what its runs read), and every set before it is excluded whole; the
    per-package cap is large enough to take every file, and each file gives 6 (n - 1) chunks. A file's chunks are
    consecutive pieces of it, so the added chunks are text of it no earlier set held."""
    sets = [work / "wide.jsonl", *[work / f"wide{j}.jsonl" for j in range(2, n)]]
    args = [str(site), "--out", str(work / f"wide{n}.jsonl"), "--with", str(sets[-1]), "--cap", "30000000"]
    args += ["--per-file", str(6 * (n - 1)), "--exclude", f"{sets[-1]}:{pass_steps(sets[-1]) * 8}"]
    return args + [a for s in sets[:-1] for a in ("--exclude", str(s))]


def prepare(target: Path, data: Path, work: Path, prompts: int, extras: set[str], site: Path | None) -> None:
    raw = work / "raw-chain"
    if not (raw / "config.json").is_file():
        cli("convert", str(target), "--all-layers", "--out", str(raw), "--dtype", "float32")
    first = work / "raw-first"
    if not (first / "config.json").is_file():
        tmp = work / ".raw-first"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(raw, tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**cfg, "step_layers": "first"}, indent=2) + "\n")
        tmp.rename(first)
    train = ["--data", str(data / "train.jsonl"), "--device", "cpu", *DISTILL]
    runs = [("distilled-chain", train), ("distilled-first", [*train, "--serving-engine", "vllm"])]
    if "regenerated" in extras:
        runs.append(("distilled-chain-regen", ["--data", str(data / "train.jsonl"), "--device", "cpu", *REGENERATED]))
    in_domain = ["--data", str(data / "domain.jsonl"), "--device", "cpu", *REGENERATED]
    if "domain" in extras:
        runs += [("domain-chain", in_domain), ("domain-first", [*in_domain, "--serving-engine", "vllm"])]
    if "probes" in extras:
        runs.append(("domain-chain-long", [*in_domain, *LONG]))  # later options win: 1500 steps, 3 TTT steps
        oracle = ["--data", str(oracle_data(target, data, work, prompts)), "--device", "cpu", *ORACLE]
        runs.append(("oracle-chain", oracle))
    if site is not None:
        on_wide = ["--data", str(wide_data(site, data, work)), "--device", "cpu"]
        wide = [*on_wide, *WIDE]
        runs += [("wide-chain", wide), ("wide-first", [*wide, "--serving-engine", "vllm"])]
        if "sharpen" in extras:
            sharp = [*on_wide, *SHARP]
            runs += [("wide-chain-t05", sharp), ("wide-first-t05", [*sharp, "--serving-engine", "vllm"])]
    for name, options in runs:
        out = work / name
        if not (out / "config.json").is_file():
            cli("distill", str(raw), "--target", str(target), *options, "--out", str(out))
    for n in [n for n in range(2, MAX_PASSES + 1) if f"pass{n}" in extras]:  # from pass n-1's drafts, not the raw
        records = later_pass_data(site, work, n)
        again = ["--data", str(records), "--device", "cpu", *PASS, "--steps", str(pass_steps(records))]
        engines = ([], ["--serving-engine", "vllm"])  # the chain under cycle, layer 0 for vLLM's rule
        for name, start, serving in zip(pass_drafts(n), pass_drafts(n - 1), engines, strict=True):
            if not (work / name / "config.json").is_file():
                cli("distill", str(work / start), "--target", str(target), *again, *serving, "--out", str(work / name))


def measure(
    target: Path, data: Path, work: Path, prompts: int, vllm: bool, extras: set[str], site: Path | None
) -> None:
    prepare(target, data, work, prompts, extras, site)
    common = ["--target", str(target), "--data", str(data / "heldout.jsonl"), "--max-new-tokens", "64"]
    common += ["--max-prompts", str(prompts), "--json"]
    for k in KS:
        drafts = [str(work / DRAFTS[0])] + [a for d in DRAFTS[1:] for a in ("--baseline", str(work / d))]
        to_file(work / f"k{k}.eval.json", "evaluate", *drafts, *common, "-k", str(k), "--device", "cpu")
        if "regenerated" in extras:
            pair = [str(work / "distilled-chain-regen"), "--baseline", str(work / "raw-chain")]
            to_file(work / f"k{k}-regen.eval.json", "evaluate", *pair, *common, "-k", str(k), "--device", "cpu")
        if "domain" in extras:
            four = [str(work / d) for d in DOMAIN[:1]] + [a for d in DOMAIN[1:] for a in ("--baseline", str(work / d))]
            to_file(work / f"k{k}-domain.eval.json", "evaluate", *four, *common, "-k", str(k), "--device", "cpu")
        if "probes" in extras:
            four = [str(work / d) for d in PROBES[:1]] + [a for d in PROBES[1:] for a in ("--baseline", str(work / d))]
            to_file(work / f"k{k}-probes.eval.json", "evaluate", *four, *common, "-k", str(k), "--device", "cpu")
        for extra, tag, names in WIDE_EVALUATIONS:
            if extra in extras:
                four = [str(work / names[0])] + [a for d in names[1:] for a in ("--baseline", str(work / d))]
                to_file(work / f"k{k}{tag}.eval.json", "evaluate", *four, *common, "-k", str(k), "--device", "cpu")
        for _, tag, first in [s for s in SERVED if s[0] is None or s[0] in extras] if vllm else []:
            pair = [str(work / first), "--baseline", str(work / "raw-chain")]
            to_file(work / f"k{k}{tag}-vllm.json", "evaluate", *pair, *common, "-k", str(k), "--engine", "vllm")
            to_file(
                work / f"k{k}{tag}-bf16-first.json",
                "evaluate", *pair, *common, "-k", str(k), "--device", "cpu", "--dtype", "bfloat16",
                "--step-layers", "first",
            )  # fmt: skip


def _ratio(draft: dict, base: dict) -> str:
    d = paired_bootstrap(draft, base)["difference"]["mean_acceptance_length"]
    r = draft["mean_acceptance_length"] / base["mean_acceptance_length"]
    return f"{r:.3f}x ({d['value']:+.3f}, {d['low']:+.3f} .. {d['high']:+.3f})"


def _read(path: Path, names: tuple[str, ...]) -> tuple[dict[str, dict], dict[str, str]]:
    """An evaluation's results by draft name (checked lossless) and their mean acceptance lengths, formatted."""
    rows = dict(zip(names, json.loads(path.read_text())["results"], strict=True))
    assert all(r["lossless"] for r in rows.values()), f"{path.name}: a draft's output differs from the target's"
    return rows, {n: f"{r['mean_acceptance_length']:.3f}" for n, r in rows.items()}


# The acceptance tables: (the extra that makes them or None, evaluation file suffix, draft names in the file's
# order, header, columns). A column is a draft's mean acceptance length, or (draft, baseline): their ratio.
TABLES = [
    (None, "", DRAFTS,
     "| k | layer 0 reused (raw) | raw chain | distilled chain | distilled for vLLM (first) | distilled chain / raw "
     "chain (difference, 95 % CI) | distilled first / layer 0 reused |",
     ["raw-first", "raw-chain", "distilled-chain", "distilled-first", ("distilled-chain", "raw-chain"),
      ("distilled-first", "raw-first")]),
    ("regenerated", "-regen", ("distilled-chain-regen", "raw-chain"),
     "| k | raw chain | distilled chain, regenerated data, 600 steps | ratio (difference, 95 % CI) |",
     ["raw-chain", "distilled-chain-regen", ("distilled-chain-regen", "raw-chain")]),
    ("domain", "-domain", DOMAIN,
     "| k | raw chain | distilled chain, in-domain | ratio (difference, 95 % CI) | layer 0 reused (raw) | "
     "distilled for vLLM (first), in-domain | ratio |",
     ["raw-chain", "domain-chain", ("domain-chain", "raw-chain"), "raw-first", "domain-first",
      ("domain-first", "raw-first")]),
    ("probes", "-probes", PROBES,
     "| k | raw chain | in-domain, 600 steps | in-domain, 1500 steps, 3 TTT steps | ratio | oracle (trained on these "
     "continuations) | ratio |",
     ["raw-chain", "domain-chain", "domain-chain-long", ("domain-chain-long", "raw-chain"), "oracle-chain",
      ("oracle-chain", "raw-chain")]),
    ("wide", "-wide", WIDE_DRAFTS,
     "| k | raw chain | distilled chain, wide data, 1500 steps | ratio (difference, 95 % CI) | layer 0 reused (raw) | "
     "distilled for vLLM (first), wide data | ratio |",
     ["raw-chain", "wide-chain", ("wide-chain", "raw-chain"), "raw-first", "wide-first", ("wide-first", "raw-first")]),
    ("sharpen", "-sharp", SHARP_DRAFTS,
     "| k | raw chain | distilled chain, wide data, teacher at T = 0.5 | ratio (difference, 95 % CI) | layer 0 reused "
     "(raw) | distilled for vLLM (first), wide data, T = 0.5 | ratio |",
     ["raw-chain", "wide-chain-t05", ("wide-chain-t05", "raw-chain"), "raw-first", "wide-first-t05",
      ("wide-first-t05", "raw-first")]),
    *[(f"pass{n}", f"-pass{n}", pass_order(n),
       f"| k | raw chain | pass {n}, chain | ratio (difference, 95 % CI) | over pass {n - 1} | layer 0 reused (raw) "
       f"| pass {n}, for vLLM (first) | ratio | over pass {n - 1} |",
       ["raw-chain", pass_order(n)[0], (pass_order(n)[0], "raw-chain"), (pass_order(n)[0], pass_order(n)[4]),
        "raw-first", pass_order(n)[2], (pass_order(n)[2], "raw-first"), (pass_order(n)[2], pass_order(n)[5])])
      for n in range(2, MAX_PASSES + 1)],
]  # fmt: skip


def table(work: Path, vllm: bool, extras: set[str]) -> str:
    lines: list[str] = []
    for extra, suffix, names, header, columns in TABLES:
        if extra is not None and extra not in extras:
            continue
        lines += [*([""] if lines else []), header, "|---" * (len(columns) + 1) + "|"]
        for k in KS:
            rows, m = _read(work / f"k{k}{suffix}.eval.json", names)
            cells = [m[c] if isinstance(c, str) else _ratio(rows[c[0]], rows[c[1]]) for c in columns]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    if vllm:
        lines += [
            "",
            "| k | draft | vLLM (its rule: first) | evaluate bf16, --step-layers first | gap | vLLM lossless |",
            "|---|---|---|---|---|---|",
        ]
        for _, tag, first in [s for s in SERVED if s[0] is None or s[0] in extras]:
            for k in KS:
                theirs = json.loads((work / f"k{k}{tag}-vllm.json").read_text())["results"]
                ours = json.loads((work / f"k{k}{tag}-bf16-first.json").read_text())["results"]
                for name, a, b in zip((first, "raw-chain"), theirs, ours, strict=True):
                    x, y = a["mean_acceptance_length"], b["mean_acceptance_length"]
                    lines.append(f"| {k} | {name} | {x:.3f} | {y:.3f} | {abs(x - y) / y:.1%} | {a['lossless']} |")
                ratio = theirs[0]["mean_acceptance_length"] / theirs[1]["mean_acceptance_length"]
                lines.append(f"| {k} | {first} / raw in vLLM | {ratio:.3f}x | | | |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--vllm", action="store_true", help="also measure in vLLM (its venv: scripts/vllm_env.sh)")
    ap.add_argument("--regenerated", action="store_true", help="also a longer distill on regenerated data")
    ap.add_argument(
        "--domain", action="store_true", help="also distil on DATA_DIR/domain.jsonl (scripts/domain_data.py)"
    )
    ap.add_argument(
        "--probes", action="store_true", help="also a 1500-step in-domain run and an oracle (needs --domain's data)"
    )
    ap.add_argument(
        "--wide",
        type=Path,
        metavar="SITE_PACKAGES",
        help="also distil on domain.jsonl mixed with the packages of SITE_PACKAGES no target saw (the vLLM venv's)",
    )
    ap.add_argument(
        "--sharpen", action="store_true", help="with --wide: the same runs with --teacher-temperature 0.5 as well"
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=1,
        metavar="N",
        help=f"with --sharpen: N - 1 more passes from its drafts on unread records, at T = 0.25 (N <= {MAX_PASSES})",
    )
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    extras = {name for name in ("regenerated", "domain", "probes", "wide", "sharpen") if getattr(args, name)}
    if "sharpen" in extras and args.wide is None:
        ap.error("--sharpen needs --wide (it distils on the wide data)")
    if not 1 <= args.passes <= MAX_PASSES or (args.passes > 1 and "sharpen" not in extras):
        ap.error(f"--passes takes 1 to {MAX_PASSES}, and more than 1 needs --sharpen (pass 1 is its drafts)")
    extras |= {f"pass{n}" for n in range(2, args.passes + 1)}
    if not args.table_only:
        measure(args.target, args.data, args.work, args.prompts, args.vllm, extras, args.wide)
    print(table(args.work, args.vllm, extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())
