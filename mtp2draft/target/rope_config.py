"""One spelling for a config's RoPE settings, so two configs that say the same thing compare equal.

Releases spell RoPE in several equivalent ways (a legacy `rope_scaling` with `type`, transformers 5's
`rope_parameters`, `rope_theta` and `partial_rotary_factor` beside or inside them); `normalised` gathers them into
one set of `rope.<field>` entries. Used by the draft-target identity check (`identity.py`) and the dump checks.

What it does not do: decide which fields matter (`identity.py`) or compute a RoPE (transformers does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where a release keeps RoPE settings: the legacy `rope_scaling` (DeepSeek-V3, Kimi-K2), transformers 5's
# `rope_parameters` (GLM-5, Qwen3.5), and fields beside them that transformers moves inside.
_ROPE_SECTIONS = ("rope_scaling", "rope_parameters")
_ROPE_BESIDE = ("rope_theta", "partial_rotary_factor")
_ROPE_ORIGINAL_LENGTH = ("llama3", "yarn", "longrope")  # the types transformers gives a pretraining length


def _rope_record(section: Mapping[str, Any], beside: Mapping[str, Any]) -> dict[str, Any]:
    """One RoPE dict in one spelling: `type` read as `rope_type` (transformers and the engines read both alike), the
    fields `beside` filled in where the dict lacks them, and the pretraining length transformers fills in for the
    scaled types (`original_max_position_embeddings`, else `max_position_embeddings`)."""
    rope = {k: v for k, v in section.items() if k != "type"}
    rope.setdefault("rope_type", section.get("type", "default"))
    for key in _ROPE_BESIDE:
        if key in beside:
            rope.setdefault(key, beside[key])
    if rope["rope_type"] in _ROPE_ORIGINAL_LENGTH:
        length = beside.get("original_max_position_embeddings", beside.get("max_position_embeddings"))
        if length is not None:
            rope.setdefault("original_max_position_embeddings", length)
    return rope


def normalised(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config section with its RoPE settings gathered into `rope.<field>` entries (`_rope_record`; per-layer-type
    dicts, as transformers nests them, as `rope.<layer type>.<field>`), every other field as given. Applied to both configs a comparison reads,
    it makes a release's own spelling and the one transformers writes back compare equal, and nothing else: a
    changed factor, base, type or extra key still differs."""
    out = {k: v for k, v in config.items() if k not in (*_ROPE_SECTIONS, *_ROPE_BESIDE)}
    merged: dict[str, Any] = {}
    for key in _ROPE_SECTIONS:
        section = config.get(key)
        if isinstance(section, Mapping):
            merged.update(section)
        elif section is not None:  # not a dict: compared as written
            out[key] = section
    if merged and all(isinstance(v, Mapping) for v in merged.values()):  # {"full_attention": {...}, ...}
        for layer_type, section in merged.items():
            out.update({f"rope.{layer_type}.{k}": v for k, v in _rope_record(section, config).items()})
    elif merged or any(k in config for k in _ROPE_BESIDE):
        out.update({f"rope.{k}": v for k, v in _rope_record(merged, config).items()})
    return out
