"""The speed model: tokens/s and time per output token with and without a draft, for k = 1..8 and batch 1..64, from
measured acceptance per draft position and the cost model of target and draft (`cost.py`); and the k to use.

A speculative step with k drafts costs `draft_forwards` (k unless an engine runs more, as SGLang's
`--speculative-num-steps` can) draft forwards of one token per request, plus one target forward verifying k + 1
tokens per request. It yields E[tokens] = 1 + sum_{j<=k} prod_{i<=j} a_i tokens per request, where a_i is the
acceptance at draft position i given that position i - 1 was accepted (`evaluate`'s `acceptance_per_position`).
Without the draft a step is one target forward of one token and yields one token. Time per output token is
step time / E[tokens]; tokens/s per request is its inverse; aggregate tokens/s multiplies by the batch.

Only positions the evaluation measured are used: a k beyond them has no prediction (the report says so), and the
recommended k is the fastest measured one, or none when no measured k beats decoding without the draft.

What this module does not do: measure anything (`evaluation/decode.py` does), or model tree drafting, rejection-sampling
temperature effects or scheduling across requests of different lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mtp2draft.errors import DataError, OptionError
from mtp2draft.speed.accelerators import Accelerator
from mtp2draft.speed.cost import LAYER_LATENCY_S, ModelCost, forward_time

KS = tuple(range(1, 9))
BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Acceptance:
    """Acceptance per draft position, conditional (position j accepted given j - 1 was), as `evaluate` reports it."""

    per_position: tuple[float, ...]
    source: str = "given"
    mean_acceptance_length: float | None = None
    target_family: str | None = None  # the family of the target it was measured on, when the report says

    def __post_init__(self) -> None:
        if not self.per_position or any(not 0.0 <= a <= 1.0 for a in self.per_position):
            raise DataError(
                f"{self.source}: acceptance per position must be numbers in [0, 1], got {self.per_position}"
            )

    @property
    def measured_k(self) -> int:
        return len(self.per_position)

    def expected_tokens(self, k: int) -> float | None:
        """Tokens per speculative step with k drafts (bonus token included); None past the measured positions."""
        if k > self.measured_k:
            return None
        total, survive = 1.0, 1.0
        for a in self.per_position[:k]:
            survive *= a
            total += survive
        return total


def read_acceptance(path: str | Path) -> Acceptance:
    """The first draft's acceptance in an evaluation.json (or a draft directory holding one), read by the typed
    reader `evaluate --save` writes with (`formats/report.py`)."""
    from mtp2draft.formats.report import read_report

    report = read_report(path)
    first = report.draft
    return Acceptance(first.acceptance_per_position, report.source, first.mean_acceptance_length, report.target_family)


@dataclass(frozen=True)
class Baseline:
    """Decoding without the draft at one batch size."""

    batch: int
    tpot_s: float
    tokens_per_s: float  # per request
    aggregate_tokens_per_s: float


@dataclass(frozen=True)
class Row:
    """Speculative decoding with k drafts at one batch size."""

    k: int
    batch: int
    tokens_per_step: float
    step_s: float
    tpot_s: float
    tokens_per_s: float
    aggregate_tokens_per_s: float
    speedup: float


@dataclass
class SpeedReport:
    target: str
    draft: str
    gpu: str
    tp: int
    draft_tp: int
    context: int
    acceptance: list[float]
    acceptance_source: str
    baselines: list[Baseline]
    rows: list[Row]
    recommended: dict[int, int | None]  # batch -> fastest measured k, None when no measured k speeds up
    unmeasured_ks: list[int]
    constants: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, k: int, batch: int) -> Row | None:
        return next((r for r in self.rows if r.k == k and r.batch == batch), None)

    def baseline(self, batch: int) -> Baseline:
        return next(b for b in self.baselines if b.batch == batch)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["recommended"] = {str(b): k for b, k in self.recommended.items()}
        return out


@dataclass(frozen=True)
class Deployment:
    """Where a target and its draft are served for a prediction: the accelerator, the devices the target is split
    across (`tp`) and the draft (`draft_tp`, default tp), the tokens of history per request, and the draft forwards
    per step when the engine runs a fixed number whatever k (default k)."""

    accelerator: Accelerator
    tp: int = 1
    draft_tp: int | None = None
    context: int = 4096
    draft_forwards: int | None = None

    @property
    def draft_devices(self) -> int:
        """The devices the draft runs on: `draft_tp`, else the target's `tp`."""
        return self.tp if self.draft_tp is None else self.draft_tp


def step_seconds(target: ModelCost, draft: ModelCost, where: Deployment, k: int, batch: int) -> float:
    """One speculative step: `draft_forwards` (default k) one-token draft forwards + one (k + 1)-token target forward."""
    accelerator, tp, context = where.accelerator, where.tp, where.context
    drafts = k if where.draft_forwards is None else where.draft_forwards
    d = forward_time(draft, accelerator, where.draft_devices, batch, 1, context).seconds
    return drafts * d + forward_time(target, accelerator, tp, batch, k + 1, context).seconds


def predict(
    target: ModelCost,
    draft: ModelCost,
    acceptance: Acceptance,
    where: Deployment,
    ks: Iterable[int] = KS,
    batches: Sequence[int] = BATCHES,
) -> SpeedReport:
    """Predicted decoding speed with and without `draft` for every k in `ks` the acceptance covers and every batch,
    served as `where` says."""
    accelerator, tp, context = where.accelerator, where.tp, where.context
    ks = sorted(set(ks))
    if not ks or ks[0] < 1 or not batches or min(batches) < 1:
        raise OptionError("k and batch sizes must be at least 1")
    draft_tp = where.draft_devices
    baselines = []
    for b in batches:
        t = forward_time(target, accelerator, tp, b, 1, context).seconds
        baselines.append(Baseline(b, t, 1.0 / t, b / t))
    rows = []
    for k in ks:
        tokens = acceptance.expected_tokens(k)
        if tokens is None:
            continue
        for base in baselines:
            step = step_seconds(target, draft, where, k, base.batch)
            tpot = step / tokens
            rows.append(Row(k, base.batch, tokens, step, tpot, 1.0 / tpot, base.batch / tpot, base.tpot_s / tpot))
    recommended: dict[int, int | None] = {}
    for b in batches:
        best = max((r for r in rows if r.batch == b), key=lambda r: r.tokens_per_s, default=None)
        recommended[b] = best.k if best is not None and best.speedup > 1.0 else None
    unmeasured = [k for k in ks if k > acceptance.measured_k]
    notes = []
    if unmeasured:
        notes.append(
            f"acceptance measured for k <= {acceptance.measured_k} only: no prediction for k = "
            f"{', '.join(map(str, unmeasured))}, and the recommendation is among k <= {acceptance.measured_k} "
            f"(evaluate with -k {max(ks)} to cover them)"
        )
    return SpeedReport(
        target=target.name,
        draft=draft.name,
        gpu=accelerator.name,
        tp=tp,
        draft_tp=draft_tp,
        context=context,
        acceptance=list(acceptance.per_position),
        acceptance_source=acceptance.source,
        baselines=baselines,
        rows=rows,
        recommended=recommended,
        unmeasured_ks=unmeasured,
        constants={"LAYER_LATENCY_S": LAYER_LATENCY_S},
        notes=notes,
    )


__all__ = [
    "Acceptance",
    "BATCHES",
    "KS",
    "Baseline",
    "Row",
    "SpeedReport",
    "predict",
    "read_acceptance",
    "step_seconds",
]
