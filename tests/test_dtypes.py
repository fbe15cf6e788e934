"""The dtype names have one home, `mtp2draft/dtypes.py`: no other module of the package writes a table of them, and its
name tables load without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from mtp2draft import dtypes

PACKAGE = Path(__file__).resolve().parents[1] / "mtp2draft"
# Every name a dtype table could be keyed by: safetensors and torch spellings, and the configs' `fp8`.
KNOWN = {*dtypes.ST_TORCH_NAMES, *dtypes.ST_TORCH_NAMES.values(), *dtypes.CONFIG_DTYPE_BYTES}


def _is_torch_dtype(node: ast.AST) -> bool:
    """`torch.bfloat16`, or `getattr(torch, name)`."""
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr in KNOWN
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and bool(node.args)
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "torch"
    )


def _entries(node: ast.AST) -> list[ast.AST]:
    """What a collection literal or comprehension is keyed by: a dict's keys and values, a sequence's elements."""
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None] + list(node.values)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return list(node.elts)
    if isinstance(node, ast.DictComp):
        return [node.key, node.value]
    if isinstance(node, (ast.ListComp, ast.SetComp)):
        return [node.elt]
    return []


def dtype_tables(source: str) -> list[int]:
    """Lines of assignments whose value is a table of dtypes: at least two dtype names as keys or elements (string
    constants), or any torch dtype (`torch.bfloat16`) in one. Dict values that are names are not keys: a record's
    field -> dtype schema (`RECORD_DTYPES`) is not a table of dtypes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        entries = _entries(value)
        if isinstance(value, ast.Dict):
            entries = [k for k in value.keys if k is not None] + [v for v in value.values if _is_torch_dtype(v)]
        names = [e for e in entries if isinstance(e, ast.Constant) and e.value in KNOWN]
        torch_dtypes = [n for e in entries for n in ast.walk(e) if _is_torch_dtype(n)]
        if len(names) >= 2 or torch_dtypes:
            found.append(node.lineno)
    return found


def test_the_scan_finds_dtype_tables() -> None:
    planted = [
        '_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}',
        'FLOATS = ("BF16", "F16", "F32")',
        'BYTES: dict = {"float32": 4, "bfloat16": 2}',
        "T = {name: getattr(torch, name) for name in NAMES}",
        'PACKED = ("U8", "I8")',
    ]
    assert [bool(dtype_tables(line)) for line in planted] == [True] * len(planted)
    allowed = ['RECORD = {"input_ids": "I64", "final": "F32"}', 'x = cfg.get("torch_dtype") or "bfloat16"']
    assert [dtype_tables(line) for line in allowed] == [[], []]


def test_no_module_but_dtypes_writes_a_dtype_table() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "dtypes.py" or path.parent != PACKAGE
        if (lines := dtype_tables(path.read_text()))
    }
    assert offenders == {}, "dtype tables belong in mtp2draft/dtypes.py"


def test_the_name_tables_load_without_torch_and_the_torch_tables_agree() -> None:
    code = "import sys; from mtp2draft.dtypes import DTYPE_NAMES; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
    import torch

    assert {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32} == dtypes.TORCH_DTYPES
    assert dtypes.ST_DTYPES["BF16"] == (torch.bfloat16, 2) and dtypes.TORCH_TO_ST[torch.int64] == "I64"
    assert set(dtypes.ST_FLOATS) >= set(dtypes.ST_LINEAR_FLOATS) and set(dtypes.ST_NOT_F32) <= set(dtypes.ST_FLOATS)
