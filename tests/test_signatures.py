"""How the library's functions take what they are asked to do: records whole, not long lists of loose settings.

A function with many parameters is usually a record flattened on its way down (`DistillJob` replaced fifteen
keywords of `distill`); the CLI may take many options, the library takes their records. The public stage functions
speak one dialect: the Hub's revision and token travel as `HubAccess`, the target's placement as `Placement`.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import mtp2draft

PACKAGE = Path(__file__).resolve().parents[1] / "mtp2draft"
MOST = 8  # parameters a library function may take (self and cls not counted)
# the packages a stage's work runs through: none of their functions may take more than MOST
STAGE_PATHS = ("conversion", "train", "evaluation", "formats", "pipeline", "target", "draft", "checkpoint", "hub")


def long_signatures(source: str) -> list[tuple[str, int]]:
    """(function name, parameter count) of each function in `source` taking more than MOST parameters; *args and
    **kwargs count one each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None]
            count = len([n for n in names if n not in ("self", "cls")])
            if count > MOST:
                found.append((node.name, count))
    return found


def _library() -> dict[str, list[tuple[str, int]]]:
    """module path (relative to the package) -> its long signatures, outside the CLI."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] != "cli" and (long := long_signatures(path.read_text())):
            found[rel.as_posix()] = long
    return found


def test_the_scan_counts_every_kind_of_parameter() -> None:
    planted = "class A:\n    def f(self, a, b, /, c, d=1, *e, f, g, i, **h): ...\n    def g(self, a, b, c, d, e, f, g, h): ...\n"
    assert long_signatures(planted) == [("f", 9)]


def test_few_library_functions_take_many_parameters_and_none_on_a_stage_path() -> None:
    found = _library()
    assert sum(len(v) for v in found.values()) <= 4, found
    on_stage = {m: v for m, v in found.items() if m.split("/")[0].removesuffix(".py") in STAGE_PATHS}
    assert not on_stage, f"a stage's path takes loose settings (pass its record whole): {on_stage}"


def test_the_public_functions_take_hub_access_and_placement_as_records() -> None:
    # (a `dtype` of the draft's own weights is a setting of its own, not the target's placement)
    loose = {"revision", "token", "device", "device_map", "torch_dtype", "target_dtype"}
    for name in mtp2draft.__all__:
        value = getattr(mtp2draft, name)
        if inspect.isfunction(value):
            assert not loose & set(inspect.signature(value).parameters), f"mtp2draft.{name} takes loose settings"
