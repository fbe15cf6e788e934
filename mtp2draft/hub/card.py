"""The model card (README.md) `push` uploads, generated from a draft directory's config.json, provenance.json and
evaluation.json; and `serve_text`, the same launch lines for an export where it lies (`run`'s summary). A README.md
already in the directory (the stitched export's overlay note) becomes a section of the card.

The card also carries the speed model's prediction for the family's real checkpoint (`speed/card.py`) when the
draft has an evaluation and mtp2draft ships that checkpoint's config.

Card metadata: `base_model` (the target), `library_name: mtp2draft`, `pipeline_tag: text-generation`, tags, and a
`model-index` entry with the measured mean acceptance length when evaluation.json exists. `library_name` is
mtp2draft because the Hub uses it for the "use this model" snippet and download counting: `transformers` would be
wrong (no AutoModel loads these layouts), the engines that serve the draft are listed as tags, and mtp2draft's own
loader (`load_draft`) reads every format it writes.

What this module does not do: upload (`hub/upload.py`), validate the draft (`formats/export.py`) or measure
acceptance (`evaluation/decode.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtp2draft._version import __version__
from mtp2draft.errors import DraftError, Mtp2DraftError
from mtp2draft.evaluation.verdict import lossless_words
from mtp2draft.family.schema import ENGINES, NO_CHAIN, Spec
from mtp2draft.family.spec import find_spec, get_spec
from mtp2draft.formats import REGISTRY, format_kind
from mtp2draft.formats.common import README_FILE, read_json
from mtp2draft.formats.export import DraftDirectory, read_draft_directory
from mtp2draft.formats.report import read_report
from mtp2draft.formats.serving import (
    LINE_ENGINES,
    SERVE_SECTIONS,
    is_hub_id,
    launch_lines,
    local_ref,
    serving_k,
    serving_text,
    unsupported_engines,
)
from mtp2draft.kinds import ACCEPTANCE_CHART, EVALUATION_FILE, PROVENANCE_FILE, DraftKind

# What mtp2draft measured about EAGLE-3 drafts converted from an MTP layer (docs/notes/eagle3-from-mtp.md), said on every
# EAGLE-3 card so that a user who can serve the native draft knows it was the better one there.
EAGLE3_ADVICE = (
    "Measured by mtp2draft on its bundled tiny MiMo target, on data from a source it never trained on "
    "(docs/notes/eagle3-from-mtp.md): the native MTP draft distilled for 120 steps accepted 2.86 tokens per target "
    "forward at k = 4, an EAGLE-3 draft converted from the same layer and distilled for 240 steps 2.43. Where your "
    "engine serves the family's native MTP module, prefer `mtp2draft convert --to mtp`."
)

LIBRARY_NAME = "mtp2draft"


# ---- the model card ---------------------------------------------------------------------------------------------
def _is_repo_id(value: Any) -> bool:
    return isinstance(value, str) and bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", value)) and ".." not in value


def _target(cfg: Mapping[str, Any], prov: Mapping[str, Any]) -> str | None:
    """The target the draft serves: provenance `source`, else config `mtp2draft.source`, else speculators' verifier."""
    export = prov.get("export") or {}
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    for value in (prov.get("source"), (cfg.get("mtp2draft") or {}).get("source"), export.get("target"), verifier):
        if value:
            return str(value)
    return None


