"""Stage 4a: draft directory -> the files a serving engine loads, validated before they appear. A dispatcher: each
format lives in its own module of `formats/`, registered once in `formats.REGISTRY` (docs/formats.md's table of the
formats, their draft kinds and modules is generated from it); this module knows none of them by name.

Every export writes into a temporary sibling directory, runs `validate` on it, and renames it into place only
when the validator finds nothing: a violation raises `ValidationError` (listing them all) and nothing is written.
`validate` is the same function the `validate` command runs on any directory (format detected from config.json).

What this module does not do: train, evaluate or convert checkpoints (it reads draft directories written by
`convert` / `distill`), know any one format (`formats/`), or talk to the Hub beyond reading a `--target` checkpoint
(`hub/upload.py` publishes).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp2draft._version import __version__
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.draft.config import load_draft_config, parse_draft_config
from mtp2draft.dtypes import ST_NOT_F32
from mtp2draft.errors import DraftError, SourceError, ValidationError
from mtp2draft.family.spec import find_spec
from mtp2draft.formats import REGISTRY, ExportConfig, ExportJob, check_format, get_format
from mtp2draft.formats.common import read_json
from mtp2draft.kinds import (
    ACCEPTANCE_CHART,
    CONFIG_FILE,
    EVALUATION_FILE,
    PROVENANCE_FILE,
    DraftKind,
    is_dspark_dir,
    kind_of,
)
from mtp2draft.manifest import file_inside, write_json
from mtp2draft.outputs.directories import atomic_output_dir, check_output_dir
from mtp2draft.outputs.identity import check_unchanged, draft_identity
from mtp2draft.progress import Progress, quiet
from mtp2draft.redact import command_line
from mtp2draft.settings import HubAccess
from mtp2draft.target.identity import check_target_identity


@dataclass
class ExportResult:
    out: Path
    format: str
    files: list[str]
    seconds: float
    provenance: dict[str, Any] = field(default_factory=dict)


# ---- the stage --------------------------------------------------------------------------------------------------
def export(
    draft: str | Path,
    format: str,
    out: str | Path,
    target: str | None = None,
    overwrite: bool = False,
    config: ExportConfig | None = None,
    *,
    hub: HubAccess | None = None,
    progress: Progress = quiet,
) -> ExportResult:
    """Write draft directory `draft` in engine format `format` to `out` (validated before it appears).

    config: the weights dtype of the EAGLE-3 formats, speculators' k and verifier (`ExportConfig`, default its
    defaults). target: the target checkpoint (hub id or local dir); required by `stitched`, optional for `nextn` (its
    dtypes and FP8 layout then come from the target's headers rather than the draft's provenance); `hub`: its
    revision and the token.
    """
    src = Path(draft)
    settings, hub = config or ExportConfig(), hub or HubAccess()
    cfg = _checked_request(src, format, target, hub)
    check_output_dir(out, overwrite, inputs=[draft, target])
    started = time.perf_counter()
    read = draft_identity(src)  # what this export reads; checked again before the export appears
    provenance = read_json(src / PROVENANCE_FILE) or {}
    record: dict[str, Any] = {
        "format": format,
        "from": str(src),
        "version": __version__,
        "command": command_line(),
        "speculative_tokens": settings.speculative_tokens,  # the k every launch line drafts (`serving.serving_k`)
    }
    with atomic_output_dir(out, overwrite, inputs=[draft, target]) as tmp:
        job = ExportJob(
            src=src,
            cfg=cfg,
            out=tmp,
            format=format,
            config=settings,
            provenance=provenance,
            record=record,
            target=target,
            hub=hub,
            progress=progress,
            final=Path(out),
        )
        writer = REGISTRY[format].also.get(DraftKind.DSPARK, format) if is_dspark_dir(cfg) else format
        get_format(writer).write(job)  # type: ignore[misc]
        if evaluation := file_inside(src, EVALUATION_FILE):  # `push` puts the measured acceptance on the card
            shutil.copyfile(evaluation, tmp / EVALUATION_FILE)
            if chart := file_inside(src, ACCEPTANCE_CHART):  # drawn from that evaluation, linked by the card
                shutil.copyfile(chart, tmp / ACCEPTANCE_CHART)
        provenance = {**provenance, "export": record}
        write_json(tmp / PROVENANCE_FILE, provenance)
        progress(f"validating the {format} export")
        _refuse_violations(validate(tmp, format), format, src)
        check_unchanged(src, read, "exported")
        files = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("."))
    return ExportResult(Path(out), format, files, time.perf_counter() - started, provenance)


def _checked_request(src: Path, format: str, target: str | None, hub: HubAccess) -> dict:
    """The draft's config.json, once the options make sense for it: a format `export` writes, of the draft's kind,
    with the target it needs; one line (SourceError, DraftError) before any work otherwise."""
    check_format(format)
    raw = read_json(src / CONFIG_FILE) if src.is_dir() else None
    if raw is not None and is_dspark_dir(raw):  # its writers check it against --target (formats/dspark*.py)
        check_format(format, DraftKind.DSPARK, str(src))
        if REGISTRY[format].needs_target and not target:
            raise SourceError(f"--format {format} needs --target: the release whose DSpark stages the draft replaces")
        return dict(raw)
    parsed = load_draft_config(src, "export reads directories written by `convert` or `distill`")
    cfg = dict(parsed.raw)
    check_format(format, parsed.kind, str(src))
    if REGISTRY[format].needs_target and not target:
        raise SourceError(f"--format {format} needs --target: the checkpoint whose MTP layer the draft replaces")
    if target and REGISTRY[format].reads_target:  # the draft's own target, before any output is claimed
        from mtp2draft.formats.graft import identity_view  # a release without an MTP layer: its count field aside

        seen = identity_view(open_checkpoint(target, hub.revision, hub.token), cfg)
        check_target_identity(parsed, seen, f"--target {target}")
    return cfg


def _refuse_violations(violations: list[str], format: str, src: Path) -> None:
    """An export whose own output breaks its format is an error listing them all (the first three in its line)."""
    if violations:
        more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
        raise ValidationError(
            f"the {format} export of {src} violates its format ({len(violations)}): "
            + "; ".join(violations[:3])
            + more,
            violations,
        )


# ---- validation -------------------------------------------------------------------------------------------------
def detect_format(config: Mapping[str, Any]) -> str:
    """Which format a config.json describes: the registered formats' detectors, asked in their `detect_rank` order
    (a target config with MTP layers reads as a stitched overlay, the last resort)."""
    for name in sorted(REGISTRY, key=lambda n: REGISTRY[n].detect_rank):
        if get_format(name).detect(config):
            return name
    architectures = list(config.get("architectures") or [])
    raise DraftError(f"cannot tell the format from config.json (architectures {architectures}); pass --format")


@dataclass(frozen=True)
class DraftDirectory:
    """A draft or export directory as read once: its config.json and its format (named, or detected from it)."""

    path: Path
    config: dict[str, Any]
    format: str


def read_draft_directory(path: str | Path, format: str | None = None) -> DraftDirectory:
    """Directory `path`'s config.json and its format: `format` where one is named, else the one config.json
    describes. The one reading that `validate`, `push`, the model card and the `validate` command share. DraftError
    when the directory or its config.json is unreadable, the format is not a registered one or cannot be told."""
    path = Path(path)
    if not path.is_dir():
        raise DraftError(f"{path} is not a directory")
    cfg = read_json(path / CONFIG_FILE)
    if cfg is None:
        raise DraftError(f"{path} has no {CONFIG_FILE}")
    fmt = format or detect_format(cfg)
    if fmt not in REGISTRY:
        raise DraftError(f"--format must be one of {', '.join(REGISTRY)}, got {fmt!r}")
    return DraftDirectory(path, cfg, fmt)


def validate(
    path: str | Path | DraftDirectory,
    format: str | None = None,
    target: str | None = None,
    *,
    hub: HubAccess | None = None,
) -> list[str]:
    """Every way directory `path` violates its format's contract (empty: the engines will load it as intended).

    path: a directory, or one already read (`read_draft_directory`, whose format then stands). format: one of
    `VALIDATE_FORMATS`, or None to detect it from config.json. target: the target checkpoint (hub id or local dir;
    only its config is read), to check what depends on it — aux layer ids within its layers, hidden size and
    vocabulary; without it the target layer count the draft recorded at conversion is used. hub: the target's
    revision and the token that reaches it. Raises DraftError only when the directory or its config.json is
    unreadable or the format cannot be told."""
    found = path if isinstance(path, DraftDirectory) else read_draft_directory(path, format)
    cfg = found.config
    parsed = parse_draft_config(cfg, found.path / CONFIG_FILE) if kind_of(cfg) is not None else None  # a bad field
    problems = get_format(found.format).validate(found.path, cfg)
    hub = hub or HubAccess()
    target_cfg = open_checkpoint(target, hub.revision, hub.token).config if target else None
    if parsed is not None and target_cfg is not None:
        try:
            check_target_identity(parsed, target_cfg, f"--target {target}")
        except DraftError as exc:
            problems.append(str(exc))
    problems += _target_problems(cfg, target_cfg)
    # a format that checks its tensors' dtypes itself (speculators-mtp) has named them already: reported once
    problems += [p for p in _dtype_problems(found) if not any(p.split("(first: ")[-1][:-1] in q for q in problems)]
    return problems + _evaluation_problems(found.path)


def _dtype_problems(found: DraftDirectory) -> list[str]:
    """Each weights file tensor whose floating dtype is neither the config's `torch_dtype` nor fp32."""
    from safetensors import safe_open

    want = found.config.get("torch_dtype") or found.config.get("dtype")
    text = found.config.get("text_config")
    if want is None and isinstance(text, Mapping):
        want = text.get("torch_dtype") or text.get("dtype")
    if not isinstance(want, str) or want not in ST_NOT_F32.values() and want != "float32":
        return []
    problems = []
    for weights in sorted(found.path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as fh:
                keys = fh.keys()  # a safe_open handle is not iterable
                wrong = [
                    (k, d) for k in keys if (d := fh.get_slice(k).get_dtype()) in ST_NOT_F32 and ST_NOT_F32[d] != want
                ]
        except Exception as exc:  # the format's own checks name an unreadable file
            problems.append(f"{weights.name}: unreadable safetensors header ({exc})")
            continue
        if wrong:
            key, dtype = wrong[0]
            problems.append(
                f"{weights.name}: {len(wrong)} tensor(s) stored as {ST_NOT_F32[dtype]} under config torch_dtype {want} "
                f"(first: {key})"
            )
    return problems


def _evaluation_problems(path: Path) -> list[str]:
    """evaluation.json beside a draft (it goes on the model card) read by the report's rules, ranges included."""
    from mtp2draft.errors import DataError
    from mtp2draft.formats.report import read_report

    if not (path / EVALUATION_FILE).is_file():
        return []
    try:
        read_report(path)
    except DataError as exc:
        return [str(exc)]
    return []


def _target_problems(cfg: Mapping[str, Any], target_cfg: Mapping[str, Any] | None) -> list[str]:
    """What an EAGLE-3 draft's config promises about its target, checked against the target's config (or the layer
    count recorded at conversion): engines capture the input of layer i + 1 for aux id i, so ids run to N - 2."""
    # The top-level ids (vLLM's, in every EAGLE-3 layout) are "input of layer i": the captured outputs are i - 1.
    # eagle_config's are in SGLang's per-family terms (`[engines.sglang] aux_ids`), so they are not read here.
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    ids = [i - 1 for i in top if isinstance(i, int)] if isinstance(top, list) else None
    layers = None
    if target_cfg is not None:
        spec = find_spec(target_cfg)
        layers = spec.num_layers(target_cfg)
        text = spec.text_config(target_cfg)
        for field_name in ("hidden_size", "vocab_size"):
            mine = cfg.get("target_hidden_size" if field_name == "hidden_size" else field_name, cfg.get(field_name))
            if isinstance(mine, int) and text.get(field_name) is not None and mine != text[field_name]:
                return [f"{field_name} {mine} does not match the target's {text[field_name]}: not this target's draft"]
    else:
        recorded = (cfg.get("mtp2draft") or {}).get("target_num_layers")
        layers = recorded if isinstance(recorded, int) else None
    if layers is None or not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return []
    beyond = [i for i in ids if i > layers - 2]
    if beyond:
        return [
            f"aux layer ids {ids} go beyond the target's {layers} layers (engines can capture ids 0..{layers - 2}): "
            f"{beyond} would never be captured"
        ]
    return []
