"""The exceptions mtp2draft raises on bad input. The CLI turns each into a one-line message and a non-zero exit.

Anything else escaping to the CLI is a bug and keeps its traceback (under MTP2DRAFT_DEBUG=1 these do too).
`read_json_file` / `read_json_object` read a JSON file the user handed over (a config.json, an index, a manifest)
into its value or one such line, worded alike whichever stage reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Mtp2DraftError(Exception):
    """Base class: a problem with the user's input or environment, explained in one line."""

    exit_code = 2


class OptionError(Mtp2DraftError):
    """An option's value is out of range or malformed (a value typer's type check cannot catch)."""


class SpecError(Mtp2DraftError):
    """A spec file is malformed."""


class UnknownFamilyError(Mtp2DraftError):
    """No spec matches the checkpoint."""


class NotSupportedError(UnknownFamilyError):
    """The checkpoint is of a family mtp2draft knowingly does not convert (`model_specs/not_supported/`), for the
    reason its row gives (a separate assistant draft, MTP weights unpublished, ...)."""


class NoMtpLayerError(Mtp2DraftError):
    """The checkpoint has no MTP layer (e.g. Kimi-K2 with num_nextn_predict_layers: 0)."""


class NotMtpError(NoMtpLayerError):
    """The checkpoint's MTP-named tensors hold another kind of drafter (DeepSeek's DSpark block drafter under
    `mtp.*`), which loading as an MTP layer would half-load."""


class ShallowTargetError(Mtp2DraftError):
    """The target has too few layers for the draft asked for (EAGLE-3 needs three distinct capturable layers)."""


class SourceError(Mtp2DraftError):
    """The SOURCE cannot be resolved: missing repo, revision, file or directory."""


class CheckpointError(Mtp2DraftError):
    """The checkpoint is inconsistent: missing shard, corrupt header, missing scale, wrong shape."""


class OutputExistsError(Mtp2DraftError):
    """The output directory exists and is not empty, and --overwrite was not given."""


class DraftError(Mtp2DraftError):
    """A draft directory is missing or malformed."""


class TensorError(Mtp2DraftError):
    """A tensor read from a draft, a dump or a checkpoint has a dtype it is never written in, or holds NaN / Inf."""


class DataError(Mtp2DraftError):
    """A training or evaluation data file is malformed."""


class ValidationError(Mtp2DraftError):
    """An exported draft violates its format's contract."""

    def __init__(self, message: str, violations: list[str] | None = None):
        super().__init__(message)
        self.violations = violations or []


class HubError(Mtp2DraftError):
    """A Hub operation failed (no token, no rights, network)."""


def read_json_file(path: Path, error: type[Mtp2DraftError], missing: str | None = None) -> Any:
    """The JSON value in the file `path`; `error` (one line) when the file is missing (`missing`, default: "PATH does
    not exist") or holds no valid JSON."""
    if not path.is_file():
        raise error(missing or f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from exc


def read_json_object(path: Path, error: type[Mtp2DraftError], missing: str | None = None) -> dict[str, Any]:
    """`read_json_file` of a file that must hold a JSON object."""
    data = read_json_file(path, error, missing)
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, not a {type(data).__name__}")
    return data
