"""Each setting's default is written once, in its record (`setting(default, ...)`): no function, dataclass or CLI
option elsewhere in the package writes another literal default for a setting's name."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.formats import ExportConfig
from mtp2draft.settings import ConvertConfig, RunConfig
from mtp2draft.train.settings import DistillConfig

PACKAGE = Path(__file__).resolve().parents[1] / "mtp2draft"
RECORDS = (DistillConfig, EvaluateConfig, ExportConfig, ConvertConfig, RunConfig)
# The sizes and counts a stage is run with: a second default for one of them is a second answer to "how many".
SETTINGS = (
    "ttt_steps", "batch_size", "max_length", "max_new_tokens", "steps", "lr", "warmup_steps", "save_every",
    "log_every", "eval_every", "heldout_examples", "num_draft_tokens", "max_prompts", "max_prompt_length",
    "speculative_tokens",
)  # fmt: skip


def _literal(node: ast.AST | None) -> bool:
    """A default written out (3, 1e-3, -1), not None and not a name that refers to the one declared."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool)


def literal_defaults(source: str, names: tuple[str, ...] = SETTINGS) -> list[str]:
    """`line name=value` for each literal default of a setting's name: a parameter's default, a class-level
    annotated field's value, or a `default=` keyword of a call that also names the option's `--flag`."""
    flags = {"--" + n.replace("_", "-"): n for n in names}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [
                *zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True),
                *zip(a.kwonlyargs, a.kw_defaults, strict=True),
            ]
            found += [f"{d.lineno} {p.arg}" for p, d in pairs if p.arg in names and _literal(d)]
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                named = isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                if named and item.target.id in names and _literal(item.value):
                    found.append(f"{item.lineno} {item.target.id}")
        elif isinstance(node, ast.Call):
            named = [flags[a.value] for a in node.args if isinstance(a, ast.Constant) and a.value in flags]
            found += [
                f"{k.lineno} {named[0]}" for k in node.keywords if named and k.arg == "default" and _literal(k.value)
            ]
    return found


def test_the_scan_finds_a_second_default() -> None:
    planted = {
        "def plan(cfg, ttt_steps: int = 3): ...": ["1 ttt_steps"],
        "def read(path, *, max_length=512): ...": ["1 max_length"],
        "class Job:\n    batch_size: int = 16": ["2 batch_size"],
        'p.add_argument("--max-length", type=int, default=256)': ["1 max_length"],
        "def demo(steps: int = DEMO_STEPS, max_length=None, lr=cfg.lr): ...": [],
    }
    assert {src: literal_defaults(src) for src in planted} == planted


def test_the_names_are_settings_of_the_records() -> None:
    fields = {f.name for record in RECORDS for f in dataclasses.fields(record)}
    assert set(SETTINGS) <= fields, set(SETTINGS) - fields


def test_each_default_is_written_once() -> None:
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := literal_defaults(path.read_text()))
    }
    assert found == {}, "take the default from the settings record instead"
