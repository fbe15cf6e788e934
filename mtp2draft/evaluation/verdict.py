"""An evaluation result's lossless verdict in words, for the tables `evaluate` prints and the model card.

Kept apart from `decode.py` so that what reads a report (the CLI's output, the card) never imports torch.

What this module does not do: check anything (`decode.evaluate` raises on a greedy difference that is not at a logit
tie, which is what lets a recorded False with ties read as "yes, N tie(s)").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def lossless_words(result: Mapping[str, Any]) -> str | None:
    """A greedy result's lossless verdict: "yes"; "yes, N tie(s)" when N prompts parted from the target's output,
    each at a logit tie (any other difference raised `LosslessError`, so a recorded False with ties is that); "no"
    otherwise. None at a temperature (the distribution check speaks there)."""
    if result.get("lossless") is None:
        return None
    if result["lossless"]:
        return "yes"
    ties = parted_at_ties(result)
    return f"yes, {ties} tie(s)" if ties else "no"


def parted_at_ties(result: Mapping[str, Any]) -> int:
    """How many prompts of a greedy result parted from the target's output at a logit tie (0 when none did, when the
    result is lossless outright, or at a temperature)."""
    if result.get("lossless") is not False:
        return 0
    return result.get("ties") or 0
