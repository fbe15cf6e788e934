"""Export formats: the registry (`REGISTRY`, the one place a format is registered) and what a format module provides
(`Format`). One module per format family: `eagle3` (sglang, speculators), `nextn`, `stitched`, `speculators_mtp`
(speculators' `mtp` speculator type), `native` (the `mtp` draft directory, validated but never written), `dspark`
(speculators' `dspark` type) and `dspark_stitched` (a release's DSpark stages written back: `stitched` of a dspark
directory).
The contract is what the engines read (docs/formats.md and docs/engines.md cite each engine file and version).

This package's `__init__` is torch-free: the CLI lists `--format` choices from it without loading a model library;
`get_format(name)` imports the implementing module on first use.

What this package does not do: convert, train or evaluate drafts; `formats/export.py` is the stage that dispatches here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp2draft.dtypes import DTYPE_NAMES
from mtp2draft.errors import DraftError, SourceError
from mtp2draft.kinds import DraftKind
from mtp2draft.settings import MAX_DRAFT_TOKENS, HubAccess, setting


@dataclass(frozen=True)
class Registration:
    """A format as the registry knows it without importing its module."""

    kind: DraftKind  # the draft kind it holds (`export` takes drafts of this kind)
    module: str  # the module of this package that implements it (its `PROVIDES[name]`)
    description: str  # one line for the model card ("Format: ...")
    exportable: bool = True  # `export --format` writes it (False: a draft directory `validate` only checks)
    reads_target: bool = False  # `export` reads --target when given (its dtypes, quantization, shards)
    needs_target: bool = False  # `export` needs --target (the checkpoint the draft is laid over)
    # `detect_format` asks the formats in this order; a format detected only when nothing else matches sorts last
    detect_rank: int = 0
    # further kinds `export --format` takes, each -> the registered format that writes it (stitched: a release's
    # DSpark stages, written by `stitched-dspark`)
    also: Mapping[DraftKind, str] = field(default_factory=dict)


# The one place a format is registered. The order is the order of `--format` choices.
REGISTRY: dict[str, Registration] = {
    "sglang": Registration(
        DraftKind.EAGLE3,
        "eagle3",
        "EAGLE-3 draft in SGLang's `LlamaForCausalLMEagle3` layout (read by SGLang, vLLM and TensorRT-LLM)",
        detect_rank=1,
    ),
    "speculators": Registration(
        DraftKind.EAGLE3,
        "eagle3",
        "EAGLE-3 draft in vLLM's speculators format (`Eagle3Speculator`)",
        detect_rank=0,
    ),
    "nextn": Registration(
        DraftKind.MTP,
        "nextn",
        "native MTP layer as a standalone NextN checkpoint for SGLang",
        reads_target=True,
        detect_rank=3,
    ),
    "stitched": Registration(
        DraftKind.MTP,
        "stitched",
        "native MTP layer written back into the target's checkpoint layout (an overlay of its shards)",
        reads_target=True,
        needs_target=True,
        detect_rank=9,
        also={DraftKind.DSPARK: "stitched-dspark"},
    ),
    "speculators-mtp": Registration(
        DraftKind.MTP,
        "speculators_mtp",
        "native MTP layer as speculators' `mtp` speculator type (`MTPDraftModel`; Qwen3-Next / Qwen3.5 families)",
        detect_rank=0,
    ),
    "speculators-dspark": Registration(
        DraftKind.DSPARK,
        "dspark",
        "Qwen3-style DSpark drafter as speculators' `dspark` speculator type (`Qwen3DSparkModel`, read by vLLM)",
        reads_target=True,
        detect_rank=0,
    ),
    "mtp": Registration(
        DraftKind.MTP,
        "native",
        "native MTP layer in mtp2draft's own draft layout (export it to serve it)",
        exportable=False,
        detect_rank=2,
    ),
    "stitched-dspark": Registration(
        DraftKind.DSPARK,
        "dspark_stitched",
        "a release's DSpark stages written back under `mtp.*` in its own quantisation (`export --format stitched`)",
        exportable=False,
        detect_rank=8,
    ),
}


def exportable() -> dict[str, DraftKind]:
    """format -> the draft kind it takes, for the formats `export` writes (read from `REGISTRY` on every call)."""
    return {name: r.kind for name, r in REGISTRY.items() if r.exportable}


def check_format(format: str, kind: DraftKind | None = None, what: str = "") -> DraftKind:
    """The draft kind `format` takes, refused in one line when `export` does not write it or, given the `kind` of
    draft on hand (`what` names it: a directory, `--to mtp`), when it takes the other kind. `export` and `run`'s
    pre-flight both ask here."""
    formats = exportable()
    if format not in formats:
        raise SourceError(f"--format must be one of {', '.join(formats)}, got {format!r}")
    if kind is not None and formats[format] is not kind and kind not in REGISTRY[format].also:
        other = formats_of(kind)
        raise DraftError(
            f"--format {format} takes {formats[format].a_draft} draft; {what} is {kind.a_draft} draft "
            f"(use --format {' or '.join(other)})"
        )
    return formats[format]


# format -> the draft kind it takes (`mtp2draft export --format` choices come from here)
FORMATS: dict[str, DraftKind] = exportable()
# `validate` also knows mtp2draft's own native draft directory (`convert --to mtp`, `distill`).
VALIDATE_FORMATS = tuple(REGISTRY)


def verifier_ok(name: Any) -> bool:
    """Whether `name` can be a verifier's hub id or path: a non-empty string of one printable line (a newline in it
    would split the launch line the card prints)."""
    return isinstance(name, str) and bool(name.strip()) and name.isprintable()


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """How `export` writes a draft besides which format and where, each setting declared once here
    (`settings.setting`, from which the CLI's options are built); `run` builds it from its own -k. It refuses a bad
    value on construction, before any file is read."""

    dtype: str = setting(
        "bfloat16",
        "Weights dtype of sglang / speculators / speculators-mtp (float32: a bit-exact copy of an fp32 draft; the "
        "other native formats keep the target's own dtypes and quantization):",
        choices="dtypes",
    )
    speculative_tokens: int = setting(3, "speculators(-mtp): k written into the proposal method.")
    verifier: str | None = setting(
        None,
        "speculators(-mtp): the target `vllm serve DRAFT` loads, its hub id (default: the source converted from).",
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise SourceError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if not 1 <= self.speculative_tokens <= MAX_DRAFT_TOKENS:
            raise SourceError(
                f"--speculative-tokens must be in [1, {MAX_DRAFT_TOKENS}] (every draft step costs a draft forward), "
                f"got {self.speculative_tokens}"
            )
        if self.verifier is not None and not verifier_ok(self.verifier):
            raise SourceError(f"--verifier must be one line naming a hub id or path, got {self.verifier!r}")


@dataclass(kw_only=True)
class ExportJob:
    """What a format's writer gets: the draft directory, the temporary output directory and the options (built by
    name, once, in `export.export`)."""

    src: Path  # the draft directory (`convert` / `distill` output)
    cfg: dict[str, Any]  # its config.json
    out: Path  # the temporary directory the writer fills (validated, then renamed into place)
    format: str
    config: ExportConfig  # what the writer writes besides the draft's weights (dtype, k, verifier)
    provenance: Mapping[str, Any]  # the draft's provenance.json
    record: dict[str, Any]  # provenance["export"]: a writer adds what it decided (dtypes, requantised tensors)
    target: str | None = None
    hub: HubAccess = field(default_factory=HubAccess)  # how the target is reached: its revision and the token
    progress: Callable[[str], None] = field(default=lambda _: None)
    final: Path | None = None  # where the export lands, as given (`out`): the launch lines its README prints name it


@dataclass(frozen=True)
class Format:
    """What a format module provides for each format it registers (its `PROVIDES: dict[str, Format]`)."""

    write: Callable[[ExportJob], None] | None  # fills job.out; None for a format `export` never writes
    validate: Callable[[Path, dict[str, Any]], list[str]]  # (directory, its config.json) -> violations
    detect: Callable[[Mapping[str, Any]], bool]  # does this config.json describe the format?
    launch_lines: Callable[[str, str, int], dict[str, str]]  # (target, draft, k) -> label -> command
    usable: Callable[[Any], bool]  # (spec) -> an engine serves it for the family: `run` picks the first usable
    codec: Callable[..., dict[str, Any]] | None = None  # the format's config.json from a draft config
    # (spec) -> one-line refusal when the format cannot hold a draft of that family: `run` asks before any work
    check_family: Callable[[Any], Any] | None = None


def get_format(name: str) -> Format:
    """The implementation of registered format `name` (imports its module)."""
    module = importlib.import_module(f"{__name__}.{REGISTRY[name].module}")
    return module.PROVIDES[name]


def format_kind(fmt: str) -> DraftKind:
    """The kind of draft a format (any of `VALIDATE_FORMATS`: "mtp" is the native draft directory) holds."""
    return REGISTRY[fmt].kind if fmt in REGISTRY else DraftKind(fmt)


def formats_of(kind: DraftKind) -> list[str]:
    """The exportable formats holding drafts of `kind`, in registry order."""
    return [name for name, k in exportable().items() if k is kind or kind in REGISTRY[name].also]
