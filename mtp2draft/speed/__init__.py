"""What a draft buys: a speed model that turns measured acceptance per draft position and the configs of target and
draft into predicted tokens/s and time per output token, with and without the draft, on a named accelerator.

- `accelerators`: cited HBM bandwidth and tensor peaks of H100 SXM, H200, B200 and MI300X;
- `cost`: what one forward reads and computes (weights, MoE experts touched, KV, FLOPs) and its time, with the one
  fitted constant `LAYER_LATENCY_S`;
- `model`: speculative steps, expected tokens per step, the table over k and batch, the recommended k;
- `published`: the published engine figures the constant is fit on (non-speculative ones only) and checked against,
  and the real configs of their checkpoints.

Everything here is plain Python: no torch, so `mtp2draft speedup` and the model card stay light.

What this package does not do: measure acceptance or time anything (`evaluate`), or claim more than a roofline plus one
fitted latency can say: it predicts ratios better than absolute tokens/s (see `published.py` for how far off it is).
"""

from __future__ import annotations

from mtp2draft.speed.accelerators import ACCELERATORS, Accelerator, get_accelerator
from mtp2draft.speed.cost import LAYER_LATENCY_S, draft_cost, forward_time, mtp_draft_cost, target_cost
from mtp2draft.speed.model import Acceptance, SpeedReport, predict, read_acceptance

__all__ = [
    "ACCELERATORS",
    "LAYER_LATENCY_S",
    "Acceptance",
    "Accelerator",
    "SpeedReport",
    "draft_cost",
    "forward_time",
    "get_accelerator",
    "mtp_draft_cost",
    "predict",
    "read_acceptance",
    "target_cost",
]
