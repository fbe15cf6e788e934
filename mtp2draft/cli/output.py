"""What the command line prints: the JSON and the human-readable text of each command's result.

Every function takes a stage's result (a dataclass or the dict it returns) and gives back a string or a JSON-ready
dict; the command modules decide where it goes (data on stdout). Imports neither typer nor torch, so `mtp2draft --help` stays
fast and the texts can be tested without running a stage.

What this module does not do: parse options, call the stages, print, or format errors (`cli/app.py`'s `main` has the one error
formatter).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtp2draft.evaluation.verdict import lossless_words, parted_at_ties
from mtp2draft.kinds import DraftKind
from mtp2draft.progress import human_bytes


def to_json(data: Any) -> str:
    """The JSON every `--json` prints: indented, paths and other objects as their str()."""
    return json.dumps(data, indent=2, default=str)


# ---- specs / inspect ---------------------------------------------------------------------------------------------
def specs_text(rows: list[dict[str, Any]]) -> str:
    """The spec registry as a table, whether each key list is verified and from what source, then family x engine x
    method (MTP hand-over in brackets) from the specs' [engines.*] tables, the engines' known bugs, the DSpark drafter
    layouts (rows with `draft_kind` dspark), then the families not supported (rows with `supported` false) with their
    reasons."""
    refused = [r for r in rows if r.get("supported") is False]
    dspark = [r for r in rows if r.get("draft_kind") == "dspark" and r.get("supported") is not False]
    rows = [r for r in rows if r.get("supported") is not False and r not in dspark]
    width = max(len(r["name"]) for r in rows)
    lines = []
    for r in rows:
        flag = "" if r["verified"] else "  (layout unverified)"
        lines.append(f"{r['name']:<{width}}  {', '.join(r['architectures'] or r['model_types'])}  [{r['block']}]{flag}")
    lines.append(f"\n{'key list':<{width}}  verified against a release (or a loader test reading one), and the source")
    for r in rows:
        said = "verified" if r["verified"] else "unverified"
        lines.append(f"{r['name']:<{width}}  {said}: {r.get('key_source') or 'source not recorded (see the notes)'}")
    engines = sorted({e for r in rows for e in r["engines"]})
    heads = "  ".join(f"{e + ' ' + _engine_version(rows, e):<28}" for e in engines)
    lines.append(f"\n{'engine support':<{width}}  " + heads)
    differs = False
    for r in rows:
        cells = []
        for e in engines:
            facts = r["engines"].get(e) or {}
            methods = facts.get("methods") or []
            # *: the engine's MTP module reads another target hidden than the checkpoint's layer was trained on
            # (what `run` and the card note for that engine: formats.native.engine_mismatches)
            star = " *" if DraftKind.MTP in methods and facts.get("hidden") not in (None, r.get("hidden")) else ""
            differs = differs or bool(star)
            text = ", ".join(
                f"mtp [{facts.get('handover')}]{star}" if m == DraftKind.MTP else m for m in DraftKind if m in methods
            )
            cells.append(f"{text or '-':<28}")
        lines.append(f"{r['name']:<{width}}  " + "  ".join(cells))
    lines.append("[...]: the hidden each MTP step hands to the next")
    if differs:
        lines.append(
            "*: this engine's MTP layer reads another target hidden than the checkpoint's was trained on: it loses "
            "acceptance there unless distilled with --serving-engine ENGINE (run and the card say so)"
        )
    bugs = [(r["name"], e, f) for r in rows for e, f in sorted(r["engines"].items()) if f.get("known_bug")]
    if bugs:
        lines.append("\nknown engine bugs")
        lines += [f"{name:<{width}}  {e} {f['version']}: {f['known_bug']}" for name, e, f in bugs]
    if dspark:
        lines.append("\nDSpark drafters: layout, family, what mtp2draft does with it, quantisation")
        dwidth = max(len(r["name"]) for r in dspark)
        for r in dspark:
            lines.append(
                f"{r['name']:<{dwidth}}  {', '.join(r['architectures'] or r['model_types'])} [{r['layout']}]: "
                f"{r['commands']}; {r['quantization']}"
            )
    if refused:
        lines.append("\nnot supported")
        for r in refused:
            lines.append(f"{r['name']:<{width}}  {', '.join(r['architectures'] or r['model_types'])}: {r['reason']}")
    return "\n".join(lines)


def _engine_version(rows: list[dict], engine: str) -> str:
    versions = sorted({r["engines"][engine]["version"] for r in rows if engine in r["engines"]})
    return "/".join(versions)


def dspark_text(info: dict[str, Any]) -> str:
    """A checkpoint's DSpark drafter: its settings, stages and head tensors, and what is supported so far."""
    d = info["dspark"]
    lines = [
        f"source        {info['source']}" + (f"  (commit {info['commit'][:12]})" if info["commit"] else ""),
        f"drafter       DSpark block drafter ({info['model_type']}; {d['found_in']})",
        f"layout        {info['layout']} (model_specs/dspark/{info['layout']}.toml)",
        f"stages        {info['num_stages']} (config.json num_nextn_predict_layers = {info['num_nextn_predict_layers']})",
        f"block size    {d['block_size']}",
        f"target layers {d['target_layer_ids']}",
        f"noise token   {d['noise_token_id']}",
        f"Markov rank   {d['markov_rank']}",
    ]
    if d["experts_per_stage"] is not None:
        per_token = f", {d['num_experts_per_tok']} per token" if d["num_experts_per_tok"] else ""
        lines.append(f"experts       {d['experts_per_stage']} routed per stage{per_token}")
    for row in info["stages"]:
        lines.append(
            f"stage {row['stage']}: {row['tensors']} tensors, {row['parameters']:,} parameters, "
            f"{human_bytes(row['bytes'])}" + (f", {row['fp8_weights']} FP8 weights" if row["fp8_weights"] else "")
        )
    lines.append("")
    for t in info["head_tensors"]:
        lines.append(f"  {t['name']:<64} {str(t['shape']):<18} {t['dtype']}")
    total = info["checkpoint_bytes"]
    share = f" ({100 * info['drafter_bytes'] / total:.2f} % of the checkpoint)" if total else ""
    lines.append(f"\ndrafter bytes {human_bytes(info['drafter_bytes'])} of {human_bytes(total)}{share}")
    lines.append(info["supported"])
    return "\n".join(lines)


