"""mtp2draft: turn the multi-token-prediction layer shipped in LLM checkpoints into a speculative-decoding draft.

Pipeline (each stage a CLI command and a function here):
    convert   checkpoint MTP layer -> native MTP draft or EAGLE-3 draft
    distill   training-time-test fine-tune against the frozen target
    evaluate  chain speculative decoding against the target: acceptance per position, lossless check
    export    the formats engines load (sglang, speculators, nextn, stitched), validated before writing
    push      publish to the Hugging Face Hub with a model card

The stage functions are loaded on first use (PEP 562 `__getattr__`), so `import mtp2draft` or `import
mtp2draft.family.spec` does not import torch. No module shares a public function's name (`mtp2draft.convert` is the
function, its module is `mtp2draft.conversion`), so importing a module never shadows a function.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mtp2draft._version import __version__

# public name -> the module that defines it (stage modules are named after nouns, so no module shadows a function)
_LAZY: dict[str, str] = {
    "convert": "conversion",
    "inspect_checkpoint": "conversion",
    "load_native": "draft.layout",
    "distill": "train.recipe",
    "DistillConfig": "train.settings",
    "DistillJob": "train.settings",
    "TrainingData": "train.settings",
    "Placement": "settings",
    "HubAccess": "settings",
    "evaluate": "evaluation.decode",
    "EvaluateConfig": "evaluation.settings",
    "export": "formats.export",
    "ExportConfig": "formats",
    "validate": "formats.export",
    "push": "hub.upload",
    "run": "pipeline",
    "load_draft": "draft.disk",
    "NativeMtpDraft": "draft.modules",
    "MtpChainDraft": "draft.chain",
    "Eagle3Draft": "draft.eagle3",
    "find_spec": "family.spec",
    "get_spec": "family.spec",
    "registry": "family.spec",
}

__all__ = [
    "__version__",
    "convert",
    "inspect_checkpoint",
    "load_native",
    "distill",
    "DistillConfig",
    "DistillJob",
    "TrainingData",
    "Placement",
    "HubAccess",
    "evaluate",
    "EvaluateConfig",
    "export",
    "ExportConfig",
    "validate",
    "push",
    "run",
    "load_draft",
    "NativeMtpDraft",
    "MtpChainDraft",
    "Eagle3Draft",
    "find_spec",
    "get_spec",
    "registry",
]

if TYPE_CHECKING:  # for type checkers and IDEs only: at run time these load lazily
    from .conversion import convert, inspect_checkpoint
    from .draft.chain import MtpChainDraft
    from .draft.disk import load_draft
    from .draft.eagle3 import Eagle3Draft
    from .draft.layout import load_native
    from .draft.modules import NativeMtpDraft
    from .evaluation.decode import evaluate
    from .evaluation.settings import EvaluateConfig
    from .family.spec import find_spec, get_spec, registry
    from .formats import ExportConfig
    from .formats.export import export, validate
    from .hub.upload import push
    from .pipeline import run
    from .settings import HubAccess, Placement
    from .train.recipe import distill
    from .train.settings import DistillConfig, DistillJob, TrainingData


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
