"""The four hostile-case tables (tests/test_bad_inputs.py, test_bad_commands.py, test_bad_dumps.py, test_mistakes.py),
counted per command for the README's Safety section. A case's command is read from its source: the command its `Case(...)`
runs, named as a list literal (`["push", ...]`) or by the table's argv helper (`_convert(`, `_distill(`, ...)."""

from __future__ import annotations

import collections
import inspect
import re
from collections.abc import Callable, Mapping


def _commands() -> tuple[str, ...]:
    """The CLI's commands, as its app registers them (a command added later is in the tables' count at once)."""
    import typer.main

    from mtp2draft.cli.app import app

    return tuple(typer.main.get_command(app).commands)


COMMANDS = _commands()
_NAMED = re.compile(r'\[\s*"([a-z][a-z-]*)"|_(convert|distill|evaluate|dump_hidden)\(')


def command_of(name: str, fn: Callable) -> str:
    """The command case `name` runs; "(none)" for a command line that names no command mtp2draft has. Cases made
    in a loop (one source for many) are named after their command: `validate_...`, `dump_...`."""
    source = inspect.getsource(fn)
    head, _, tail = source.partition("return Case(")
    found = _NAMED.search(tail) or ([*_NAMED.finditer(head)] or [None])[-1]
    if found is not None:
        command = (found.group(1) or found.group(2)).replace("_", "-")
        return command if command in COMMANDS else "(none)"
    prefix = name.split("_", 1)[0].replace("dump", "dump-hidden")
    if prefix not in COMMANDS:
        raise AssertionError(f"{name}: cannot tell which command it runs")
    return prefix


def counts(cases: Mapping[str, Callable]) -> dict[str, int]:
    return dict(collections.Counter(command_of(name, fn) for name, fn in cases.items()))


def table() -> dict[str, dict[str, int]]:
    """{command: {table file: cases}} over the four tables."""
    import test_bad_commands
    import test_bad_dumps
    import test_bad_inputs
    import test_mistakes

    tables = {"inputs": test_bad_inputs, "commands": test_bad_commands, "dumps": test_bad_dumps}
    tables["mistakes"] = test_mistakes
    rows: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for column, module in tables.items():
        for command, n in counts(module.CASES).items():
            rows[command][column] = n
    return dict(rows)