def inspect_text(info: dict[str, Any]) -> str:
    """A checkpoint's family, MTP layers with their tensors, and what `convert` would fetch."""
    if info.get("draft_kind") == "dspark":
        return dspark_text(info)
    lines = [
        f"source        {info['source']}" + (f"  (commit {info['commit'][:12]})" if info["commit"] else ""),
        f"family        {info['spec']}: {info['family']}",
        f"block         {info['block']}",
        f"MTP layers    {info['num_mtp_layers']}",
    ]
    for layer in info["layers"]:
        lines.append(
            f"\nlayer {layer['layer']}: {layer['parameters']:,} parameters, {human_bytes(layer['bytes'])}"
            + (f", {layer['fp8_weights']} FP8 weights" if layer["fp8_weights"] else "")
        )
        for t in layer["tensors"]:
            lines.append(f"  {t['name']:<64} {str(t['shape']):<18} {t['dtype']:<8} {human_bytes(t['bytes'])}")
    total = info["checkpoint_bytes"]
    share = f" ({100 * info['convert_bytes'] / total:.2f} % of the checkpoint)" if total else ""
    for file, n in info.get("unindexed_files", {}).items():
        lines.append(f"\n{n} tensors found in {file}, which the index does not list (found by listing the files)")
    lines.append(f"\nconvert fetches {human_bytes(info['convert_bytes'])} of {human_bytes(total)}{share}")
    if info["num_mtp_layers"] > 1:
        lines.append(
            f"{info['num_mtp_layers']} MTP layers: convert takes one (--layer i, default 0); --all-layers takes them all "
            "as one chain draft (layer i at draft step i)"
        )
    if "release" in info:
        lines += ["", *release_lines(info["release"])]
    return "\n".join(lines)