def _acceptance_table(evaluation: Mapping[str, Any]) -> str:
    rows = [
        "| draft | draft tokens | mean acceptance length | acceptance per position | per draft | lossless |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(evaluation.get("results") or []):
        name = "**this draft**" if n == 0 else str(r.get("name", "baseline"))
        per = " / ".join(f"{p:.2f}" for p in r.get("acceptance_per_position") or [])
        per_draft = " / ".join(f"{p:.2f}" for p in r.get("per_draft_acceptance") or []) or "?"
        mal = r.get("mean_acceptance_length")
        words = lossless_words(r)
        lossless = {"no": "**no**", None: "?"}.get(words, words)
        if r.get("lossless") is None and r.get("distribution_check"):
            lossless = f"KS p = {r['distribution_check']['pit_ks_p_value']:.2f}"
        mal_text = f"{mal:.2f}" if isinstance(mal, int | float) else "?"
        rows.append(f"| {name} | {r.get('num_draft_tokens', '?')} | {mal_text} | {per} | {per_draft} | {lossless} |")
    return "\n".join(rows)


def _decoding(evaluation: Mapping[str, Any]) -> str:
    """How the evaluation decoded, and in what engine when it says so (`evaluate --engine`)."""
    temperature = evaluation.get("temperature") or 0
    how = f"temperature {temperature:g}, top-p {evaluation.get('top_p', 1):g}" if temperature else "greedy"
    engine = evaluation.get("engine")
    if isinstance(engine, Mapping) and engine.get("name") == "vllm":  # vLLM's counters; lossless: vs its plain run
        how += f", served by vLLM {engine.get('version', '?')}, read from its counters"
    return how


def _demote(markdown: str) -> str:
    """An existing README as a card section: its title dropped, its headings one level down, and the export's own
    serving sections (`serving.SERVE_SECTIONS`: local paths) left out: the card's "Serve it" gives the same lines,
    from the same source, for the Hub repo."""
    lines = markdown.strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    kept, skipping = [], False
    for line in lines:
        if line.startswith("## "):
            skipping = line[3:].strip() in SERVE_SECTIONS
        if not skipping:
            kept.append("#" + line if line.startswith("#") else line)
    return "\n".join(kept).strip()


def serve_text(path: str | Path) -> list[str]:
    """How to serve the export at `path` where it lies (`run`'s summary): the card's launch lines and notes, with the
    local directory as the draft and the target as its provenance names it."""
    path = Path(path)
    cfg, prov = read_draft_directory(path).config, read_json(path / PROVENANCE_FILE) or {}
    spec, chain, target = _spec_of(cfg, prov), _chain_layers(cfg, prov), _target(cfg, prov) or "<target>"
    k = serving_k(prov, read_json(path / EVALUATION_FILE), chain)
    revision = prov.get("commit") if target == prov.get("source") else None
    where = target if is_hub_id(target) or target == "<target>" else local_ref(target)
    lines = launch_lines(read_draft_directory(path).format, where, local_ref(path), k, spec, chain, revision)
    return serving_text(lines, (prov.get("export") or {}).get("engine_notes"), spec)


def model_card(path: str | Path | DraftDirectory, repo_id: str | None = None, base_model: str | None = None):
    """The huggingface_hub `ModelCard` for draft directory `path` (or one already read; nothing is written)."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    found = path if isinstance(path, DraftDirectory) else read_draft_directory(path)
    path, cfg, fmt = found.path, found.config, found.format
    prov = read_json(path / PROVENANCE_FILE) or {}
    evaluation = read_json(path / EVALUATION_FILE)
    if (path / EVALUATION_FILE).is_file():  # its figures go on the card: read by the rules `evaluate --save` writes by
        read_report(path / EVALUATION_FILE)
    kind = format_kind(fmt)
    target = base_model or _target(cfg, prov)
    name = (repo_id or path.resolve().name).split("/")[-1]
    draft_ref = repo_id or str(path)
    k = serving_k(prov, evaluation, _chain_layers(cfg, prov))
    results = (evaluation or {}).get("results") or []
    eval_results = None
    if results and isinstance(results[0].get("mean_acceptance_length"), int | float):
        data = str(evaluation.get("data") or "prompts")  # type: ignore[union-attr]
        eval_results = [
            EvalResult(
                task_type="text-generation",
                task_name="Speculative decoding",
                dataset_type=Path(data).stem,
                dataset_name=data,
                metric_type="mean_acceptance_length",
                metric_name=f"Mean acceptance length (k={results[0].get('num_draft_tokens', k)})",
                metric_value=float(results[0]["mean_acceptance_length"]),
            )
        ]
    tags = ["speculative-decoding", kind.value, "sglang", "vllm", LIBRARY_NAME]
    if fmt == "speculators":
        tags.append("speculators")
    data_card = ModelCardData(
        base_model=target if _is_repo_id(target) else None,
        library_name=LIBRARY_NAME,
        pipeline_tag="text-generation",
        tags=tags,
        model_name=name,
        eval_results=eval_results,
    )
    body = _body(found, prov, evaluation, name=name, target=target, draft=draft_ref, k=k)
    existing = path / README_FILE
    if existing.is_file():
        body += "\n## Notes from the export\n\n" + _demote(_readme_text(existing)) + "\n"
    return ModelCard(f"---\n{data_card.to_yaml()}\n---\n\n{body}")


def _readme_text(file: Path) -> str:
    """A directory's own README.md, which the card quotes: UTF-8 (a BOM allowed), else one line saying so."""
    try:
        return file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bom = file.read_bytes()[:2] in (b"\xff\xfe", b"\xfe\xff")
        what = "UTF-16" if bom else f"not UTF-8 (byte {exc.start})"
        raise DraftError(
            f"{file} is {what}: the model card quotes it as UTF-8; save it as UTF-8 or remove it"
        ) from None


def _body(
    found: DraftDirectory,
    prov: Mapping[str, Any],
    evaluation: Mapping[str, Any] | None,
    *,
    name: str,
    target: str | None,
    draft: str,
    k: int,
) -> str:
    """The card's text for the draft directory `found` (its provenance and evaluation read), published as `name`
    at `draft` for `target`, served with k = `k`; the acceptance chart is shown where the directory holds one."""
    fmt, cfg = found.format, found.config
    chart = evaluation is not None and (found.path / ACCEPTANCE_CHART).is_file()
    target_text = f"[`{target}`](https://huggingface.co/{target})" if _is_repo_id(target) else f"`{target or '?'}`"
    distill = prov.get("distill")
    how = "fine-tuned for multi-step drafting with `mtp2draft distill`" if distill else "converted as is"
    out = [
        f"# {name}",
        "",
        f"A speculative-decoding draft for {target_text}, built by mtp2draft from "
        + (
            "a DSpark block drafter"
            if format_kind(fmt) is DraftKind.DSPARK
            else "the multi-token-prediction (MTP) layer the target ships"
        )
        + f", {how}.",
        "",
        f"Format: {REGISTRY[fmt].description if fmt in REGISTRY else fmt}.",
    ]
    if format_kind(fmt) is DraftKind.EAGLE3:
        vocab = cfg.get("draft_vocab_size") or (cfg.get("transformer_layer_config") or {}).get("vocab_size")
        out += [
            "",
            f"One Llama-shaped EAGLE-3 layer; draft vocabulary {vocab} tokens; the target's embedding is shared.",
            "",
            EAGLE3_ADVICE,
        ]
    out += ["", "## Acceptance", "", *_acceptance_section(evaluation, target, chart)]
    spec = _spec_of(cfg, prov)
    if evaluation and evaluation.get("results"):
        from mtp2draft.speed.card import card_section  # torch-free, like this module

        speed = card_section(format_kind(fmt).value, target, spec.name if spec else None, evaluation)
        out += ["", *speed] if speed else []
    chain = _chain_layers(cfg, prov)  # k (serving_k) is at least the chain's layers: each runs only then
    revision = prov.get("commit") if target == prov.get("source") else None
    lines = launch_lines(fmt, target or "<target>", draft, k, spec, chain, revision)
    out += ["", "## Serve it", ""]
    if chain > 1:
        out += [_chain_note(chain, cfg, prov, spec), ""]
    if spec is not None:
        out += _unserved(fmt, spec, chain)
    if any(label in LINE_ENGINES for label in lines):
        out += serving_text(lines, (prov.get("export") or {}).get("engine_notes"), spec)
        if fmt == "nextn" and (spec is None or spec.serves("vllm", DraftKind.MTP)):
            out.append("vLLM loads MTP drafts from the target checkpoint itself: use the `stitched` export for vLLM.")
    elif fmt in ("mtp", "eagle3") or not lines:
        out.append("Export it first: `mtp2draft export DRAFT --format nextn|stitched --out DIR`.")
    trained = _trained_for(cfg, prov)
    if trained:
        out += ["", trained]
    out += ["", "## Provenance", ""] + _provenance(cfg, prov, target)
    return "\n".join(out) + "\n"


def _acceptance_section(evaluation: Mapping[str, Any] | None, target: str | None, chart: bool) -> list[str]:
    """The card's measured acceptance: how it was measured, the table, the chart where `evaluate --save` drew one."""
    out: list[str] = []
    if evaluation and evaluation.get("results"):
        where = f"`{evaluation.get('target', target)}`"
        if evaluation.get("target_commit"):
            where += f" (commit `{str(evaluation['target_commit'])[:12]}`)"
        out += [
            f"Measured by `mtp2draft evaluate` against {where} on `{evaluation.get('data', '?')}` "
            f"({evaluation.get('num_prompts', '?')} prompts, up to {evaluation.get('max_new_tokens', '?')} new tokens, "
            f"{_decoding(evaluation)}). Mean acceptance length counts the tokens each target forward produces, bonus "
            "token included; acceptance per position is conditional (position j accepted given 1..j-1 were), per "
            "draft it is P(position j accepted) (vLLM's per-position counters); lossless means the output equals the "
            "target's greedy output token for token ('N tie(s)': N prompts parted from it where its top two logits "
            "tie within its dtype's rounding; at a temperature: checked in distribution, see evaluation.json).",
            "",
            _acceptance_table(evaluation),
        ]
        if chart:  # `evaluate --save` drew it from the same evaluation.json
            out += ["", f"![Acceptance per draft position, raw MTP head beside the draft]({ACCEPTANCE_CHART})"]
    else:
        out.append("Not measured yet (no evaluation.json beside the draft: run `mtp2draft evaluate --save`).")
    return out


def _provenance(cfg: Mapping[str, Any], prov: Mapping[str, Any], target: str | None) -> list[str]:
    """The card's provenance section: where the draft came from and which mtp2draft made it, then the distillation
    settings as a table when it was distilled."""
    export = prov.get("export") or {}
    facts = [
        ("target", prov.get("source") or target),
        ("target revision", prov.get("revision")),
        ("target commit", prov.get("commit")),
        ("spec", prov.get("spec") or (cfg.get("mtp2draft") or {}).get("spec")),
        ("MTP layer", prov.get("mtp_layer")),
        ("draft kind", prov.get("draft_kind")),
        ("FP8 weights dequantised", len(prov.get("dequantised_fp8") or []) or None),
        ("aux layer ids (output of layer)", prov.get("aux_layer_ids")),
        ("converted with", f"mtp2draft {prov['version']}" if prov.get("version") else None),
        ("command", f"`{prov['command']}`" if prov.get("command") else None),
        ("export", f"{export.get('format')} ({export.get('dtype') or 'target dtypes'})" if export else None),
        ("exported with", f"mtp2draft {export['version']}" if export.get("version") else None),
        ("pushed with", f"mtp2draft {__version__}"),
    ]
    out = [f"- {key}: {value}" for key, value in facts if value not in (None, "", [])]
    distill = prov.get("distill")
    if isinstance(distill, Mapping):
        out += ["", "### Distillation", "", "| setting | value |", "|---|---|"]
        out += [f"| {key} | {_cell(value)} |" for key, value in distill.items()]
    return out


def _spec_of(cfg: Mapping[str, Any], prov: Mapping[str, Any]) -> Spec | None:
    """The target family's spec: named by the draft (EAGLE-3 config, provenance) or matched by a native export's
    config.json (the target's own); None when unknown."""
    name = (cfg.get("mtp2draft") or {}).get("spec") or prov.get("spec") or cfg.get("spec")
    try:
        return get_spec(name) if name else find_spec(cfg)
    except Mtp2DraftError:
        return None


def _trained_for(cfg: Mapping[str, Any], prov: Mapping[str, Any]) -> str:
    """One sentence on which native MTP computation the draft was trained for (empty for EAGLE-3 drafts)."""
    record = {**(prov.get("export") or {}), **{k: cfg[k] for k in ("hidden_handover", "engine") if k in cfg}}
    handover = record.get("hidden_handover")
    if not handover:
        return ""
    engine = record.get("engine") or {}
    who = (
        f"{engine.get('name')} {engine.get('version')}'s MTP computation"
        if engine
        else "the checkpoint's own MTP layer (no engine named)"
    )
    return (
        f"Trained for {who}: each draft step hands the {handover.replace('_', '-')} hidden to the next "
        f"(`hidden_handover: {handover}`); serve it with that engine for the measured acceptance."
    )


def _unserved(fmt: str, spec: Spec, chain: int) -> list[str]:
    """A card line (and a blank) per engine that cannot run this draft (its kind, or a chain of `chain` layers)."""
    method = "EAGLE-3" if format_kind(fmt) is DraftKind.EAGLE3 else "native MTP"
    what = f"chain of {chain} MTP layers" if chain > 1 else f"{method} draft"
    out = []
    for engine in unsupported_engines(fmt, spec, chain):
        out += [
            f"{engine} cannot serve a {what} for {spec.name} targets (mtp2draft's engine table, `mtp2draft specs`): "
            "no launch line for it.",
            "",
        ]
    return out


def _chain_layers(cfg: Mapping[str, Any], prov: Mapping[str, Any]) -> int:
    """How many MTP layers the draft chains (a chain draft, or a stitched export of one); 1 otherwise."""
    layers = cfg.get("mtp_layers") or (prov.get("export") or {}).get("mtp_layers") or [0]
    return len(layers) if isinstance(layers, list) else 1


def _chain_note(n: int, cfg: Mapping[str, Any], prov: Mapping[str, Any], spec: Spec | None) -> str:
    """Which layer each engine runs at each step, from the family's engine table (`step_layers`)."""
    rule = cfg.get("step_layers") or (prov.get("export") or {}).get("step_layers") or "cycle"
    rules = {
        "cycle": "layer i at step i, from layer 0 again past the last",
        "first": "layer 0 at every step",
        NO_CHAIN: "no chain (it serves one MTP layer)",
    }
    engines = []
    for engine in ENGINES:
        facts = spec.engine(engine) if spec is not None else None
        if facts is not None and facts.step_layers:
            engines.append(f"{engine} {facts.version} runs {rules[facts.step_layers]}")
    said = "; ".join(engines) if engines else "the family's engine table states no engine's rule"
    bugs = [f" Known bug, {e} {f.version}: {f.known_bug}" for e, f in _engine_facts(spec) if f.known_bug]
    return (
        f"This draft chains {n} MTP layers, trained to run {rules.get(rule, rule)} (`step_layers: {rule}`); the "
        f"launch lines draft {n} or more tokens so that every layer runs. Engines differ: {said} (`mtp2draft specs`)."
    ) + "".join(bugs)


def _engine_facts(spec: Spec | None) -> list[tuple[str, Any]]:
    """(engine, its facts) of every engine the family's table lists."""
    found = [(e, spec.engine(e)) for e in ENGINES] if spec is not None else []
    return [(e, f) for e, f in found if f is not None]


def _cell(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text.replace("|", "\\|")


__all__ = ["LIBRARY_NAME", "model_card", "serve_text"]
