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
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", readme, flags=re.M))
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