def release_lines(release: dict[str, Any]) -> list[str]:
    """`inspect`'s release check: each stored MTP layer's place and storage per tensor group, then the verdict."""
    lines = [f"as served     {release['quantisation']}; {release['count_field']} = {release['count']}"]
    if release["exclusion"]:
        ex = release["exclusion"]
        lines.append(f"excluded      {ex['method']} {ex['field']}: {', '.join(ex['patterns']) or '(empty)'}")
    for layer in release["layers"]:
        groups = "; ".join(
            f"{g} {'/'.join(f'{n} {label}' for label, n in c.items())}" for g, c in layer["groups"].items()
        )
        lines.append(f"MTP layer {layer['layer']}   {layer['prefix']}.* in {layer['place']}: {groups}")
    lines.append(f"verdict       {release['verdict']}")
    return lines


# ---- stage results -----------------------------------------------------------------------------------------------
def convert_summary(result: Any) -> dict[str, Any]:
    """`convert --json`: where the draft went and what the conversion fetched."""
    return {
        "out": str(result.out),
        "draft_kind": result.kind,
        "spec": result.spec,
        "mtp_layer": result.layer,
        "mtp_layers": result.provenance.get("mtp_layers", [result.layer]),
        "num_mtp_layers": result.num_mtp_layers,  # the checkpoint's: how many --layer could pick from
        "bytes_fetched": result.bytes_fetched,
        "checkpoint_bytes": result.checkpoint_bytes,
        "seconds": round(result.seconds, 2),
    }


def convert_text(result: Any) -> str:
    if result.kind == "dspark":
        return (
            f"wrote dspark draft to {result.out} ({result.spec}, {result.num_mtp_layers} DSpark stages)\n"
            f"fetched {human_bytes(result.bytes_fetched)} of a {human_bytes(result.checkpoint_bytes)} checkpoint "
            f"in {result.seconds:.1f} s; dequantised: {', '.join(result.provenance['dequantised']) or 'nothing'}"
        )
    tensors = result.provenance.get("tensors", {})
    exact = sum(1 for t in tensors.values() if t["exact"])
    chain = result.provenance.get("mtp_layers")
    which = f"chain of MTP layers {', '.join(map(str, chain))}" if chain else f"MTP layer {result.layer}"
    return (
        f"wrote {result.kind} draft to {result.out} ({result.spec}, {which})\n"
        f"fetched {human_bytes(result.bytes_fetched)} of a {human_bytes(result.checkpoint_bytes)} checkpoint "
        f"in {result.seconds:.1f} s; {exact}/{len(tensors)} tensors transferred exactly (see provenance.json)"
    )


def distill_summary(result: Any) -> dict[str, Any]:
    """`distill --json`: the steps run and the draft's top-1 agreement with the target per TTT step."""
    return {
        "out": str(result.out),
        "steps": result.steps,
        "seconds": round(result.seconds, 1),
        "accuracy_per_step": [round(a, 4) for a in result.per_step_accuracy],
        "resumed_from": result.resumed_from,
        "heldout": result.heldout,
    }


def distill_text(result: Any) -> str:
    acc = " ".join(f"{a:.3f}" for a in result.per_step_accuracy)
    text = (
        f"wrote distilled draft to {result.out} ({result.steps} steps, {result.seconds:.0f} s); "
        f"top-1 agreement per step: {acc}"
    )
    guard = getattr(result, "heldout", None)
    if guard and guard.get("best_step") is not None:
        best = next(h for h in guard["history"] if h["step"] == guard["best_step"])
        first = guard["history"][0]
        text += (
            f"\nheld-out ({guard['examples']} examples): weights of step {guard['best_step']} written, implied "
            f"acceptance length {best['score']:.3f} (step {first['step']}: {first['score']:.3f})"
        )
    return text


def acceptance_table(results: list[dict[str, Any]]) -> str:
    """One row a draft: mean acceptance length, acceptance per draft position as conditional / per draft (blank past a
    draft's own k), lossless (at a temperature: the distribution check's KS p-value; greedy, the prompts that parted
    from the target only at a logit tie); legend lines under it."""
    k = max(r["num_draft_tokens"] for r in results)
    head = ["draft", "accept len"] + [f"pos {j}" for j in range(1, k + 1)] + ["lossless"]
    rows = [
        [r["name"], f"{r['mean_acceptance_length']:.3f}"]
        + [_position(r, j) for j in range(r["num_draft_tokens"])]
        + [""] * (k - r["num_draft_tokens"])
        + [_lossless(r)]
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in [head, *rows]]
    if any(r.get("per_draft_acceptance") for r in results):
        lines.append("pos j: P(j accepted | 1..j-1 accepted) / P(j accepted) per draft")
    if any(parted_at_ties(r) for r in results):
        lines.append("tie(s): prompts whose output parted from the target's where its top two logits tie in this dtype")
    return "\n".join(lines)


