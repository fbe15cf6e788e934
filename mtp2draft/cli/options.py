"""The command line's option types, declared once and shared by the commands in `cli` (as the hf CLI shares repo id,
revision and token). Choice lists in help texts come from the registries that own them, never a hand-written list.

What this module does not do: parse, call the library or print (`cli` does).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from mtp2draft.dtypes import DTYPE_NAMES
from mtp2draft.kinds import DRAFT_KINDS, DRAFT_SAMPLING


def choices(option: str, sep: str = " | ") -> str:
    """The values an option's help lists, from the registry that owns them (kinds, engines, formats, subsets, gpus)."""
    from mtp2draft.engines.choice import DUMP_ENGINES, EVALUATE_ENGINES
    from mtp2draft.family.schema import ENGINES, STEP_LAYER_RULES
    from mtp2draft.formats import FORMATS, VALIDATE_FORMATS
    from mtp2draft.speed.accelerators import ACCELERATORS
    from mtp2draft.train.subsets import TRAIN_SUBSETS

    registries = {"kinds": DRAFT_KINDS, "engines": ENGINES, "formats": FORMATS, "validate": VALIDATE_FORMATS}
    registries |= {"subsets": TRAIN_SUBSETS, "dump_engines": DUMP_ENGINES, "gpus": ACCELERATORS}
    registries |= {"draft_sampling": DRAFT_SAMPLING, "dtypes": DTYPE_NAMES, "evaluate_engines": EVALUATE_ENGINES}
    registries |= {"step_layers": STEP_LAYER_RULES}
    return sep.join(registries[option])


# Options that are not stage settings (inputs, outputs, flags of one call), each declared once here and shared by
# the commands that take it. The stages' settings are built from their dataclasses below (`settings`).
Source = Annotated[
    str, typer.Argument(help="Hub repo id (org/name) or local checkpoint directory.", show_default=False)
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]
Out = Annotated[Path, typer.Option("--out", help="Output draft directory.", show_default=False)]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty --out.")]
Data = Annotated[Path, typer.Option("--data", help="JSONL: {'text': ...} or {'messages': [...]} per line.")]
Target = Annotated[str, typer.Option("--target", help="Target model: hub repo id or local directory.")]
OptionalTarget = Annotated[str | None, typer.Option("--target", help="Target: hub repo id or local directory.")]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Skip malformed data lines (counted) instead of failing.")]

# distill's inputs and flags (its training settings: train.settings.DistillConfig)
DraftDir = Annotated[Path, typer.Argument(help="Draft directory from `convert` (mtp or eagle3).", show_default=False)]
OptionalDraftDir = Annotated[
    Path | None,
    typer.Argument(help="Draft directory: from `convert` (mtp, eagle3) or a dspark drafter.", show_default=False),
]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint of --out.")]
Plan = Annotated[bool, typer.Option("--plan", help="Print the per-rank memory plan (every --train-subset) and exit.")]
WorldSize = Annotated[
    int | None, typer.Option("--world-size", help="With --plan: ranks to plan for (default: torchrun's, or 1).")
]
# what runs the target (one meaning of --engine; `distill --serving-engine` names the engine a draft is trained for)
TargetEngine = Annotated[str, typer.Option("--engine", help=f"What runs the target: {choices('dump_engines')}.")]
EvalEngine = Annotated[str, typer.Option("--engine", help=f"What runs the target: {choices('evaluate_engines')}.")]


# ---- options built from the settings dataclasses ------------------------------------------------------------------
ADVANCED = "Advanced"  # the --help panel of research knobs: most users never set them


class Group:
    """A settings dataclass a command offers, or part of it (`only` / `skip` field names): `@settings(cfg=Group(...))`
    adds one option per field to the command and hands the command one built instance."""

    def __init__(self, cls: type, *, only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
        from mtp2draft.settings import cli_fields

        self.cls = cls
        self.fields = [f for f in cli_fields(cls) if (not only or f.name in only) and f.name not in skip]
        unknown = (set(only) | set(skip)) - {f.name for f in cli_fields(cls)}
        if unknown:
            raise TypeError(f"{cls.__name__} offers no option for {sorted(unknown)}")


def _parameter(f: Any, hint: Any) -> inspect.Parameter:
    """The typer parameter of one settings field: its flag, help (with the registry's choices) and default, all from
    the field's `setting(...)` declaration."""
    import dataclasses

    from mtp2draft.settings import flag_of

    meta = f.metadata
    required = f.default is dataclasses.MISSING
    # a field parsed from text ('1,0.8') is a str option; otherwise the field's own type
    kind = (str | None) if meta["parse"] else hint
    names = (flag_of(f), meta["short"]) if meta["short"] else (flag_of(f),)
    panel = ADVANCED if meta["advanced"] else None
    info = typer.Option(*names, help=help_of(f), rich_help_panel=panel, show_default=not required)
    default = inspect.Parameter.empty if required else (None if meta["parse"] else f.default)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info])


def help_of(f: Any) -> str:
    """A settings field's option help: its text, then the values of the registry it names."""
    meta = f.metadata
    return meta["help"] + (f" {choices(meta['choices'])}." if meta["choices"] else "")


def settings(**groups: type | Group) -> Callable:
    """Decorate a command: each `name=SettingsClass` (or `Group(...)`) replaces the command's parameter `name` by one
    option per field, and at call time builds the instance from those options with keywords, so the command receives
    `name=SettingsClass(field=value, ...)`; a bad value is refused by the class itself (one `error:` line)."""
    import functools

    from mtp2draft.settings import flag_of

    def decorate(command: Callable) -> Callable:
        groups_ = {name: g if isinstance(g, Group) else Group(g) for name, g in groups.items()}
        own = inspect.signature(command, eval_str=True)
        kept = [p for name, p in own.parameters.items() if name not in groups_]
        added = [_parameter(f, get_type_hints(g.cls)[f.name]) for g in groups_.values() for f in g.fields]
        names = [p.name for p in kept + added]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # two groups (or a group and the command) offering one name: say which to skip
            raise TypeError(f"{command.__name__}: options offered twice: {twice}")

        @functools.wraps(command)
        def wrapper(**options: Any) -> Any:
            for name, group in groups_.items():
                values = {}
                for f in group.fields:
                    value = options.pop(f.name)
                    if f.metadata["parse"]:
                        value = parse_list(value, flag_of(f), f.metadata["parse"])
                    values[f.name] = value
                options[name] = group.cls(**values)
            return command(**options)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept] + added
        wrapper.__signature__ = inspect.Signature(params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def parse_list(text: str | None, option: str, parse: Callable[[str], Any]) -> Any:
    """An option's text ('1,0.8') parsed by `parse` (`settings.floats`, `settings.ints`); empty is None; a
    malformed one is a usage error naming the option."""
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
