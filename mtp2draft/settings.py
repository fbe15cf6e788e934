"""Settings declared once: a stage's settings are the fields of a frozen dataclass, each with its name, type, default
and help in one `setting(...)` line; the command line's options are built from those fields (`cli/options.py`), so a
flag's default and help cannot drift from what the library does.

Here too are the settings no single stage owns: where the frozen target runs (`Placement`) and how the Hub is
reached (`HubAccess`), and the settings of the commands without a settings module of their own: `dump-hidden`'s
(`DumpConfig`) and `convert`'s (`ConvertConfig`). The other stages keep theirs beside their code: `train.settings.DistillConfig`,
`evaluation.settings.EvaluateConfig`, `formats.ExportConfig`.

What this module does not do: parse a command line, import torch or typer, or read any file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtp2draft.errors import OptionError

NO_DEFAULT = dataclasses.MISSING


def setting(
    default: Any = NO_DEFAULT,
    help: str = "",
    *,
    flag: str | None = None,
    short: str | None = None,
    advanced: bool = False,
    cli: bool = True,
    parse: Callable[[str], Any] | None = None,
    choices: str | None = None,
) -> Any:
    """One setting: a dataclass field whose metadata the CLI builds its option from.

    `flag` defaults to the field name with dashes (`ttt_steps` -> `--ttt-steps`); `short` adds a one-letter alias;
    `advanced` puts the option in the Advanced panel of `--help` (research knobs); `cli=False` keeps it library-only
    (say why in the help); `parse` turns the option's text into the
    field's value (lists written 'a,b,c'); `choices` names the registry (`cli.options.choices`) whose values the help
    lists after its text."""
    meta = {"help": help, "flag": flag, "short": short, "advanced": advanced, "cli": cli}
    meta |= {"parse": parse, "choices": choices}
    return dataclasses.field(default=default, metadata=meta)


# Draft tokens per target forward, wherever a k is taken (evaluate -k, export --speculative-tokens): past this a
# draft accepts nothing more (acceptance falls with depth) and every step still costs a draft forward (k = 2000 took
# 74 s a prompt on the tiny targets).
MAX_DRAFT_TOKENS = 64

# Seeds are signed 64-bit integers wherever they end up (torch generators, vLLM requests): a larger --seed is refused
# in one line, and the per-item seeds derived from it (`derived_seed`) wrap inside the same range.
MAX_SEED = 2**63 - 1


def check_seed(seed: Any, option: str = "--seed") -> None:
    """Refuse a seed outside [0, MAX_SEED] (one line saying the bound)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise OptionError(f"{option} must be a whole number in [0, 2**63 - 1] (a 64-bit seed), got {seed!r}")


def derived_seed(seed: int, n: int) -> int:
    """The seed of item `n` (a prompt, a batch) of a run seeded with `seed`: distinct per item, inside [0, MAX_SEED]."""
    return (seed * 1_000_003 + n) % (MAX_SEED + 1)


def cli_fields(cls: type) -> Iterator[dataclasses.Field]:
    """The fields of a settings dataclass that a command offers (declared with `setting(...)`, not `cli=False`)."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli", False):
            yield f


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def numbers(text: str, cast: type = float) -> list:
    """'1,0.8,0.64' -> [1.0, 0.8, 0.64]; ValueError names what was expected (the CLI adds the option)."""
    try:
        return [cast(x) for x in text.split(",")]
    except ValueError:
        what = "whole numbers" if cast is int else "numbers"
        raise ValueError(f"expected {what} separated by commas, got {text!r}") from None


def floats(text: str) -> list[float]:
    return numbers(text, float)


def ints(text: str) -> list[int]:
    return numbers(text, int)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the frozen target runs, in `distill` (its online target) and `evaluate` alike; the draft follows it."""

    device: str | None = setting(None, "cpu, cuda, cuda:N (default: cuda when available).")
    dtype: str | None = setting(
        None,
        "dtype the target is loaded and run in (default: float32; --engine vllm: the checkpoint's own):",
        choices="dtypes",
    )
    device_map: str | None = setting(
        None,
        "Spread the target over the local GPUs as transformers' device_map does (e.g. auto); overrides --device.",
    )
    tensor_parallel_size: int | None = setting(None, "--engine vllm: GPUs the target is split across (default 1).")

    def __post_init__(self) -> None:
        from mtp2draft.dtypes import DTYPE_NAMES

        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise OptionError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.tensor_parallel_size is not None and self.tensor_parallel_size < 1:
            raise OptionError(f"--tensor-parallel-size must be at least 1, got {self.tensor_parallel_size}")

    @property
    def torch_dtype(self) -> str:
        """The dtype transformers runs the target in: float32 unless told."""
        return self.dtype or "float32"


