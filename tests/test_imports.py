"""The package's import graph: no cycle (module-level or function-local imports), nothing imports the package root,
and the CLI's help, `specs` and `inspect --help` run without importing torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtp2draft"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module -> package modules it imports anywhere in its body (`from . import x` of a submodule counts as x)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from pkg import sub` imports the submodule sub; `from pkg import name` imports pkg
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walker_sees_local_and_relative_imports() -> None:
    graph = import_graph()
    assert "mtp2draft.errors" in graph["mtp2draft.family.spec"]  # module level, relative
    assert "mtp2draft.conversion" in graph["mtp2draft.cli.conversion"]  # function-local, relative
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_import_graph_is_acyclic() -> None:
    assert _cycle(import_graph()) is None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto mtp2draft's concept packages (`mtp2draft.train.ttt` -> `mtp2draft.train`);
    top-level modules stay themselves."""

    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for module, edges in graph.items():
        folded.setdefault(unit(module), set()).update(unit(e) for e in edges if unit(e) != unit(module))
    return folded


def test_no_import_cycle_between_packages() -> None:
    """A package may import the packages below it, never one that imports it back (e.g. draft -> family only)."""
    assert package_graph({"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set()}) == {"p.a": {"p.b"}, "p.b": {"p.a"}}
    assert _cycle(package_graph(import_graph())) is None


# Stages that run side by side share what both need through a package below them (the charts: `formats.charts`);
# neither imports the other, so either can change without the other's tests.
SIBLINGS = (("mtp2draft.train", "mtp2draft.evaluation"),)


def sibling_imports(folded: dict[str, set[str]]) -> list[tuple[str, str]]:
    return [(a, b) for x, y in SIBLINGS for a, b in ((x, y), (y, x)) if b in folded.get(a, set())]


def test_sibling_stages_import_neither_other() -> None:
    assert sibling_imports({"mtp2draft.train": {"mtp2draft.evaluation"}}) == [
        ("mtp2draft.train", "mtp2draft.evaluation")
    ]
    assert sibling_imports(package_graph(import_graph())) == []


def test_modules_belong_to_packages() -> None:
    """At most a handful of top-level modules beside the concept packages (issue 16: ~8 plus the package's own)."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "_version"))
    assert len(top) <= 10, top


def test_no_module_imports_the_package_root() -> None:
    """`from . import __version__` through __init__ would load every stage; modules import `_version` instead."""
    importers = sorted(m for m, edges in import_graph().items() if "mtp2draft" in edges and m != "mtp2draft.__main__")
    assert importers == []


def test_the_package_root_exports_its_api_lazily() -> None:
    code = (
        "import sys, mtp2draft\n"
        "assert 'torch' not in sys.modules\n"
        "assert set(mtp2draft.__all__) == {'__version__', *mtp2draft._LAZY}\n"
        "import mtp2draft.conversion, mtp2draft.formats.export\n"  # submodule imports must not shadow the stage functions
        "from mtp2draft import convert, export, DistillConfig, __version__\n"
        "assert callable(convert) and convert is mtp2draft.convert and convert.__module__ == 'mtp2draft.conversion'\n"
        "assert export.__module__ == 'mtp2draft.formats.export' and isinstance(DistillConfig, type)\n"
        "assert __version__ == mtp2draft._version.__version__\n"
        "print(sorted(n for n in mtp2draft.__all__ if getattr(mtp2draft, n) is None))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


WRAPPER = """
import runpy, sys
sys.argv = ["mtp2draft", *sys.argv[1:]]
try:
    runpy.run_module("mtp2draft", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("TORCH_LOADED=" + str("torch" in sys.modules), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("argv", [["--help"], ["specs"], ["specs", "--json"], ["inspect", "--help"]])
def test_cli_help_specs_and_inspect_help_do_not_import_torch(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the command did print its help / its table
    assert "TORCH_LOADED=False" in done.stderr, done.stderr[-2000:]


def test_torch_free_modules_do_not_import_torch() -> None:
    code = (
        "import sys, mtp2draft.family.spec, mtp2draft.kinds, mtp2draft.formats, mtp2draft.draft.eagle3_config, "
        "mtp2draft.train.subsets, mtp2draft; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
