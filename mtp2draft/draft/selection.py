"""Attentions that make their own mask from a sparse selection, given the draft's mask too.

GLM-5.3-Flash's attention (transformers' Glm5NextTextAttention) reads no attention mask: it takes a bool [B, T] of
valid queries, and its DSA indexer builds causality from the cache length and picks the keys each query sees; one
method (`[block] selection_mask`, here `build_attention_mask_from_topk`) turns that pick into the mask the attention
applies. A draft needs its own mask honoured as well (the training-time-test mask lets a query see only the entries
of its own chain, which the cache order alone does not say), so the attention class is derived once with that method
also hiding every key the draft's additive mask hides.

What this module does not do: change what the indexer selects (a selection the draft's mask hides is dropped, not
replaced), or touch attentions that read the draft's mask themselves (no `selection_mask`).
"""

from __future__ import annotations

from typing import Any

import torch

_DERIVED: dict[tuple[type, str], type] = {}


def with_draft_mask(cls: type, method: str) -> type:
    """`cls` with `method` (-> its selection mask: bool, or additive with 0 for visible keys, [B, 1, T, K]) also
    hiding the keys the instance's `draft_mask` hides (additive [1 or B, 1, T, K], negative where hidden; None:
    nothing more). The class keeps its name and its parameters' names."""
    key = (cls, method)
    if key not in _DERIVED:
        original = getattr(cls, method)

        def build(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            mask = original(self, *args, **kwargs)
            extra = self.draft_mask
            if extra is None:
                return mask
            hidden = extra.to(mask.device) < 0  # [1 or B, 1, T, K]
            if mask.dtype == torch.bool:
                return mask & ~hidden
            return mask.masked_fill(hidden, torch.finfo(mask.dtype).min)

        _DERIVED[key] = type(cls.__name__, (cls,), {method: build, "draft_mask": None, "__module__": cls.__module__})
    return _DERIVED[key]
