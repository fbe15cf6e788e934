"""The transformers config an MTP layer's block is built from: the target's (text) config cut to that layer, the
spec's field mappings (`[config] block_from`), overrides and unset fields. What it does not do: build modules
(`modules.py`) or check a draft's own config (`config.py`)."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from mtp2draft.errors import CheckpointError, SpecError
from mtp2draft.family.layer_config import layer_text_config
from mtp2draft.family.schema import Spec


def hf_config(model_type: str, fields: Mapping[str, Any], where: str = "config.json"):
    """transformers' config class for `model_type` built from `fields`; a field of the wrong type or value (a string
    `hidden_size`, say) is one CheckpointError line instead of transformers' multi-line validation error."""
    from huggingface_hub.errors import StrictDataclassError  # transformers validates config fields through it
    from transformers import AutoConfig

    # a deep copy: transformers standardises RoPE in place (it adds `rope_theta` and `rope_type` to the very
    # `rope_scaling` dict it is given), which would edit the caller's config.json record behind its back
    fields = copy.deepcopy(dict(fields))
    if _no_op_rope_scaling(fields.get("rope_scaling")):
        del fields["rope_scaling"]
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError, AttributeError, StrictDataclassError) as exc:  # AttributeError: torch_dtype
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise CheckpointError(f"{where} does not describe a valid {model_type} model: {text}") from None


def _no_op_rope_scaling(rope: Any) -> bool:
    """A legacy `rope_scaling` naming the default RoPE and nothing else (MiMo-V2.5's `{"rope_type": "default",
    "type": "default"}`): it says "no scaling", so the config is built without it. Config classes that standardise
    RoPE build the same rope_parameters from `rope_theta` either way; mimo_v2_flash's, which keys RoPE by layer type
    and converts nothing, would take the flat dict as its rope_parameters and lose the per-layer-type ones."""
    return (
        isinstance(rope, dict)
        and bool(rope)
        and set(rope) <= {"rope_type", "type"}
        and set(rope.values()) == {"default"}
    )


def block_config(spec: Spec, target_config: Mapping[str, Any], layer: int = 0):
    """The transformers config MTP layer `layer`'s block is built from: the target's (text) config (its per-layer
    fields cut to that layer's, `layer_config.py`) plus the spec's overrides. One line where the installed transformers
    is older than `[block] min_transformers` (its classes would compute another block than the engines')."""
    need, have = spec.block.min_transformers, importlib.import_module("transformers").__version__
    if need and Version(have) < Version(need):
        raise SpecError(f"{spec.name} needs transformers >= {need}, not {have}: older ones build another block")
    text = layer_text_config(spec, target_config, layer)
    text.pop("model_type", None)
    text.pop("architectures", None)
    cfg = hf_config(spec.config.transformers_model_type, text)
    for target, value in spec.block_from_values(text).items():
        _set_path(cfg, target, value)
    for key, value in spec.config.block_overrides.items():
        setattr(cfg, key, copy.deepcopy(value))
    for key in spec.config.block_unset:
        # Past the strict dataclass's validation: ExaoneMoeConfig types sliding_window `int`, while its attention
        # reads None as "full attention with RoPE".
        object.__setattr__(cfg, key, None)
    cfg._attn_implementation = spec.block.attn_implementation
    cfg._experts_implementation = "eager"  # the modules are used standalone, outside a PreTrainedModel
    return cfg


def _set_path(cfg: Any, path: str, value: Any) -> None:
    """Set `a.b.c` on a config: attribute `a`, then keys `b`, `c` of the dict it holds."""
    head, *rest = path.split(".")
    if not rest:
        setattr(cfg, head, value)
        return
    node = getattr(cfg, head)
    for key in rest[:-1]:
        node = node.setdefault(key, {})
    node[rest[-1]] = value


def norm_eps(config) -> float:
    """The block config's RMSNorm epsilon: `rms_norm_eps`, or `layer_norm_epsilon` where the family names it so
    (Nemotron-H)."""
    eps = getattr(config, "rms_norm_eps", None)
    return float(config.layer_norm_epsilon if eps is None else eps)
