"""A draft against a baseline on the same prompts: the difference in acceptance with a paired bootstrap interval.

Two drafts evaluated on the same prompts differ partly by chance (which prompts were drawn); the paired bootstrap
resamples prompts with replacement, the same prompts for both drafts, and recomputes each pooled figure on the
resample: the 2.5th and 97.5th percentiles of the difference bound it at 95 %. Pooled figures are what `evaluate`
reports: mean acceptance length = sum over steps of (a + 1) / steps, and per-draft acceptance at position j =
steps with a >= j / steps, where a is the number of draft tokens accepted at one target forward.

"Do no harm" reads from it: a distilled head harms the raw one when the interval of a difference lies below zero
(or below the tolerance a caller allows).

What this module does not do: decode (`decode.py`) or decide for the caller what interval is good enough.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

SAMPLES = 2000  # resamples: the 95 % bounds move by well under 0.01 between seeds at 64 prompts


def pooled(steps_by_prompt: Sequence[Sequence[int]], k: int) -> list[float]:
    """[mean acceptance length, per-draft acceptance at positions 1..k] pooled over every step of every prompt."""
    return _ratio([_counts(prompt, k) for prompt in steps_by_prompt])


def _counts(steps: Sequence[int], k: int) -> list[int]:
    """One prompt's [steps, sum of (a + 1), steps with a >= 1, ..., steps with a >= k]: pooled figures add up."""
    return [len(steps), sum(a + 1 for a in steps)] + [sum(1 for a in steps if a >= j) for j in range(1, k + 1)]


def _ratio(counts: Sequence[Sequence[int]]) -> list[float]:
    total = [sum(col) for col in zip(*counts, strict=True)]
    return [x / max(total[0], 1) for x in total[1:]]


def paired_bootstrap(
    draft: Mapping[str, Any], baseline: Mapping[str, Any], samples: int = SAMPLES, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """Draft minus baseline, each figure with its paired bootstrap interval. Both are `evaluate` results (dicts with
    `accepted_by_prompt`: the accepted count of every target forward, prompt by prompt) on the same prompts; k is the
    smaller of their two."""
    a, b = draft["accepted_by_prompt"], baseline["accepted_by_prompt"]
    if len(a) != len(b) or not a:
        raise ValueError(f"paired bootstrap needs the same prompts for both drafts, got {len(a)} and {len(b)}")
    k = min(draft["num_draft_tokens"], baseline["num_draft_tokens"])
    ca, cb = [_counts(p, k) for p in a], [_counts(p, k) for p in b]
    point = [x - y for x, y in zip(_ratio(ca), _ratio(cb), strict=True)]
    rng = random.Random(seed)
    draws: list[list[float]] = []
    for _ in range(samples):
        pick = [rng.randrange(len(a)) for _ in a]  # the same prompts for both drafts: paired
        ra, rb = _ratio([ca[i] for i in pick]), _ratio([cb[i] for i in pick])
        draws.append([x - y for x, y in zip(ra, rb, strict=True)])
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    bounds = [_percentiles(sorted(col), lo, hi) for col in zip(*draws, strict=True)]
    names = ["mean_acceptance_length"] + [f"per_draft_acceptance_{j}" for j in range(1, k + 1)]
    return {
        "draft": draft["name"],
        "baseline": baseline["name"],
        "prompts": len(a),
        "samples": samples,
        "level": level,
        "difference": {
            name: {"value": round(p, 4), "low": round(low, 4), "high": round(high, 4)}
            for name, p, (low, high) in zip(names, point, bounds, strict=True)
        },
    }


def _percentiles(values: list[float], lo: float, hi: float) -> tuple[float, float]:
    """Linear-interpolated percentiles of sorted `values` (as numpy's default)."""

    def at(q: float) -> float:
        x = q * (len(values) - 1)
        i = int(x)
        j = min(i + 1, len(values) - 1)
        return values[i] + (values[j] - values[i]) * (x - i)

    return at(lo), at(hi)


def compare_to_baselines(results: Sequence[Mapping[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """The first result (the draft) against each later one (the baselines)."""
    return [paired_bootstrap(results[0], other, seed=seed) for other in results[1:]]


__all__ = ["SAMPLES", "compare_to_baselines", "paired_bootstrap", "pooled"]
