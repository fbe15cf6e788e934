"""mtp2draft: turn the multi-token-prediction layer shipped in LLM checkpoints into a speculative-decoding draft.

Pipeline (each stage a CLI command and a function here):
    convert   checkpoint MTP layer -> native MTP draft or EAGLE-3 draft
    distill   training-time-test fine-tune against the frozen target
    evaluate  chain speculative decoding against the target: acceptance per position, lossless check
    export    the formats engines load (sglang, speculators, nextn, stitched), validated before writing
    push      publish to the Hugging Face Hub with a model card

The stage functions are loaded on first use (PEP 562 `__getattr__`), so `import mtp2draft` or `import
mtp2draft.family.spec` does not import torch. They carry their module's name (`mtp2draft.conversion` is the function here);
import the modules themselves with `from mtp2draft.conversion import ...` or `importlib.import_module(...)`.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from mtp2draft._version import __version__

# public name -> the module that defines it
_LAZY: dict[str, str] = {
    "convert": "convert",
    "inspect_checkpoint": "convert",
    "load_native": "convert",
    "distill": "distill",
    "DistillConfig": "distill",
    "evaluate": "evaluate",
    "export": "export",
    "validate": "export",
    "push": "hub",
    "run": "run",
    "load_draft": "draft",
    "NativeMtpDraft": "draft",
    "Eagle3Draft": "draft",
    "find_spec": "spec",
    "get_spec": "spec",
    "registry": "spec",
}

__all__ = [
    "__version__",
    "convert",
    "inspect_checkpoint",
    "load_native",
    "distill",
    "DistillConfig",
    "evaluate",
    "export",
    "validate",
    "push",
    "run",
    "load_draft",
    "NativeMtpDraft",
    "Eagle3Draft",
    "find_spec",
    "get_spec",
    "registry",
]

if TYPE_CHECKING:  # for type checkers and IDEs only: at run time these load lazily
    from mtp2draft.conversion import convert, inspect_checkpoint
    from mtp2draft.draft.layout import load_native
    from mtp2draft.draft.modules import Eagle3Draft, NativeMtpDraft, load_draft
    from mtp2draft.evaluation import evaluate
    from mtp2draft.family.spec import find_spec, get_spec, registry
    from mtp2draft.formats.export import export, validate
    from mtp2draft.hub import push
    from mtp2draft.pipeline import run
    from mtp2draft.train.recipe import DistillConfig, distill


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    # A stage function shares its module's name: importing mtp2draft.conversion binds the MODULE as the package
    # attribute `convert`, so the function is cached in the module globals, replacing it, as the eager imports did.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Keeps `mtp2draft.conversion` (and distill, evaluate, export, run) the stage FUNCTION once its submodule is
    imported: the import system binds the submodule as a package attribute, which would shadow the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == name and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
