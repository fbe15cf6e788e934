"""mtp2draft: turn the multi-token-prediction layer shipped in LLM checkpoints into a speculative-decoding draft.

Pipeline (each stage a CLI command and a function here):
    convert   checkpoint MTP layer -> native MTP draft or EAGLE-3 draft
    distill   training-time-test fine-tune against the frozen target
    evaluate  chain speculative decoding against the target: acceptance per position, lossless check
    export    the formats engines load (sglang, speculators, nextn, stitched), validated before writing
    push      publish to the Hugging Face Hub with a model card
"""

__version__ = "0.1.0"

# The stage functions carry their module's name (mtp2draft.convert is the function here); import the modules
# themselves with `from mtp2draft.convert import ...` or `importlib.import_module("mtp2draft.convert")`.
from .convert import convert, inspect_checkpoint, load_native  # noqa: E402
from .distill import DistillConfig, distill  # noqa: E402
from .draft import Eagle3Draft, NativeMtpDraft, load_draft  # noqa: E402
from .evaluate import evaluate  # noqa: E402
from .export import export, validate  # noqa: E402
from .hub import push  # noqa: E402
from .run import run  # noqa: E402
from .spec import find_spec, get_spec, registry  # noqa: E402

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
