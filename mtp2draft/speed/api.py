"""`speedup`: the speed model from files, as the CLI and the model card call it: an evaluation (or acceptance), a
target config.json, optionally a draft config.json, an accelerator name and a TP size.

A config reference is a config.json, a directory holding one, or the hub id of a checkpoint whose config ships with
mtp2draft (`published.shipped_configs()`): nothing is downloaded.

What this module does not do: build cost models (`cost.py`) or compute speeds (`model.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtp2draft.errors import DataError, OptionError, SourceError
from mtp2draft.speed.accelerators import get_accelerator
from mtp2draft.speed.cost import draft_cost, mtp_draft_cost, target_cost, text_config
from mtp2draft.speed.model import BATCHES, KS, Acceptance, Deployment, SpeedReport, predict, read_acceptance
from mtp2draft.speed.published import load_config, shipped_configs

# Tokens of history per request the prediction assumes unless told (shorter when the target's context is).
DEFAULT_CONTEXT = 4096


def read_config(ref: str | Path) -> tuple[dict[str, Any], str]:
    """(config, where it came from) for a config.json path, a directory holding one, or a shipped hub id."""
    path = Path(ref)
    file = path / "config.json" if path.is_dir() else path
    if file.is_file():
        try:
            config = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise DataError(f"{file}: not JSON ({exc.msg} at line {exc.lineno})") from None
        except UnicodeDecodeError:
            raise DataError(f"{file}: not UTF-8 text (is it a config.json?)") from None
        if not isinstance(config, dict):
            raise DataError(f"{file}: not a model config (a JSON object), got a {type(config).__name__}")
        return config, str(file)
    if str(ref) in shipped_configs():
        return load_config(str(ref)), f"{ref} (config shipped with mtp2draft)"
    shipped = ", ".join(sorted(shipped_configs()))
    raise SourceError(
        f"no config.json at {ref}: pass a config.json or its directory (e.g. `hf download REPO config.json "
        f"--local-dir DIR`), or one of the shipped {shipped}"
    )


def model_name(config: Mapping[str, Any], fallback: str) -> str:
    cfg = text_config(config)
    return str(cfg.get("_name_or_path") or fallback)


def speedup(
    evaluation: str | Path | Acceptance,
    target: str | Path | Mapping[str, Any],
    gpu: str,
    tp: int = 1,
    draft: str | Path | Mapping[str, Any] | None = None,
    context: int | None = None,
    draft_tp: int | None = None,
    ks: Sequence[int] = KS,
    batches: Sequence[int] | None = None,
) -> SpeedReport:
    """Predicted speed with and without the draft. `draft` None: the evaluated draft directory's own config when
    `evaluation` is one, else the target's own MTP layer; `batches` None: 1, 2, 4, ..., 64; `context` None:
    DEFAULT_CONTEXT, or the target's max_position_embeddings when that is shorter."""
    check_options(tp, draft_tp, context, batches)
    acceptance = evaluation if isinstance(evaluation, Acceptance) else read_acceptance(evaluation)
    if isinstance(target, Mapping):
        target_cfg, target_src = dict(target), "target config"
    else:
        target_cfg, target_src = read_config(target)
    accelerator = get_accelerator(gpu)
    name = model_name(target_cfg, str(target) if not isinstance(target, Mapping) else "target")
    t = _named(target_src, lambda: target_cost(target_cfg, name))
    longest = text_config(target_cfg).get("max_position_embeddings")
    longest = longest if isinstance(longest, int) and not isinstance(longest, bool) and longest > 0 else None
    if context is None:
        context = min(DEFAULT_CONTEXT, longest or DEFAULT_CONTEXT)
    elif longest is not None and context > longest:
        raise OptionError(f"--context {context} is beyond the target's max_position_embeddings {longest}")
    if draft is None and not isinstance(evaluation, Acceptance) and (Path(evaluation) / "config.json").is_file():
        draft = Path(evaluation)  # a draft directory: the draft is the one evaluated
    if draft is None:
        d = _named(target_src, lambda: mtp_draft_cost(target_cfg, "the target's MTP layer"))
    else:
        draft_cfg, draft_src = (dict(draft), "draft config") if isinstance(draft, Mapping) else read_config(draft)
        d = _named(draft_src, lambda: draft_cost(draft_cfg, f"draft ({draft_src})"))
    report = predict(t, d, acceptance, Deployment(accelerator, tp, draft_tp, context), ks, batches or BATCHES)
    report.notes.insert(0, f"target config: {target_src}")
    measured_on = acceptance.target_family
    family = _family(target_cfg)
    if measured_on is not None and family is not None and measured_on != family:
        report.notes.insert(
            1,
            f"acceptance was measured on a {measured_on} target ({acceptance.source}), this predicts for a {family} "
            "config: the figures hold only as far as the drafts behave alike",
        )
    elif measured_on is None and not isinstance(evaluation, Acceptance):
        report.notes.insert(1, f"{acceptance.source} does not say which family of target it was measured on")
    per_device = t.weight_bytes() / tp
    if per_device > accelerator.memory_bytes:
        report.notes.append(
            f"the target's weights alone take {per_device / 1e9:.0f} GB per device at TP {tp}, more than the "
            f"{accelerator.memory_bytes / 1e9:.0f} GB of one {accelerator.description}: raise --tp"
        )
    return report


def _family(config: Mapping[str, Any]) -> str | None:
    """The family (spec name) of a model config, or its model_type when no spec matches."""
    from mtp2draft.errors import Mtp2DraftError
    from mtp2draft.family.spec import find_spec

    try:
        return find_spec(config).name
    except Mtp2DraftError:
        model_type = config.get("model_type")
        return model_type if isinstance(model_type, str) else None


def check_options(tp: Any, draft_tp: Any, context: Any, batches: Sequence[int] | None) -> None:
    """Each option in one line naming it: TP sizes >= 1, a context >= 0, batch sizes >= 1."""
    for option, value, least in (("--tp", tp, 1), ("--draft-tp", draft_tp, 1), ("--context", context, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise OptionError(f"{option} must be a whole number >= {least}, got {value!r}")
    if batches is not None and (not batches or min(batches) < 1):
        raise OptionError(f"--batch sizes must be whole numbers >= 1, got {','.join(map(str, batches)) or 'none'}")


def _named(source: str, build: Callable[[], Any]) -> Any:
    """A config's cost model; a field it cannot be built from is one line naming the file."""
    try:
        return build()
    except DataError as exc:
        raise DataError(f"{source}: {exc}") from None


__all__ = ["check_options", "read_config", "speedup"]
