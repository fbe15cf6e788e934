"""Which module a spec's native layer kind builds: `modules.NativeMtpDraft` (one hidden vector per position), or
`hyper.HyperMtpDraft` (several residual streams per position, `[layer] streams`). Stage code builds native layers
through `native_draft` and writes a converted layer's config through `converted_config`, and never names a layer kind:
the kind's default hand-over is its class's `DEFAULT_HANDOVER`, decided there only.

What this module does not do: define the modules (`modules.py`, `hyper.py`) or read their weights (`layout.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp2draft.draft.hyper import HyperMtpDraft
from mtp2draft.draft.modules import NativeMtpDraft, native_config
from mtp2draft.family.schema import Spec


def native_class(spec: Spec) -> type[NativeMtpDraft]:
    """The native module class of `spec`'s layer kind: `NativeMtpDraft`, or `hyper.HyperMtpDraft` for a layer whose
    hidden state is several residual streams (`[layer] streams`)."""
    if spec.layer.streams:
        return HyperMtpDraft
    return NativeMtpDraft


def native_draft(spec: Spec, target_config: Mapping[str, Any], layer: int = 0, **options: Any) -> NativeMtpDraft:
    """MTP layer `layer` of `spec`'s family as its native module (`native_class`); options as `NativeMtpDraft`'s."""
    return native_class(spec)(spec, target_config, layer, **options)


def converted_config(spec: Spec, target_config: Mapping[str, Any], layer: int = 0) -> dict[str, Any]:
    """config.json of MTP layer `layer` as `convert` writes it: the checkpoint's own computation and the layer kind's
    default hand-over (`native_class(spec).DEFAULT_HANDOVER`: pre_norm streams for a multi-stream layer), so a draft
    read back without options computes what a module built without options does."""
    return native_config(spec, target_config, layer, hidden_handover=native_class(spec).DEFAULT_HANDOVER)
