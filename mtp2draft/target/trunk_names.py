"""Where a multimodal release keeps its text trunk, as the `key_mapping` transformers' `from_pretrained` applies
before its own renames.

A vision-language or omni release stores the text model under its wrapper's `language_model.` component, which the
causal-LM class of the text model (the spec's `transformers_model_type`) does not have: EXAONE 4.5 keeps exaone4's
`model.layers.*` / `model.norm` as `model.language_model.*`, Nemotron-3 Omni keeps nemotron_h's `backbone.*` and
`lm_head` as `language_model.backbone.*` / `language_model.lm_head`. Loaded without a mapping, every trunk weight is
missing and the target is refused (`hidden.refuse_missing_weights`). Where the component is is the spec's data: its
`target_embed`, `target_norm` and `target_head` keys, the checkpoint's names of the trunk's ends. GLM-OCR, loaded as
its release's image-text-to-text class (`hidden.trunk_class`), loads the same with the mapping as without it.

What this module does not do: rename the MTP layer's keys (`draft/layout.py` reads them under the spec's names) or
load anything (`hidden.TargetModel` passes the mapping).
"""

from __future__ import annotations

import re

from mtp2draft.family.schema import Spec

WRAPPER = "language_model."  # the component a multimodal release puts its text model under


def trunk_key_mapping(spec: Spec) -> dict[str, str]:
    """Regex -> replacement dropping the wrapper component from the checkpoint's trunk names (the part of each
    `target_*` key before it is kept: `model.language_model.` -> `model.`, `language_model.` -> ``); empty for a
    text release. transformers applies the renames in turn, then the class's own (nemotron_h's `backbone.` ->
    `model.`); a class that drops the component itself (Qwen3.5's text model) gets the same rename twice, harmlessly:
    the second finds nothing left to drop."""
    mapping: dict[str, str] = {}
    for key in (spec.keys.target_embed, spec.keys.target_norm, spec.keys.target_head):
        head, found, _ = key.partition(WRAPPER)
        if found and (not head or head.endswith(".")):  # a whole component, not the end of another one's name
            mapping["^" + re.escape(head + WRAPPER)] = head
    return mapping
