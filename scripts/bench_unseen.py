#!/usr/bin/env python3
"""Draft quality on data the benchmark never used (issue 12): distil and measure on an unseen, named corpus.

The bundled targets were trained on the Python standard library and the installed packages, with whole packages held
out (scripts/train_target.py: `huggingface_hub`, `_pytest`, `pytest`; the first bundled targets, of the round this
driver was written in, trained on the standard library only). This driver uses a source that is on every machine with
mtp2draft installed and that no bundled target trained on: the Python source of the installed `huggingface_hub`
package (its version is recorded). Files: every `*.py` under the package directory, sorted by relative path; a file is a prompt file when
sha256(relative path) % 5 == 0, a training file otherwise (prompts and training data never share a file). Training
records: whole-line text chunks of 1000-2000 characters, up to 6 per training file spread over the file; prompts: up
to 3 chunks of 400-800 characters per prompt file (the chunkers of scripts/train_target.py, so only the source
differs from the benchmark's data).

Rows (each fixed in docs/eagle3-from-mtp.md before it was scored) are named in `ROWS`; each trains once into
`--work` and is reused on a rerun (with the training time recorded then). `--evaluate` measures the finished rows
with `evaluate` at k = 1..5 (lossless checked); `--vllm` serves the native rows in vLLM's CPU build
(mtp2draft.evaluation.backend; `stitched` export, `{"method": "mtp"}`) at the given k. Figures go to stdout as a
markdown table and to `--work/figures.json`.

Usage: `python scripts/bench_unseen.py --work /tmp/unseen --target tiny-mimo --rows raw,native-120 --evaluate`.
What it does not do: tune anything on the prompts, or touch the bundled targets (they are read only).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp2draft.conversion import convert  # noqa: E402
from mtp2draft.evaluation.decode import evaluate  # noqa: E402
from mtp2draft.evaluation.settings import EvaluateConfig  # noqa: E402
from mtp2draft.io import write_json  # noqa: E402
from mtp2draft.target.hidden import TargetModel  # noqa: E402
from mtp2draft.train.recipe import distill  # noqa: E402
from mtp2draft.train.settings import DistillConfig  # noqa: E402

TARGETS = ROOT / "examples" / "targets"
PROMPT_MOD = 5


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _train_target_module():
    spec = importlib.util.spec_from_file_location("train_target", ROOT / "scripts" / "train_target.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_data(out: Path) -> dict[str, Any]:
    """train.jsonl / prompts.jsonl from the installed huggingface_hub's source; returns what was used."""
    import huggingface_hub

    tt = _train_target_module()
    root = Path(huggingface_hub.__file__).parent
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())
    train, prompts = [], []
    n_prompt_files = 0
    for rel in rels:
        text = (root / rel).read_text("utf-8")
        if not text.strip():
            continue
        if int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16) % PROMPT_MOD == 0:
            n_prompt_files += 1
            prompts += tt.spread(tt.text_chunks(text, 400, 800), 3)
        else:
            train += tt.spread(tt.text_chunks(text, 1000, 2000), 6)
    out.mkdir(parents=True, exist_ok=True)
    for name, recs in (("train.jsonl", train), ("prompts.jsonl", prompts)):
        (out / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in recs))
    info = {
        "source": f"huggingface_hub {huggingface_hub.__version__} (installed package source, *.py)",
        "files": len(rels),
        "prompt_files": n_prompt_files,
        "train_records": len(train),
        "prompts": len(prompts),
        "rule": f"prompt file iff sha256(relative path) % {PROMPT_MOD} == 0",
    }
    write_json(out / "data.json", info)
    return info


# Distillation settings shared by every row (fixed before any row was scored): the external measurement's lr and
# TTT depth, with a batch small enough for 2 shared CPU cores (4 x 128 tokens instead of 8 x 256).
BASE = {"ttt_steps": 3, "lr": 1e-3, "batch_size": 4, "max_length": 128, "save_every": 10**9, "seed": 0}
DRAFT_VOCAB = 1024  # EAGLE-3 rows (of the targets' 4096)
# the aux-layer ablation: 0-based "output of layer i" ids, the three deepest an engine captures on an 8-layer target
# (convert's default there is [1, 3, 6])
DEEP_AUX = [4, 5, 6]