def _position(result: dict[str, Any], j: int) -> str:
    per_draft = result.get("per_draft_acceptance")  # absent from reports written before it existed
    text = f"{result['acceptance_per_position'][j]:.3f}"
    return f"{text} / {per_draft[j]:.3f}" if per_draft else text


def _lossless(result: dict[str, Any]) -> str:
    check = result.get("distribution_check")
    if result["lossless"] is None and check:
        return f"KS p = {check['pit_ks_p_value']:.3f}"
    words = lossless_words(result) or "?"
    return "NO" if words == "no" else words


PROPOSING = {"greedy": "argmax", "sample": "sampling"}  # --draft-sampling, in words


def evaluate_text(report: dict[str, Any]) -> str:
    temperature = report.get("temperature") or 0
    how = (
        "greedy"
        if not temperature
        else f"temperature {temperature:g}, top-p {report['top_p']:g}, seed {report['seed']}"
    )
    how += f", draft proposes by {PROPOSING[report['draft_sampling']]}" if temperature else ""
    return (
        f"target {report['target']}, {report['num_prompts']} prompts, k = {report['num_draft_tokens']}, "
        f"{report['max_new_tokens']} new tokens each, {how}\n"
        + acceptance_table(report["results"])
        + "".join("\n" + comparison_text(c) for c in report.get("comparison", []))
        + _chains(report)
        + _dspark(report)
        + _engine_clock(report)
    )


def _dspark(report: dict[str, Any]) -> str:
    """DSpark drafts: target forwards against plain greedy decoding, and the same prompts with the confidence stop."""
    stop = report.get("confidence_stop")
    if not stop:
        return ""

    def forwards(rows: list[dict[str, Any]]) -> list[str]:
        return [
            f"  {r['name']}: {r['forwards']['speculative']} target forwards, plain greedy "
            f"{r['forwards']['plain_greedy']}; {r['tokens_drafted']} draft tokens verified"
            for r in rows
        ]

    lines = [
        f"\nDSpark: blocks of {report['block_size']} draft tokens, one drafter pass each; pos j: slot j accepted / "
        "blocks that reached it, and per block (prefill forwards included below)",
        *forwards(report["results"]),
        f"with the confidence stop (each block cut before its first slot whose sigmoid(confidence) < "
        f"{stop['threshold']:g}):",
        acceptance_table(stop["results"]),
        *forwards(stop["results"]),
        *(comparison_text(c) for c in stop.get("comparison", [])),
    ]
    return "\n".join(lines)


def _chains(report: dict[str, Any]) -> str:
    """Chain drafts: how many layers and the step rule each ran under (`step_layers`)."""
    lines = [
        f"\n{r['name']}: chain of {c['num_layers']} MTP layers, run under step_layers {c['step_layers'] or 'unknown'}"
        + (f" (trained for {c['trained_for']})" if c.get("trained_for") not in (None, c["step_layers"]) else "")
        for r in report["results"]
        if (c := r.get("chain"))
    ]
    return "".join(lines)


def comparison_text(comparison: dict[str, Any]) -> str:
    """One line: the draft minus a baseline, accept length and position-1 per-draft acceptance, with the interval."""

    def diff(name: str, digits: int) -> str:
        d = comparison["difference"][name]
        return f"{d['value']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]"

    return (
        f"{comparison['draft']} - {comparison['baseline']}: accept len {diff('mean_acceptance_length', 3)}, "
        f"pos 1 per draft {diff('per_draft_acceptance_1', 3)} "
        f"({100 * comparison['level']:.0f} % paired bootstrap over {comparison['prompts']} prompts)"
    )


