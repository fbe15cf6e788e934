#!/usr/bin/env python3
"""Write the command-line flags of `python -m sglang.launch_server` as SGLang's wheel declares them, to the JSON
that tests/test_sglang_args.py builds an argparse parser from (every SGLang launch line mtp2draft prints is parsed
by it), read from the wheel without importing or running any of its code (`ast` over the zip's sources).

Usage, for a new SGLang release (then update SGLANG in tests/test_sglang_args.py and rerun it):

    pip download --no-deps sglang==0.5.23 -d DIR
    python scripts/engine_args.py DIR/sglang-0.5.23-*.whl

It writes tests/data/engines/sglang-<version>-server-args.json (`--out` to write elsewhere): a list of flags, each
with its option strings, the type argparse converts its value with (`str`, `int`, `float`, `bool` for a flag that
takes no value, `json` for json.loads, another parser's name where SGLang passes its own function: the test takes
those as strings), `choices`, `action` (`store`, `store_true`, `boolean_optional`, or the name of an SGLang action
class), and `nargs` and `required: true` where set; and, under `later`, the values SGLang checks after parsing
where argparse checks none (the speculative algorithm's names).

Where the flags come from, in sglang 0.5.23 (PyPI): sglang/srt/server_args.py (`ServerArgs.add_cli_args`: every
annotated field of the classes in `_INPUT_NAMESPACES`, by the rules of `add_cli_args_from_dataclass` in
sglang/srt/arg_groups/arg_utils.py, then the explicit `parser.add_argument` calls), the field classes under
sglang/srt/arg_groups/fields/, their choice lists in sglang/srt/arg_groups/choices.py, and the speculative
algorithms in sglang/srt/speculative/spec_info.py (`SpeculativeAlgorithm.from_string`).

What it cannot see: choices computed when SGLang runs (from an environment variable, a registry plugins extend, a
class attribute): those flags get `choices: null`, so the test checks their type only. Nor does it see what a plugin
(`sglang.srt.plugins`) adds: a flag, or a choice a plugin appends to a list of choices.py (`add_*_choices`), where
the JSON has the list as the wheel states it; or the checks SGLang makes after parsing besides the algorithm's name.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER_ARGS = "sglang/srt/server_args.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
TYPES = {"str", "int", "float"}  # arg_utils._infer_type_func: any other annotation is parsed as a string
PARSERS = {"loads": "json"}  # a type_parser argparse would call: json.loads is checked, the others taken as str


class Dynamic(Exception):
    """A value the source does not state: computed when SGLang runs."""


class Wheel:
    """The wheel's Python sources, parsed on demand, and the module-level constants they state."""

    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.trees: dict[str, ast.Module] = {}

    def tree(self, file: str) -> ast.Module:
        if file not in self.trees:
            self.trees[file] = ast.parse(self.zip.read(file).decode(), file)
        return self.trees[file]

    def imports(self, file: str) -> dict[str, str]:
        """name -> the file of the module `file` imports it from (`from sglang.x import name` only)."""
        out = {}
        for node in self.tree(file).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang."):
                for alias in node.names:
                    out[alias.asname or alias.name] = node.module.replace(".", "/") + ".py"
        return out

    def value(self, node: ast.expr, file: str) -> Any:
        """The value of a constant expression in `file` (literals, module constants, `+`, set/list of one); raises
        Dynamic for anything else."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return [self.value(e, file) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left, file) + self.value(node.right, file)
        collections = ("set", "frozenset", "list", "tuple", "sorted")
        if isinstance(node, ast.Call) and _name(node.func) in collections and len(node.args) == 1 and not node.keywords:
            return list(self.value(node.args[0], file))
        if isinstance(node, ast.Name):
            return self.constant(node.id, file)
        raise Dynamic(ast.unparse(node))

    def constant(self, name: str, file: str) -> Any:
        for node in self.tree(file).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                return self.value(node.value, file)
        source = self.imports(file).get(name)
        if source in self.zip.namelist():
            return self.constant(name, source)
        raise Dynamic(name)


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _name(node: ast.expr | None) -> str | None:
    """`str` for a Name, `BooleanOptionalAction` for `argparse.BooleanOptionalAction`, `loads` for `json.loads`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """X from Optional[X], Union[X, None] and X | None (arg_utils._unwrap_optional); anything else unchanged."""
    if isinstance(node, ast.Subscript) and _name(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.Subscript) and _name(node.value) == "Union" and isinstance(node.slice, ast.Tuple):
        rest = [e for e in node.slice.elts if not (isinstance(e, ast.Constant) and e.value is None)]
        return rest[0] if len(rest) == 1 else node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return sides[0] if len(sides) == 1 else node
    return node