# name -> (label, source draft, distill steps or None for "not trained", extra DistillConfig fields)
ROWS: dict[str, tuple[str, str, int | None, dict[str, Any]]] = {
    "raw": ("raw MTP head reused recursively", "mtp", None, {}),
    "native-120": ("native MTP after distill", "mtp", 120, {}),
    "native-40": ("native MTP after distill, a third of the steps", "mtp", 40, {}),
    "e3-mtp-60": ("EAGLE-3 from MTP after distill", "eagle3", 60, {"draft_vocab_size": DRAFT_VOCAB}),
    "e3-rand-240": ("EAGLE-3 from random init, 4x steps", "eagle3-random", 240, {"draft_vocab_size": DRAFT_VOCAB}),
    "e3-mtp-240": ("EAGLE-3 from MTP after distill, random's steps", "eagle3", 240, {"draft_vocab_size": DRAFT_VOCAB}),
    "e3-rand-60": ("EAGLE-3 from random init, same steps", "eagle3-random", 60, {"draft_vocab_size": DRAFT_VOCAB}),
    "e3-oracle-60": (
        "EAGLE-3 from MTP, oracle aux (top aux = final hidden), after distill",
        "eagle3-oracle",
        60,
        {"draft_vocab_size": DRAFT_VOCAB},
    ),
    "e3-mtp-0": ("EAGLE-3 from MTP, calibrated only (0 steps)", "eagle3", 0, {"draft_vocab_size": DRAFT_VOCAB}),
    "e3-oracle-0": (
        "EAGLE-3 from MTP, oracle aux, calibrated only (0 steps)",
        "eagle3-oracle",
        0,
        {"draft_vocab_size": DRAFT_VOCAB},
    ),
    # ablations (docs/eagle3-from-mtp.md, fixed before scoring): one recipe change each against e3-mtp-60 / e3-rand-60
    "e3-mtp-60-flat": (
        "EAGLE-3 from MTP, flat step weights 1/1/1",
        "eagle3",
        60,
        {"draft_vocab_size": DRAFT_VOCAB, "step_weights": [1.0, 1.0, 1.0]},
    ),
    "e3-rand-60-flat": (
        "EAGLE-3 from random init, flat step weights 1/1/1",
        "eagle3-random",
        60,
        {"draft_vocab_size": DRAFT_VOCAB, "step_weights": [1.0, 1.0, 1.0]},
    ),
    "e3-mtp-60-deep": (
        f"EAGLE-3 from MTP, aux layers {DEEP_AUX} (the three deepest capturable)",
        "eagle3-deep",
        60,
        {"draft_vocab_size": DRAFT_VOCAB},
    ),
}


def sources(target: Path, w: Path) -> dict[str, Path]:
    """The undistilled drafts rows start from: convert's native and EAGLE-3 drafts (the latter also with `DEEP_AUX`),
    a random-init EAGLE-3 (as scripts/bench_acceptance.py builds it) and the oracle EAGLE-3 whose top aux layer is the
    target's last layer."""
    out = {"mtp": w / "src-mtp", "eagle3": w / "src-e3", "eagle3-random": w / "src-e3-rand"}
    out["eagle3-oracle"] = w / "src-e3-oracle"
    out["eagle3-deep"] = w / "src-e3-deep"
    for key, to, aux in (("mtp", "mtp", None), ("eagle3", "eagle3", None), ("eagle3-deep", "eagle3", DEEP_AUX)):
        if not (out[key] / "model.safetensors").is_file():
            convert(str(target), out[key], to=to, overwrite=True, aux_layers=aux)
    if not (out["eagle3-random"] / "model.safetensors").is_file():
        shutil.rmtree(out["eagle3-random"], ignore_errors=True)
        spec = importlib.util.spec_from_file_location("bench_acceptance", ROOT / "scripts" / "bench_acceptance.py")
        ba = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ba)
        ba.random_eagle3(out["eagle3"], out["eagle3-random"], seed=1)
    if not (out["eagle3-oracle"] / "model.safetensors").is_file():
        shutil.rmtree(out["eagle3-oracle"], ignore_errors=True)
        shutil.copytree(out["eagle3"], out["eagle3-oracle"])
        cfg = json.loads((out["eagle3-oracle"] / "config.json").read_text())
        layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
        # top-level ids are "input of layer i" (vLLM's); L = the last layer's output, the final hidden before the
        # final norm, which no engine captures as an aux state
        ids = cfg["eagle_aux_hidden_state_layer_ids"]
        cfg["eagle_aux_hidden_state_layer_ids"] = [*ids[:2], layers]
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [*ids[:2], layers]
        write_json(out["eagle3-oracle"] / "config.json", cfg)
    return out


