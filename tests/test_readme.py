"""The README's promises: the two quick-start commands exist and CI calls the test one; every spec is listed."""

from __future__ import annotations

import re
from pathlib import Path

from mtp2draft.family.spec import registry

ROOT = Path(__file__).resolve().parents[1]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    for cmd in commands:
        assert (ROOT / cmd).is_file() and (ROOT / cmd).stat().st_mode & 0o111
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_readme_lists_every_spec() -> None:
    families = (ROOT / "README.md").read_text().split("## Supported families", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", families, flags=re.M))
    assert listed == set(registry())


def test_the_fast_subset_the_readme_names_keeps_the_engine_tests_out() -> None:
    """A later `-m` replaces pyproject's `-m 'not engine'`, so the fast subset must exclude engine itself; and the
    markers it names are registered (an unknown marker would select nothing and pass)."""
    readme = (ROOT / "README.md").read_text()
    expression = re.search(r'`scripts/test\.sh -m "([^"]+)"`', readme)
    assert expression is not None, "the README no longer says how to run the fast subset"
    assert {"not slow", "not engine"} <= {part.strip() for part in expression.group(1).split(" and ")}
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"slow: ' in pyproject and '"engine: ' in pyproject and "addopts = \"-ra -m 'not engine'\"" in pyproject


def _prose(markdown: str) -> str:
    """The README's running text: code blocks, tables, headings and inline code left out."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("|", "#"))]
    return re.sub(r"`[^`]*`", "x", " ".join(lines))


def sentence_lengths(markdown: str) -> list[int]:
    """Words per prose sentence (a sentence ends at . ! ? or : before a space, or at the end)."""
    sentences = re.split(r"(?<=[.!?:])\s+", _prose(markdown))
    return [len(s.split()) for s in sentences if len(s.split()) > 1]


def test_the_measure_of_sentences_counts_words_per_sentence() -> None:
    assert sentence_lengths(
        "# T\n\nOne two three. Four five!\n\n| a | b |\n\n```bash\nx y z\n```\nSix `seven eight` nine."
    ) == [
        3,
        2,
        3,
    ]


def test_readme_is_short_and_its_sentences_are_short() -> None:
    readme = (ROOT / "README.md").read_text()
    lengths = sorted(sentence_lengths(readme))
    assert len(readme.splitlines()) <= 170
    assert lengths[len(lengths) // 2] <= 20, lengths[-10:]


def _readme_commands() -> list[list[str]]:
    """Every `mtp2draft ...` line of the README's bash blocks (continuations joined, comments dropped), split."""
    import shlex

    readme = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line.split("#")[0])
            if words[:1] == ["mtp2draft"]:
                commands.append(words[1:])
    return commands


def test_every_mtp2draft_command_in_the_readme_parses() -> None:
    """Each command the README shows names a real command, and its options and arguments parse as that command's
    own (types, choices, required options): what a reader copies is a command mtp2draft takes."""
    import click
    import typer.main

    from mtp2draft.cli.app import app

    commands = _readme_commands()
    assert {c[0] for c in commands} >= {"inspect", "run", "engine"}
    for words in commands:
        group, rest = typer.main.get_command(app), list(words)
        while isinstance(group, click.Group):
            command = group.get_command(click.Context(group), rest[0])
            assert command is not None, words
            group, rest = command, rest[1:]
        group.make_context(words[0], rest)  # raises a UsageError on an unknown option or a bad value
