"""The (text) config MTP layer i's block is built from, where a family's config lists per-layer facts past the trunk.

Step-3.5 / 3.7 configs give every per-layer field one entry per trunk layer and then one per MTP layer (layer_types,
rope_theta, partial_rotary_factors, swiglu_limits: num_hidden_layers + MTP count entries; a config saved by
transformers keeps the MTP entries apart, as `mtp_<field>`), and mark MoE layers by index (moe_layers_enum). The
spec names those fields (`[config] layer_lists`, `layer_sets`); MTP layer i's block config holds only its own entries,
as a one-layer config, so transformers' decoder layer built at index 0 is layer i's kind (sliding or full attention,
its head count, its RoPE, dense or MoE).

What this module does not do: build modules (`draft/modules.py`) or read the count of MTP layers (`Spec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp2draft.errors import CheckpointError
from mtp2draft.family.schema import Spec


def layer_text_config(spec: Spec, config: Mapping[str, Any], layer: int) -> dict[str, Any]:
    """`spec.text_config(config)` with each `layer_lists` field cut to MTP layer `layer`'s entry and each
    `layer_sets` field to {0} or {} (MTP layer `layer` as trunk layer 0 of a one-layer config)."""
    text = spec.text_config(config)
    if not (spec.config.layer_lists or spec.config.layer_sets):
        return text
    n, count = spec.num_layers(config), spec.num_mtp_layers(config)
    for name in spec.config.layer_lists:
        value, own = text.get(name), text.get(f"mtp_{name}")
        if isinstance(own, list) and len(own) == count and 0 <= layer < count:
            text[name] = [own[layer]]
        elif isinstance(value, list) and len(value) == n + count and 0 <= layer < count:
            text[name] = [value[n + layer]]
        elif isinstance(value, list):
            raise CheckpointError(
                f"config.json: {name} has {len(value)} entries; MTP layer {layer} needs {n} trunk + {count} MTP "
                f"entries (or mtp_{name} with {count})"
            )
        text.pop(f"mtp_{name}", None)
    for name in spec.config.layer_sets:
        value = text.get(name)
        if value is None:
            continue
        items = value.split(",") if isinstance(value, str) else value
        text[name] = "0" if n + layer in {int(i) for i in items if str(i).strip()} else ""
    text[spec.config.num_layers] = 1
    text[spec.config.mtp_count] = 0
    return text
