"""Sizes a reader can hold (issue 16): no module under mtp2draft/ over 600 lines, no function over 80 (its `def` line
through its last line, docstring included; nested functions count on their own and inside their parent)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mtp2draft"
MODULE_LINES, FUNCTION_LINES = 600, 80


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def function_lengths(source: str) -> dict[str, int]:
    """qualified name (`Class.method`, `outer.inner`) -> lines from its `def` to its end, of every function."""
    lengths: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                name += "."
            walk(child, name)

    walk(ast.parse(source), "")
    return lengths


def test_the_measure_counts_methods_and_nested_functions() -> None:
    source = "class A:\n    def f(self):\n        def g():\n            return 1\n        return g\n\n\ndef h(): pass\n"
    assert function_lengths(source) == {"A.f": 4, "A.f.g": 2, "h": 1}


def test_the_package_walk_sees_every_module() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {"cli/app.py", "train/recipe.py", "evaluation/decode.py"} <= names


def test_no_module_is_over_600_lines() -> None:
    long = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {
        f"{p.relative_to(PACKAGE).as_posix()}:{name}": n
        for p in _modules()
        for name, n in function_lengths(p.read_text()).items()
        if n > FUNCTION_LINES
    }
    assert long == {}
