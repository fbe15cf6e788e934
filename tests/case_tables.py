"""The four hostile-case tables (tests/test_bad_inputs.py, test_bad_commands.py, test_bad_dumps.py,
test_mistakes.py), counted per command for docs/safety.md. A case's command is read from its source: the command its `Case(...)` runs, named as a
list literal (`["push", ...]`) or by the table's argv helper (`_convert(`, `_distill(`, ...).

`PYTHONPATH=tests python -m case_tables` prints the page's table with today's counts (the descriptions are the
page's own); `--write` puts it into docs/safety.md. What it does not do: describe a command's cases (a command
new to the tables gets a row with an empty description, which tests/test_safety.py refuses until one is written)."""

from __future__ import annotations

import collections
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "safety.md"
COLUMNS = ("inputs", "commands", "dumps", "mistakes")
START = "<!-- case table:"
END = "<!-- end of case table -->"
HEADER = (
    "| command | what is refused in one line, with nothing written | inputs | commands | dumps | mistakes | all |\n"
    "| --- | --- | --- | --- | --- | --- | --- |"
)
_ROW = re.compile(r"^\| (`[a-z-]+`|\(no command\)) \| (.*?) \|(?: [^|]* \|){4,5}$")


def _commands() -> tuple[str, ...]:
    """The CLI's commands, as its app registers them (a command added later is in the tables' count at once)."""
    import typer.main

    from mtp2draft.cli.app import app

    return tuple(typer.main.get_command(app).commands)


COMMANDS = _commands()
_NAMED = re.compile(r'\[\s*"([a-z][a-z-]*)"|_(convert|distill|evaluate|dump_hidden)\(')


def command_of(name: str, fn: Callable) -> str:
    """The command case `name` runs; "(none)" for a command line that names no command mtp2draft has. Cases made
    in a loop (one source for many) are named after their command (`validate_...`, `dump_...`) or carry it as
    `fn.command` where the row decides it."""
    if (command := getattr(fn, "command", None)) is not None:
        return command
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


def _label(command: str) -> str:
    return "(no command)" if command == "(none)" else f"`{command}`"


def table_block(text: str) -> str:
    """The page's table: the lines between the START comment and END, both excluded."""
    head, found, rest = text.partition(START)
    if not found or END not in rest:
        raise AssertionError(f"{PAGE.name} has no case table between {START!r} and {END!r}")
    return rest.split("\n", 1)[1].split(END, 1)[0].strip()


def descriptions(block: str) -> dict[str, str]:
    """{command: description} of the page's rows, in the page's order."""
    found = {}
    for line in block.splitlines():
        if m := _ROW.match(line):
            found[m.group(1).strip("`").replace("(no command)", "(none)")] = m.group(2).strip()
    return found


def render(described: Mapping[str, str], rows: Mapping[str, Mapping[str, int]]) -> str:
    """The table for `rows` ({command: {column: cases}}): the page's rows in the page's order, then commands new to
    the tables in the CLI's order, the unknown command last, then the column sums."""
    order = [c for c in described if c in rows and c != "(none)"]
    order += [c for c in COMMANDS if c in rows and c not in order]
    order += [c for c in rows if c not in order and c != "(none)"] + (["(none)"] if "(none)" in rows else [])
    lines = [HEADER]
    sums = [0] * (len(COLUMNS) + 1)
    for command in order:
        n = [rows[command].get(column, 0) for column in COLUMNS]
        n.append(sum(n))
        sums = [a + b for a, b in zip(sums, n, strict=True)]
        lines.append(f"| {_label(command)} | {described.get(command, '')} | " + " | ".join(map(str, n)) + " |")
    lines.append("| all | | " + " | ".join(map(str, sums)) + " |")
    return "\n".join(lines)


def expected_block(text: str) -> str:
    """The page's table as today's hostile-case tables count it."""
    return render(descriptions(table_block(text)), table())


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    block = expected_block(text)
    if "--write" not in argv:
        print(block)
        return 0
    old = table_block(text)
    PAGE.write_text(text.replace(old, block, 1))
    print(f"{PAGE}: {'unchanged' if old == block else 'case table rewritten'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
