"""The root command group every command module registers on (`app`) and the reporter long work writes progress
to (`log`: stderr, so stdout stays data).

What this module does not do: define commands (one module per command group: `conversion`, `train`, `evaluation`,
`target`, `publish`, `pipeline`) or turn errors into exit codes (`app.main`).
"""

from __future__ import annotations

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