def _engine_clock(report: dict[str, Any]) -> str:
    """`evaluate --engine vllm`: the engine and its clock, plain target and each draft (one pass, all prompts in
    flight), with what each figure measures and why it says nothing of serving speed here; nothing for the
    transformers path. Where there are baselines: why there is no paired interval (vLLM counts totals)."""
    engine = report.get("engine") or {}
    if engine.get("name") != "vllm":
        return ""

    def clock(c: dict[str, Any]) -> str:
        rate, tpot = c.get("output_tokens_per_s"), c.get("tpot_ms")
        return f"{rate:.0f} tok/s, {tpot:.2f} ms/token" if rate and tpot else "?"

    rows = [f"  {r['name']}: {clock(r.get('clock') or {})}" for r in report["results"]]
    head = (
        f"\nvLLM {engine.get('version')} (tensor parallel {engine.get('tensor_parallel_size')}), engine clock, one "
        f"pass with all {report.get('num_prompts', '?')} prompts in flight: tok/s = every request's output tokens "
        "over the pass's span (throughput); ms/token = each request's time between its first and last token per "
        "token, averaged (latency; the requests share the engine, so the two do not reconcile):"
    )
    caveat = (
        "  caveat: this clock times the engine on this machine and this target; a tiny target on a shared CPU "
        "measures the engine's overheads, nothing about serving a real model on a GPU. The acceptance above is what "
        "carries over (`mtp2draft speedup` predicts the speed from it)."
    )
    interval = (
        ["no paired interval: vLLM's counters are totals over all prompts, not per prompt; evaluate without --engine "
         "for the draft-minus-baseline interval"]
        if len(report["results"]) > 1 and not report.get("comparison")
        else []
    )  # fmt: skip
    return "\n".join([*interval, head, f"  no draft: {clock(engine.get('plain') or {})}", *rows, caveat])


def export_summary(result: Any) -> dict[str, Any]:
    return {"out": str(result.out), "format": result.format, "files": result.files, "seconds": result.seconds}


def export_text(result: Any, draft: Path) -> str:
    return f"wrote {result.format} export of {draft} to {result.out} ({', '.join(result.files)})"


def validate_text(path: Path, fmt: str, violations: list[str]) -> str:
    if not violations:
        return f"{path}: valid {fmt} draft"
    return "\n".join([f"{path}: {len(violations)} violation(s) of the {fmt} format"] + [f"  - {v}" for v in violations])


def run_text(result: Any) -> str:
    """`run`: the acceptance table, where the export is, and the push's URL when there was one."""
    report = result.report
    lines = [acceptance_table(report["results"]), *map(comparison_text, report.get("comparison", []))]
    lines.append(f"export: {result.exported}")
    serving = getattr(result, "serving", None)
    if serving:  # the same lines as the export's README and its card (serving.launch_lines)
        lines += ["", "serve it (from this directory):", "", *serving]
    if result.push is not None:
        lines.append(f"pushed: {result.push.url} (commit {result.push.commit})")
    return "\n".join(lines)


def _target_line(figures: dict[str, Any] | None) -> list[str]:
    """The bundled target's own quality, from its training.json: what the acceptance below is measured against."""
    if not figures:
        return []
    return [
        f"the target (training.json, {figures['cpu_minutes']} CPU minutes of training): held-out next-token top-1 "
        f"{figures['next_token_top1']:.3f}; its MTP head = its trunk on {figures['mtp_vs_trunk_agreement']:.3f} of "
        f"tokens teacher-forced, {figures['mtp_vs_trunk_greedy_t2']:.3f} on greedy t+2; greedy continuations repeat "
        f"{figures['greedy_repeat_rate']:.3f} of their 4-grams"
    ]


def demo_text(result: Any) -> str:
    report = result.report
    return "\n".join(
        [
            f"\ntarget {report['target']}: {report['num_prompts']} held-out prompts, k = {report['num_draft_tokens']}",
            *_target_line(getattr(result, "target_figures", None)),
            acceptance_table(report["results"]),
            *map(comparison_text, report.get("comparison", [])),  # the gain over the raw head, with its interval
            "\nstage times: " + ", ".join(f"{k} {v:.0f} s" for k, v in result.stages.items()),
            f"drafts and the {result.exported.name} export are in {result.work}",
        ]
    )