@dataclass(frozen=True, kw_only=True)
class HubAccess:
    """How a command reaches the Hub for the repo it was given: which revision, with which credential. The token is
    never printed or written (`redact`)."""

    revision: str | None = setting(None, "Hub branch, tag or commit.")
    token: str | None = setting(None, "Hub token (default: HF_TOKEN or `hf auth login`).")


@dataclass(frozen=True, kw_only=True)
class DumpConfig:
    """What `dump-hidden` stores of the target besides each sequence's tokens and final hidden, and how it shards
    them (checked against the target by `target.dump_checks`)."""

    aux_layers: list[int] | None = setting(None, "Aux layer ids 'low,mid,high'.", parse=ints)
    top_k: int = setting(64, "Target log-probs kept per position.")
    shard_size: int = setting(256, "Sequences per shard file.")
    final: str | None = setting(
        None, "the final hidden a native draft reads (pre_norm | post_norm), taken from --draft's config", cli=False
    )


@dataclass(frozen=True, kw_only=True)
class ConvertConfig:
    """What `convert` makes of a checkpoint's MTP layer, besides where it reads and writes. Checked on construction;
    the checks that need the checkpoint (layer range, EAGLE-3 depth) are `conversion.check_conversion`'s."""

    to: str | None = setting(
        None, "Draft kind (default: mtp where an engine serves it natively, else eagle3):", choices="kinds"
    )
    layer: int | None = setting(None, "MTP layer index (default 0).")
    all_layers: bool = setting(
        False, "Every MTP layer the checkpoint ships, as one chain draft (layer i at step i; native only)."
    )
    dtype: str | None = setting(
        None,
        "Weights dtype of the draft (default: bfloat16, and a tensor the checkpoint stores in float32 stays float32; "
        "named, every floating tensor but router buffers):",
        choices="dtypes",
    )
    aux_layers: list[int] | None = setting(
        None, "eagle3: three target layer ids 'low,mid,high' (output of).", parse=ints
    )

    def __post_init__(self) -> None:
        from mtp2draft.dtypes import DTYPE_NAMES
        from mtp2draft.kinds import DRAFT_KINDS, DraftKind

        if self.to is not None and self.to not in DRAFT_KINDS:
            raise OptionError(f"--to must be one of {', '.join(DRAFT_KINDS)}, got {self.to!r}")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise OptionError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.aux_layers and self.to not in (None, DraftKind.EAGLE3):
            raise OptionError(
                f"--aux-layers applies to --to eagle3 (a {self.to} draft reads the target's final hidden)"
            )
        if self.all_layers and self.to not in (None, DraftKind.MTP):
            raise OptionError("--all-layers writes a native chain draft (--to mtp): an EAGLE-3 draft has one layer")
        if self.all_layers and self.layer is not None:
            raise OptionError("--layer and --all-layers exclude each other (--all-layers takes every MTP layer)")

    @property
    def draft_dtype(self) -> str:
        """The draft's weights dtype: bfloat16 unless named (unnamed, a tensor stored in float32 stays float32)."""
        return self.dtype or "bfloat16"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What `run` chains the stages on, besides each stage's own settings: its inputs, where it works, and what it
    publishes."""

    work: Path = setting(help="Work directory: every stage's output is kept here.")
    training: Any = setting(None, "distill's `TrainingData` (the CLI builds it from its own options)", cli=False)
    eval_data: Path | None = setting(
        None, "Held-out prompts for evaluation, apart from --heldout (default: the first 20 prompts of --data)."
    )
    target: str | None = setting(None, "Target to distill against and evaluate with (default: SOURCE).")
    target_revision: str | None = setting(None, "Hub branch, tag or commit of --target (default: main).")
    # checked by run's pre-flight (formats.check_format), which knows the draft kind it must take
    format: str | None = setting(
        None, "Export format (default: from the family's engine support table):", choices="formats"
    )
    push: str | None = setting(None, "Hub repo id to publish the export to.")
    private: bool = setting(False, "With --push: create a private repo.")
    overwrite: bool = setting(False, "Replace a non-empty --work.")
