"""The speed report as text: the table `mtp2draft speedup` prints, and the short section the model card carries.

What this module does not do: compute anything (`model.py`) or decide where text goes (`cli/evaluation.py`, `hub/card.py`).
"""

from __future__ import annotations

from mtp2draft.speed.model import SpeedReport


def _cell(tokens_per_s: float, speedup: float) -> str:
    return f"{tokens_per_s:8.1f} {speedup:4.2f}x"


def speedup_text(report: SpeedReport) -> str:
    """Per-request and aggregate tokens/s for each batch, without the draft and with k = 1.. (speedup beside)."""
    ks = sorted({r.k for r in report.rows})
    batches = [b.batch for b in report.baselines]
    per_pos = " / ".join(f"{a:.2f}" for a in report.acceptance)
    lines = [
        f"target {report.target}, draft {report.draft}",
        f"on {report.tp}x {report.gpu} (TP {report.tp}, draft TP {report.draft_tp}), context {report.context} tokens",
        f"acceptance per position {per_pos} ({report.acceptance_source})",
    ]
    for title, per_request in (("tokens/s per request", True), ("aggregate tokens/s", False)):
        head = f"{'batch':>5}  {'no draft':>9}  " + "  ".join(f"{'k=' + str(k):>14}" for k in ks)
        lines += ["", f"predicted {title} (speedup over no draft)", head]
        for b in batches:
            base = report.baseline(b)
            cells = []
            for k in ks:
                r = report.row(k, b)
                assert r is not None
                cells.append(_cell(r.tokens_per_s if per_request else r.aggregate_tokens_per_s, r.speedup))
            plain = base.tokens_per_s if per_request else base.aggregate_tokens_per_s
            lines.append(f"{b:>5}  {plain:>9.1f}  " + "  ".join(f"{c:>14}" for c in cells))
    tpot = []
    for b in batches:
        k = report.recommended[b]
        row = report.row(k, b) if k else None
        after = f"{row.tpot_s * 1e3:.1f} at k={k}" if row else "no gain"
        tpot.append(f"batch {b}: {report.baseline(b).tpot_s * 1e3:.1f} -> {after}")
    lines += ["", "time per output token (ms): " + ", ".join(tpot)]
    lines.append("recommended k: " + recommended_text(report))
    lines += [f"note: {n}" for n in report.notes]
    lines.append(
        f"model: roofline (weights, experts touched, KV, FLOPs) + {report.constants['LAYER_LATENCY_S'] * 1e3:.3f} ms "
        "per decoder layer per forward, fit once on published non-speculative figures (docs/speed.md)"
    )
    return "\n".join(lines)


def recommended_text(report: SpeedReport) -> str:
    parts = []
    for b, k in report.recommended.items():
        parts.append(f"{k} at batch {b}" if k else f"none at batch {b} (no measured k beats decoding without it)")
    return "; ".join(parts)


def card_lines(report: SpeedReport, subject: str, batches: tuple[int, ...] = (1, 8, 32, 64)) -> list[str]:
    """The model card's 'Predicted speed' section: one row per batch, the recommended k's speed beside none."""
    out = [
        "## Predicted speed",
        "",
        f"Predicted by mtp2draft's speed model (a roofline plus one fitted latency, checked against published engine "
        f"figures: docs/speed.md) for {subject} on {report.tp}x {report.gpu.upper()} (TP {report.tp}), "
        f"context {report.context} tokens, from the acceptance measured above. A prediction, not a measurement.",
        "",
        "| batch | tokens/s per request, no draft | with this draft | k | speedup |",
        "|---|---|---|---|---|",
    ]
    for b in batches:
        if b not in report.recommended:
            continue
        base, k = report.baseline(b), report.recommended[b]
        row = report.row(k, b) if k else None
        if row is None:
            out.append(f"| {b} | {base.tokens_per_s:.1f} | no gain at any measured k | - | - |")
        else:
            out.append(f"| {b} | {base.tokens_per_s:.1f} | {row.tokens_per_s:.1f} | {k} | {row.speedup:.2f}x |")
    if report.unmeasured_ks:
        out += ["", f"Acceptance was measured for k <= {len(report.acceptance)} only: larger k is not predicted."]
    return out


__all__ = ["card_lines", "recommended_text", "speedup_text"]