def _choices(node: ast.expr | None, wheel: Wheel, file: str) -> list | None:
    if node is None:
        return None
    try:
        return wheel.value(node, file)
    except Dynamic:
        return None


def _flag(
    names: list[str], kind: str, choices: Any = None, action: str = "store", nargs: Any = None, required: bool = False
) -> dict:
    """One flag as the JSON records it; `nargs` and `required` only where set, to keep the file short."""
    flag = {"flags": names, "type": kind, "choices": choices, "action": action}
    return flag | ({"nargs": nargs} if nargs is not None else {}) | ({"required": True} if required else {})


def field_flag(field: ast.AnnAssign, wheel: Wheel, file: str) -> dict | None:
    """The flag `add_cli_args_from_dataclass` registers for one `name: A[T, "help" | Arg(...)] = default` field, or
    None where it registers none (no `A[...]` metadata, `no_cli=True`)."""
    ann = field.annotation
    if not (
        isinstance(ann, ast.Subscript) and _name(ann.value) in ("A", "Annotated") and isinstance(ann.slice, ast.Tuple)
    ):
        return None
    raw, *meta = ann.slice.elts
    arg = next((m for m in meta if isinstance(m, ast.Call) and _name(m.func) == "Arg"), None)
    if arg is None and not any(isinstance(m, ast.Constant) and isinstance(m.value, str) for m in meta):
        return None
    kw = _keywords(arg) if arg is not None else {}
    if "no_cli" in kw and wheel.value(kw["no_cli"], file):
        return None
    cli = wheel.value(kw["cli_name"], file) if "cli_name" in kw else "--" + field.target.id.replace("_", "-")
    names = [cli, *(wheel.value(kw["aliases"], file) if "aliases" in kw else [])]
    parser = _name(kw.get("type_parser"))
    parsed = PARSERS.get(parser or "", parser)
    nargs = wheel.value(kw["nargs"], file) if "nargs" in kw else None
    if "action" in kw:
        action = _name(kw["action"])
        extra = _dict_items(kw.get("action_kwargs"), wheel, file)
        if action == "BooleanOptionalAction":
            return _flag(names, "bool", action="boolean_optional")
        return _flag(names, _name(extra.get("type")) or "str", action=action, nargs=_const(extra.get("nargs")))
    inner = _unwrap_optional(raw)
    if isinstance(inner, ast.Subscript) and _name(inner.value) == "Literal":
        values = wheel.value(inner.slice, file)
        values = values if isinstance(values, list) else [values]
        choices = _choices(kw.get("choices"), wheel, file) if "choices" in kw else values
        first = type(values[0]).__name__  # Literal[None, ...] is parsed as str, as any type outside TYPES
        return _flag(names, parsed or (first if first in TYPES else "str"), choices)
    if isinstance(inner, ast.Subscript) and _name(inner.value) in ("List", "list") and parser is None:
        elem = _name(inner.slice)
        return _flag(
            names, elem if elem in TYPES else "str", _choices(kw.get("choices"), wheel, file), nargs=nargs or "+"
        )
    if _name(inner) == "bool":
        return _flag(names, "bool", action="store_true")
    kind = parsed or (_name(inner) if _name(inner) in TYPES else "str")
    required = kw.get("required")
    needed = wheel.value(required, file) if required is not None else None
    return _flag(
        names,
        kind,
        _choices(kw.get("choices"), wheel, file),
        nargs=nargs,
        required=needed is True or (needed is None and field.value is None),
    )


