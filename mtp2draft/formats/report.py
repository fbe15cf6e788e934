"""The evaluation report as `evaluate --save` writes it and every reader takes it (`speedup`, `push`'s model card):
one typed parser, so a file that is not such a report is one line naming the file and the field, never a traceback
three stages later, and the writer checks what it writes with the same rules.

A report is a JSON object with `results`, a non-empty list of one object per draft (the first is the draft, the rest
its baselines), each with `acceptance_per_position` (numbers in [0, 1], conditional acceptance at draft position j)
and `mean_acceptance_length` (a number >= 1, bonus token included). The top-level headline keys repeat the first
draft's figures (`decode.with_headline`); a report holding only them (`{"acceptance_per_position": [...]}`, written
by hand) is read as one draft. `target` and `target_family` say what the acceptance was measured against
(`target_family` is absent from reports written before it was recorded).

What this module does not do: measure anything (`decode.py`) or decide what a reader does with the figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtp2draft.errors import DataError
from mtp2draft.kinds import EVALUATION_FILE

REPORT = "an `mtp2draft evaluate --save` report"


@dataclass(frozen=True)
class DraftFigures:
    """One draft's measured acceptance."""

    acceptance_per_position: tuple[float, ...]
    mean_acceptance_length: float | None
    name: str | None = None


@dataclass(frozen=True)
class EvaluationReport:
    source: str  # the file it was read from (or "report" for one in memory)
    results: tuple[DraftFigures, ...]  # the draft first, then its baselines
    target: str | None = None
    target_family: str | None = None

    @property
    def draft(self) -> DraftFigures:
        return self.results[0]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _figures(entry: Any, where: str) -> DraftFigures:
    if not isinstance(entry, dict):
        raise DataError(f"{where} must be an object holding a draft's figures, got {_kind(entry)} {entry!r}")
    per = entry.get("acceptance_per_position")
    if not isinstance(per, list) or not per:
        raise DataError(f"{where} has no acceptance_per_position (is it {REPORT}?)")
    if not all(
        isinstance(a, int | float) and not isinstance(a, bool) and math.isfinite(a) and 0.0 <= a <= 1.0 for a in per
    ):
        raise DataError(f"{where}: acceptance_per_position must be numbers in [0, 1], got {per!r}")
    mal = entry.get("mean_acceptance_length")
    if mal is not None and (isinstance(mal, bool) or not isinstance(mal, int | float) or not math.isfinite(mal)):
        raise DataError(f"{where}: mean_acceptance_length must be a number, got {mal!r}")
    if mal is not None and not 1.0 <= mal <= len(per) + 1:  # one target token per step, at most k drafted on top
        raise DataError(
            f"{where}: mean_acceptance_length {mal} is impossible at k = {len(per)} draft positions (it lies in "
            f"[1, {len(per) + 1}]: the target's own token plus those accepted)"
        )
    name = entry.get("name")
    return DraftFigures(
        tuple(float(a) for a in per), None if mal is None else float(mal), name if isinstance(name, str) else None
    )


def parse_report(report: Any, source: str = "report") -> EvaluationReport:
    """`report` (a JSON value) as an evaluation report, or one DataError line naming `source` and the field."""
    if not isinstance(report, dict):
        raise DataError(f"{source}: not {REPORT} (a JSON object), got a {_kind(report)}")
    results = report.get("results")
    if results is None:
        figures = (_figures(report, source),)
    elif not isinstance(results, list) or not results:
        raise DataError(f"{source}: results must be a non-empty list of the drafts' figures, got {_kind(results)}")
    else:
        figures = tuple(_figures(entry, f"{source}: results[{i}]") for i, entry in enumerate(results))
    target, family = report.get("target"), report.get("target_family")
    return EvaluationReport(
        source,
        figures,
        target if isinstance(target, str) else None,
        family if isinstance(family, str) else None,
    )


def read_report(path: str | Path) -> EvaluationReport:
    """The evaluation report in `path` (an evaluation.json, or a draft directory holding one)."""
    path = Path(path)
    file = path / EVALUATION_FILE if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: no evaluation (write one with `mtp2draft evaluate --save`)")
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{file}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{file}: not UTF-8 text (is it {REPORT}?)") from None
    return parse_report(report, str(file))


__all__ = ["DraftFigures", "EvaluationReport", "parse_report", "read_report"]
