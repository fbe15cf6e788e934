"""`evaluate --save`: the evaluation a draft directory keeps beside its weights (evaluation.json and its chart).

The figures are saved only into the draft that was measured: its identity is taken before it is read
(`saving_into`) and checked again under the draft's claim when they are written (`save_evaluation`), so a draft
replaced meanwhile never carries another's figures.

What this module does not do: measure (`evaluation/decode.py`), or define the report's fields (`formats/report.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtp2draft.errors import DraftError, OutputExistsError
from mtp2draft.formats import charts
from mtp2draft.formats.report import parse_report
from mtp2draft.kinds import EVALUATION_FILE
from mtp2draft.manifest import add_written, temporary_beside, write_json
from mtp2draft.outputs.claims import being_written, claim_output
from mtp2draft.outputs.identity import dir_identity
from mtp2draft.progress import Progress, quiet


def saving_into(draft_dir: str | Path) -> tuple | None:
    """Before `evaluate --save` reads the draft: refuse a draft another run is writing now, and give the identity
    `save_evaluation` checks the directory against (None when `draft_dir` is no directory: loading it refuses)."""
    if not Path(draft_dir).is_dir():
        return None
    if being_written(draft_dir):
        raise DraftError(
            f"{draft_dir} is being replaced by another mtp2draft run: its figures could not be saved with it; "
            "evaluate it when that run ends"
        )
    return dir_identity(draft_dir)


def save_evaluation(
    draft_dir: str | Path, report: dict[str, Any], measured: tuple | None = None, progress: Progress = quiet
) -> tuple[Path, Path | None]:
    """evaluation.json in `draft_dir`, and its chart (`charts.ACCEPTANCE_CHART`) where matplotlib is installed: (the
    json's path, the chart's or None). The chart is drawn before anything is written; when it cannot be drawn the
    evaluation is still saved, the chart of an earlier evaluation is removed (never shown beside another
    evaluation's numbers) and `progress` says why. Both files join the draft's manifest (`manifest.add_written`).

    measured: the draft's `outputs.identity.dir_identity` taken before it was read. The write holds the draft's
    claim (so a `convert --overwrite` cannot replace it meanwhile) and is refused when the directory is no longer the
    draft that was measured: another draft never carries this one's figures."""
    path = Path(draft_dir) / EVALUATION_FILE
    chart_path = Path(draft_dir) / charts.ACCEPTANCE_CHART
    parse_report(report, str(path))  # written by the rules its readers read it with (`report.py`)
    try:
        drawn = charts.acceptance_png(report)
    except Exception as exc:  # a cosmetic step: the measured figures are kept whatever drawing does
        drawn = None
        progress(f"warning: the acceptance chart could not be drawn ({type(exc).__name__}: {exc}); figures saved")
    try:
        with claim_output(draft_dir):
            if measured is not None and (not Path(draft_dir).is_dir() or dir_identity(draft_dir) != measured):
                raise DraftError(
                    f"{draft_dir} was replaced by another draft while it was evaluated: {EVALUATION_FILE} not saved "
                    "(the figures belong to the draft that was there); evaluate the new draft"
                )
            chart_path.unlink(missing_ok=True)  # before the new figures land: never the old chart beside them
            write_json(path, report)
            if drawn is not None:
                with temporary_beside(chart_path, "wb") as (fh, _):
                    fh.write(drawn)
            add_written(Path(draft_dir), EVALUATION_FILE, charts.ACCEPTANCE_CHART)
    except OutputExistsError:  # the claim is held: a run is writing a draft there now
        raise DraftError(
            f"{draft_dir} is being replaced by another mtp2draft run: {EVALUATION_FILE} not saved (the figures "
            "belong to the draft that was there); evaluate the new draft when that run ends"
        ) from None
    return path, chart_path if drawn is not None else None
