"""Stage 4a: draft directory -> the files a serving engine loads, validated before they appear. A dispatcher: each
format lives in its own module of `formats/` (`formats.REGISTRY` lists them; `../shared/reference/draft-formats.md`
is the contract):
- `sglang` (EAGLE-3): SGLang's `LlamaForCausalLMEagle3` layout, also read by vLLM and TensorRT-LLM (`formats.eagle3`).
- `speculators` (EAGLE-3): vLLM's native `Eagle3Speculator` format (`formats.eagle3`).
- `nextn` (native MTP): a standalone NextN checkpoint for SGLang (`formats.nextn`).
- `stitched` (native MTP): the fine-tuned layer written back over the target as an overlay (`formats.stitched`).
- `mtp`: mtp2draft's own native draft directory, which `validate` checks and export reads (`formats.native`).

Every export writes into a temporary sibling directory, runs `validate` on it, and renames it into place only
when the validator finds nothing: a violation raises `ValidationError` (listing them all) and nothing is written.
`validate` is the same function the `validate` command runs on any directory (format detected from config.json).

What this module does not do: train, evaluate or convert checkpoints (it reads draft directories written by
`convert` / `distill`), know any one format (`formats/`), or talk to the Hub beyond reading a `--target` checkpoint
(`hub.py` publishes).
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
from mtp2draft.errors import DraftError, SourceError, ValidationError
from mtp2draft.family.spec import find_spec
from mtp2draft.formats import REGISTRY, ExportConfig, ExportJob, check_format, get_format
from mtp2draft.formats.common import read_json
from mtp2draft.io import Progress, atomic_output_dir, check_output_dir, quiet, write_json
from mtp2draft.kinds import ACCEPTANCE_CHART, CONFIG_FILE, EVALUATION_FILE, PROVENANCE_FILE, kind_of
from mtp2draft.redact import command_line
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
    revision: str | None = None,
    token: str | bool | None = None,
    progress: Progress = quiet,
) -> ExportResult:
    """Write draft directory `draft` in engine format `format` to `out` (validated before it appears).

    config: the weights dtype of the EAGLE-3 formats, speculators' k and verifier (`ExportConfig`, default its
    defaults). target: the target checkpoint (hub id or local dir); required by `stitched`, optional for `nextn` (its
    dtypes and FP8 layout then come from the target's headers rather than the draft's provenance).
    """
    src = Path(draft)
    settings = config or ExportConfig()
    cfg = _checked_request(src, format, target, revision, token)
    check_output_dir(out, overwrite, inputs=[draft, target])
    started = time.perf_counter()
    provenance = read_json(src / PROVENANCE_FILE) or {}
    record: dict[str, Any] = {
        "format": format,
        "from": str(src),
        "version": __version__,
        "command": command_line(),
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
            revision=revision,
            token=token,
            progress=progress,
        )
        get_format(format).write(job)  # type: ignore[misc]
        if (src / EVALUATION_FILE).is_file():  # `push` puts the measured acceptance on the model card
            shutil.copyfile(src / EVALUATION_FILE, tmp / EVALUATION_FILE)
            if (src / ACCEPTANCE_CHART).is_file():  # drawn from that evaluation, linked by the card
                shutil.copyfile(src / ACCEPTANCE_CHART, tmp / ACCEPTANCE_CHART)
        provenance = {**provenance, "export": record}
        write_json(tmp / PROVENANCE_FILE, provenance)
        progress(f"validating the {format} export")
        _refuse_violations(validate(tmp, format), format, src)
        files = sorted(p.name for p in tmp.iterdir())
    return ExportResult(Path(out), format, files, time.perf_counter() - started, provenance)


def _checked_request(src: Path, format: str, target: str | None, revision=None, token=None) -> dict:
    """The draft's config.json, once the options make sense for it: a format `export` writes, of the draft's kind,
    with the target it needs; one line (SourceError, DraftError) before any work otherwise."""
    check_format(format)
    parsed = load_draft_config(src, "export reads directories written by `convert` or `distill`")
    cfg = dict(parsed.raw)
    check_format(format, parsed.kind, str(src))
    if REGISTRY[format].needs_target and not target:
        raise SourceError(f"--format {format} needs --target: the checkpoint whose MTP layer the draft replaces")
    if target and REGISTRY[format].reads_target:  # the draft's own target, before any output is claimed
        from mtp2draft.formats.graft import identity_view  # a release without an MTP layer: its count field aside

        seen = identity_view(open_checkpoint(target, revision, token), cfg)
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
    revision: str | None = None,
    token: str | bool | None = None,
) -> list[str]:
    """Every way directory `path` violates its format's contract (empty: the engines will load it as intended).

    path: a directory, or one already read (`read_draft_directory`, whose format then stands). format: one of
    `VALIDATE_FORMATS`, or None to detect it from config.json. target: the target checkpoint (hub id or local dir;
    only its config is read), to check what depends on it — aux layer ids within its layers, hidden size and
    vocabulary; without it the target layer count the draft recorded at conversion is used. Raises DraftError only
    when the directory or its config.json is unreadable or the format cannot be told."""
    found = path if isinstance(path, DraftDirectory) else read_draft_directory(path, format)
    cfg = found.config
    parsed = parse_draft_config(cfg, found.path / CONFIG_FILE) if kind_of(cfg) is not None else None  # a bad field
    problems = get_format(found.format).validate(found.path, cfg)
    target_cfg = open_checkpoint(target, revision, token).config if target else None
    if parsed is not None and target_cfg is not None:
        try:
            check_target_identity(parsed, target_cfg, f"--target {target}")
        except DraftError as exc:
            problems.append(str(exc))
    return problems + _target_problems(cfg, target_cfg)


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