def _dict_items(node: ast.expr | None, wheel: Wheel, file: str) -> dict[str, ast.expr]:
    """An `action_kwargs={...}` literal: key -> its value's expression."""
    if not isinstance(node, ast.Dict):
        return {}
    return {wheel.value(k, file): v for k, v in zip(node.keys, node.values, strict=True)}


def _const(node: ast.expr | None) -> Any:
    return node.value if isinstance(node, ast.Constant) else None


def explicit_flag(call: ast.Call, wheel: Wheel, file: str) -> dict:
    """A `parser.add_argument(...)` call of `ServerArgs.add_cli_args`."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant)]
    kw = _keywords(call)
    action = kw.get("action")
    if action is not None:
        action_name = _const(action) or _name(action)
        nargs = (
            kw["nargs"] if "nargs" in kw else ast.Constant(0)
        )  # SGLang's Deprecated* actions take no value by default
        value = _const(nargs) if isinstance(nargs, ast.Constant) else None
        kind = "bool" if value == 0 or action_name == "store_true" else "str"
        return _flag(
            names, kind, _choices(kw.get("choices"), wheel, file), action_name, None if kind == "bool" else value
        )
    kind = _name(kw.get("type")) or "str"
    return _flag(
        names, PARSERS.get(kind, kind), _choices(kw.get("choices"), wheel, file), nargs=_const(kw.get("nargs"))
    )


def server_flags(wheel: Wheel) -> list[dict]:
    """Every flag of `ServerArgs.add_cli_args`, in registration order."""
    tree, imports = wheel.tree(SERVER_ARGS), wheel.imports(SERVER_ARGS)
    spaces = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and _name(n.targets[0]) == "_INPUT_NAMESPACES"
    )
    flags = []
    for space in spaces.elts:
        file = imports[space.id]
        cls = next(n for n in wheel.tree(file).body if isinstance(n, ast.ClassDef) and n.name == space.id)
        for field in cls.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                flag = field_flag(field, wheel, file)
                flags += [flag] if flag else []
    server = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    add = next(n for n in server.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    for node in ast.walk(add):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags.append(explicit_flag(node, wheel, SERVER_ARGS))
    return flags


def algorithms(wheel: Wheel) -> list[str]:
    """The names `SpeculativeAlgorithm.from_string` takes (upper-cased): the enum's members and the reserved aliases
    it maps to EAGLE; plugins may register more."""
    tree = wheel.tree(SPEC_INFO)
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    names = [t.id for n in enum.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    source = wheel.imports(SPEC_INFO).get("_RESERVED_ALIASES")
    aliases = wheel.constant("_RESERVED_ALIASES", source) if source else []
    return names + sorted(aliases)


def version(path: Path) -> str:
    found = re.match(r"sglang-([^-]+)-", path.name)
    if not found:
        raise SystemExit(f"{path.name} is not an sglang wheel")
    return found.group(1)


def write(flags: list[dict], later: dict, out: Path) -> None:
    """One flag a line, so a new release's diff reads flag by flag."""
    out.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join("    " + json.dumps(f) for f in flags)
    out.write_text(f'{{\n  "later": {json.dumps(later)},\n  "flags": [\n{body}\n  ]\n}}\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="sglang-<version>-*.whl (pip download --no-deps sglang==<version>)")
    parser.add_argument("--out", type=Path, help="default: tests/data/engines/sglang-<version>-server-args.json")
    args = parser.parse_args()
    wheel = Wheel(args.wheel)
    out = args.out or ROOT / "tests" / "data" / "engines" / f"sglang-{version(args.wheel)}-server-args.json"
    later = {"--speculative-algorithm": {"values": algorithms(wheel), "where": f"{SPEC_INFO} from_string"}}
    flags = server_flags(wheel)
    write(flags, later, out)
    print(
        f"{out}: {len(flags)} flags, {sum(f['choices'] is None and f['type'] != 'bool' for f in flags)} without static choices"
    )


if __name__ == "__main__":
    main()
