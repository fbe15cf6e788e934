"""The registry of named EAGLE-3 transforms that spec files list under `[eagle3] transforms`: each initialises a part
of the EAGLE-3 layer from the MTP layer (`Eagle3Build`). The functions live in `transfer` and `attention`.

What this module does not do: the load transforms of the native layer (`family.transforms.LOAD_TRANSFORMS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtp2draft.eagle3.attention import attention_gated, attention_gqa, attention_mla
from mtp2draft.eagle3.transfer import (
    Eagle3Build,
    absorb_projection,
    lm_head_from_target,
    mlp_dense,
    mlp_moe_to_dense,
    norms,
)
from mtp2draft.errors import SpecError

EAGLE3_TRANSFORMS: dict[str, Callable[[Eagle3Build], None]] = {
    "attention_gqa": attention_gqa,
    "attention_gated": attention_gated,
    "attention_mla": attention_mla,
    "absorb_projection": absorb_projection,
    "mlp_dense": mlp_dense,
    "mlp_moe_to_dense": mlp_moe_to_dense,
    "norms": norms,
    "lm_head_from_target": lm_head_from_target,
}


def check_eagle3_transforms(spec: Any) -> None:
    """Every EAGLE-3 transform a spec names exists in the registry (`SpecError` otherwise). Checked here, where the
    registry lives, so that loading specs stays free of torch."""
    where = spec.path or spec.name
    for name in spec.eagle3.transforms:
        if name not in EAGLE3_TRANSFORMS:
            raise SpecError(
                f"{where}: eagle3.transforms names unknown transform {name!r}; known: {sorted(EAGLE3_TRANSFORMS)}"
            )
