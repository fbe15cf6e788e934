"""The root command group every command module registers on (`app`), the reporter long work writes progress to
(`log`: stderr, so stdout stays data) and the parsers of option values that several commands share.

What this module does not do: define commands (one module per command group: `conversion`, `train`, `evaluation`,
`target`, `publish`, `pipeline`) or turn errors into exit codes (`app.main`).
"""

from __future__ import annotations

from typing import Any

import typer

from mtp2draft.cli.progress import Reporter

app = typer.Typer(
    name="mtp2draft",
    help="Turn the MTP layer shipped in LLM checkpoints into a speculative-decoding draft model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


log = Reporter()  # progress and logs: stderr (bars on a terminal), so stdout stays data


def number_list(text: str | None, option: str, cast: type = float) -> list | None:
    """'1,0.8,0.64' -> [1.0, 0.8, 0.64] (cast: float or int); a malformed list is a usage error naming the option."""
    if not text:
        return None
    try:
        return [cast(x) for x in text.split(",")]
    except ValueError:
        what = "whole numbers" if cast is int else "numbers"
        raise typer.BadParameter(f"expected {what} separated by commas, got {text!r}", param_hint=option) from None


def distill_config(ctx: typer.Context) -> Any:
    """The DistillConfig of a command's parsed options: every option named like one of its fields, with
    `--step-weights` parsed to numbers; what a command lacks keeps the config's default."""
    from mtp2draft.train.settings import DistillConfig

    params = dict(ctx.params)
    if "step_weights" in params:
        params["step_weights"] = number_list(params["step_weights"], "--step-weights")
    return DistillConfig.from_options(params)