def train_rows(target: Path, w: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    seconds_file = w / "seconds.json"
    seconds = json.loads(seconds_file.read_text()) if seconds_file.is_file() else {}
    src = sources(target, w)
    for name in names:
        label, start, steps, extra = ROWS[name]
        if steps is None or (name in seconds and (w / name / "model.safetensors").is_file()):
            continue
        shutil.rmtree(w / name, ignore_errors=True)
        t = time.perf_counter()
        cfg = DistillConfig(**{**BASE, "steps": steps, **extra})
        distill(
            src[start],
            w / name,
            w.parent / "data" / "train.jsonl",
            str(target),
            config=cfg,
            progress=lambda m, name=name: log(f"{target.name} {name}: {m}"),
        )
        # re-read: rows of the same target may train in parallel processes
        seconds = json.loads(seconds_file.read_text()) if seconds_file.is_file() else {}
        seconds[name] = round(time.perf_counter() - t)
        write_json(seconds_file, seconds)
        log(f"{target.name} {name}: trained in {seconds[name]} s")
    return {n: {"label": ROWS[n][0], "steps": ROWS[n][2] or 0, "seconds": seconds.get(n, 0)} for n in names}


def draft_dir(w: Path, name: str) -> Path:
    return w / "src-mtp" if ROWS[name][2] is None else w / name


def run_evaluate(target: Path, w: Path, names: list[str], ks: list[int], args) -> dict[str, dict[int, Any]]:
    tm = TargetModel(str(target))
    out: dict[str, dict[int, Any]] = {n: {} for n in names}
    for k in ks:
        t = time.perf_counter()
        report = evaluate(
            [(n, str(draft_dir(w, n))) for n in names],
            tm,
            w.parent / "data" / "prompts.jsonl",
            EvaluateConfig(
                num_draft_tokens=k,
                max_new_tokens=args.new_tokens,
                max_prompts=args.prompts,
                max_prompt_length=args.prompt_len,
            ),
        )
        for r in report["results"]:
            if not r["lossless"]:
                raise SystemExit(f"{r['name']} was not lossless at k={k}")
            out[r["name"]][k] = {
                "mal": round(r["mean_acceptance_length"], 3),
                "per_position": [round(a, 3) for a in r["acceptance_per_position"]],
            }
        log(f"{target.name}: evaluate k={k} in {time.perf_counter() - t:.0f} s")
    return out


def run_engine(target: Path, w: Path, names: list[str], ks: list[int], args) -> dict[str, Any]:
    """Native rows served by vLLM (stitched export over a served view of the target), plus plain decoding."""
    from mtp2draft.data import load_tokenizer
    from mtp2draft.evaluation.backend import EngineRun, run_vllm, served_view, speculative_config
    from mtp2draft.evaluation.decode import load_prompts
    from mtp2draft.formats.export import export

    tok = load_tokenizer(target)
    prompts = load_prompts(w.parent / "data" / "prompts.jsonl", tok, args.prompts, args.prompt_len)
    # vLLM's plain greedy decoding, once per target and settings (an engine start costs minutes on loaded cores)
    base_file = w / f"vllm-plain-{args.prompts}x{args.new_tokens}x{args.prompt_len}.json"
    runs = [] if base_file.is_file() else [EngineRun("base", served_view(target, w / "view-base"))]
    for name in names:
        if ROWS[name][1] != "mtp":
            continue
        view = w / f"view-{name}"
        if ROWS[name][2] is None:
            served_view(target, view)
        else:
            shutil.rmtree(w / f"{name}-stitched", ignore_errors=True)
            export(w / name, "stitched", w / f"{name}-stitched", target=str(target))
            served_view(target, view, w / f"{name}-stitched")
        runs += [EngineRun(f"{name}/k{k}", view, speculative_config("mtp", k)) for k in ks]
    t = time.perf_counter()
    version, results = run_vllm(runs, prompts, args.new_tokens, log=log)
    log(f"{target.name}: vLLM {len(runs)} runs in {time.perf_counter() - t:.0f} s")
    if not base_file.is_file():
        write_json(base_file, {"outputs": results["base"].check().outputs})
    base = json.loads(base_file.read_text())["outputs"]
    out: dict[str, Any] = {"vllm_version": version, "rows": {}}
    for r in runs:
        if r.name == "base":
            continue
        res = results[r.name]
        name, k = r.name.split("/k")
        entry = {"error": res.error}
        if res.error is None:
            m = res.metrics
            entry.update(
                mal=round(m["mean_acceptance_length"], 3),
                start_s=res.start_s,
                generate_s=res.generate_s,
                same_as_plain=sum(a == b for a, b in zip(res.outputs, base, strict=True)),
                per_position=[round(x, 3) for x in m["acceptance_per_position"]],
            )
        out["rows"].setdefault(name, {})[int(k)] = entry
    return out


def markdown(fig: dict[str, Any]) -> str:
    lines = []
    for target, tf in fig.items():
        if not isinstance(tf, dict) or "rows" not in tf:
            continue
        ks = sorted({int(k) for r in tf["evaluate"].values() for k in r}) if tf.get("evaluate") else []
        lines += [
            f"### {target}: `evaluate`",
            "",
            "| draft | steps | train time | " + " | ".join(f"k={k}" for k in ks) + " | lossless |",
            "|---|---|---|" + "---|" * len(ks) + "---|",
        ]
        for name, row in tf["rows"].items():
            ev = tf["evaluate"].get(name, {})
            cells = [f"{ev[str(k)]['mal']:.3f}" if str(k) in ev else "" for k in ks]
            lines.append(
                f"| {row['label']} (`{name}`) | {row['steps']} | {row['seconds']} s | " + " | ".join(cells) + " | yes |"
            )
        if tf.get("vllm"):
            vk = sorted({int(k) for r in tf["vllm"]["rows"].values() for k in r})
            lines += [
                "",
                f"### {target}: vLLM {tf['vllm']['vllm_version']} (CPU, fp32) vs `evaluate`",
                "",
                "| draft | " + " | ".join(f"k={k} vLLM / evaluate (gap)" for k in vk) + " | output = plain |",
                "|---|" + "---|" * len(vk) + "---|",
            ]
            for name, byk in tf["vllm"]["rows"].items():
                cells, same = [], []
                for k in vk:
                    e = byk.get(str(k)) or {}
                    ours = tf["evaluate"].get(name, {}).get(str(k), {}).get("mal")
                    if e.get("mal") is None:
                        cells.append(e.get("error") or "")
                        continue
                    gap = f" ({(e['mal'] - ours) / ours:+.1%})" if ours else ""
                    cells.append(f"{e['mal']:.3f} / {ours if ours is not None else '-'}{gap}")
                    same.append(f"{e['same_as_plain']}")
                lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {'/'.join(same)} of {fig['prompts']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--target", default="tiny-mimo")
    ap.add_argument("--name", help="work subdirectory and figures key (default: the target directory's name)")
    ap.add_argument("--figures-key", help="store the figures under this key (e.g. a run with more prompts)")
    ap.add_argument("--rows", default="raw,native-120")
    ap.add_argument("--train", action="store_true", help="train the rows that are not trained yet")
    ap.add_argument("--evaluate", default="", help="k values for evaluate, e.g. 1,2,3,4,5")
    ap.add_argument("--vllm", default="", help="k values for vLLM (native rows), e.g. 3,4")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    data = args.work / "data"
    if not (data / "prompts.jsonl").is_file():
        log(f"data: {build_data(data)}")
    # a bundled target by name, or a directory (e.g. an older bundled target from git history) under --name
    target = Path(args.target) if "/" in args.target else TARGETS / args.target
    key = args.name or target.name
    w = args.work / key
    w.mkdir(parents=True, exist_ok=True)
    names = args.rows.split(",")
    fig_file = args.work / "figures.json"
    settings = {
        "data": json.loads((data / "data.json").read_text()),
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "distill": BASE,
        "draft_vocab": DRAFT_VOCAB,
    }
    if args.train:
        rows = train_rows(target, w, names)
    else:
        sources(target, w)
        seconds = json.loads((w / "seconds.json").read_text()) if (w / "seconds.json").is_file() else {}
        rows = {n: {"label": ROWS[n][0], "steps": ROWS[n][2] or 0, "seconds": seconds.get(n, 0)} for n in names}

    def save(section: str | None, figures: dict[str, Any], version: str | None = None) -> dict[str, Any]:
        """Merge into figures.json under a lock, re-read first: other rows may be running in parallel processes."""
        with open(args.work / "figures.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _merge(section, figures, version)

    def _merge(section: str | None, figures: dict[str, Any], version: str | None) -> dict[str, Any]:
        fig = json.loads(fig_file.read_text()) if fig_file.is_file() else {}
        if not args.figures_key:
            fig.update(settings)
        tf = fig.setdefault(args.figures_key or key, {"rows": {}, "evaluate": {}})
        tf["measured_with"] = {k: settings[k] for k in ("prompts", "new_tokens", "prompt_len")}
        tf["rows"].update(rows)
        if section is not None:
            sec = tf.setdefault(section, {"rows": {}} if section == "vllm" else {})
            into = sec["rows"] if section == "vllm" else sec
            if version:
                sec["vllm_version"] = version
            for n, byk in figures.items():
                into.setdefault(n, {}).update({str(k): v for k, v in byk.items()})
        write_json(fig_file, fig)
        return fig

    fig = save(None, {})
    if args.evaluate:
        fig = save("evaluate", run_evaluate(target, w, names, [int(k) for k in args.evaluate.split(",")], args))
    if args.vllm:
        res = run_engine(target, w, names, [int(k) for k in args.vllm.split(",")], args)
        fig = save("vllm", res["rows"], res["vllm_version"])
    print(markdown(fig))


if __name__ == "__main__":
    main()
