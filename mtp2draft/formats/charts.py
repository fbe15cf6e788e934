"""The pictures a draft directory carries: acceptance per draft position (`evaluate --save`, linked by the model
card) and distill's training curves, as PNG files beside the draft. Both stages that draw them (evaluation/, train/)
import this module; it imports neither.

Drawn with matplotlib, an optional extra (`pip install "mtp2draft[chart]"`): without it no chart is written and the
caller says so once; nothing else depends on it. `acceptance_series` / `training_series` are what the charts draw,
taken from the saved report or history as they are, so a test can hold the picture to the numbers.

What this module does not do: measure anything (evaluation/, train/) or decide where a chart is linked
(`hub/card.py`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtp2draft.kinds import ACCEPTANCE_CHART, TRAINING_CHART
from mtp2draft.manifest import temporary_beside

EXTRA = 'pip install "mtp2draft[chart]"'
SIZE = (10.0, 4.0)  # inches; at DPI 100 the PNG is 1000 x 400
DPI = 100


def unavailable() -> str | None:
    """Why no chart can be drawn here, or None: the extra to install when matplotlib is absent, else what is broken
    (a Pillow or NumPy that fails to import says so, rather than asking to install what is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name == "matplotlib":
            return f"matplotlib is not installed: {EXTRA}"
    except Exception:
        pass  # reported below, with what the drawing import says
    try:
        import matplotlib.backends.backend_agg  # noqa: F401 - what drawing a PNG imports (Pillow included)
    except ImportError as exc:
        return f"the chart extra is installed but does not import ({type(exc).__name__}: {exc})"
    except Exception as exc:  # a broken install fails in many ways; the charts are optional, the message is not
        return f"the chart extra is installed but does not import ({type(exc).__name__}: {exc})"
    return None


def available() -> bool:
    return unavailable() is None


def acceptance_series(report: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    """draft name -> {"conditional": P(j accepted | 1..j-1 accepted), "per_draft": P(j accepted)}, j = 1..k, as the
    report holds them (per_draft empty for reports that predate it)."""
    return {
        str(r["name"]): {
            "conditional": [float(x) for x in r["acceptance_per_position"]],
            "per_draft": [float(x) for x in r.get("per_draft_acceptance") or []],
        }
        for r in report.get("results") or []
    }


def _figure(panels: int) -> tuple[Any, Sequence[Any]]:
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, never a display server
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def acceptance_figure(report: Mapping[str, Any]) -> Any:
    """Two panels over draft positions 1..k, one line per draft (the raw MTP head beside the distilled draft):
    conditional acceptance, and acceptance per draft; the legend carries each draft's mean acceptance length."""
    series = acceptance_series(report)
    lengths = {str(r["name"]): r.get("mean_acceptance_length") for r in report.get("results") or []}
    fig, (left, right) = _figure(2)
    for name, s in series.items():
        mean = lengths.get(name)
        label = f"{name} (accept len {mean:.2f})" if isinstance(mean, int | float) else name
        left.plot(range(1, len(s["conditional"]) + 1), s["conditional"], marker="o", label=label)
        if s["per_draft"]:
            right.plot(range(1, len(s["per_draft"]) + 1), s["per_draft"], marker="o", label=label)
    for ax, title in ((left, "P(j accepted | 1..j-1 accepted)"), (right, "P(j accepted) per draft")):
        ax.set(title=title, xlabel="draft position j", ylim=(0, 1.02))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    left.set_ylabel("acceptance")
    left.legend(loc="lower left", fontsize="small")
    fig.suptitle(f"Acceptance per draft position ({report.get('data') or 'prompts'})", fontsize="medium")
    return fig


def training_series(history: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """{"step": [...], "loss": [...], "accuracy": [[top-1 of draft step 1..K] per logged step]} from distill's
    history."""
    return {
        "step": [int(h["step"]) for h in history],
        "loss": [float(h["loss"]) for h in history],
        "accuracy": [[float(a) for a in h.get("accuracy") or []] for h in history],
    }


def training_figure(history: Sequence[Mapping[str, Any]]) -> Any:
    """Loss, and top-1 agreement with the target at each unrolled draft step, against the training step."""
    s = training_series(history)
    fig, (loss, acc) = _figure(2)
    loss.plot(s["step"], s["loss"])
    loss.set(title="training loss", xlabel="step")
    for j in range(max((len(a) for a in s["accuracy"]), default=0)):
        acc.plot(s["step"], [a[j] if j < len(a) else float("nan") for a in s["accuracy"]], label=f"draft step {j + 1}")
    acc.set(title="top-1 agreement with the target", xlabel="step", ylim=(0, 1.02))
    acc.legend(loc="lower right", fontsize="small")
    for ax in (loss, acc):
        ax.grid(alpha=0.3)
    return fig


def png(fig: Any) -> bytes:
    """`fig` drawn as PNG bytes: drawing fails here, before anything is written."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save(fig: Any, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` (drawn first, then written whole through a fresh temporary name)."""
    path = Path(path)
    data = png(fig)
    with temporary_beside(path, "wb") as (fh, _):
        fh.write(data)
    return path


def acceptance_png(report: Mapping[str, Any]) -> bytes | None:
    """The acceptance chart of an evaluation report, drawn; None without matplotlib or results."""
    if not available() or not acceptance_series(report):
        return None
    return png(acceptance_figure(report))


def save_acceptance_chart(report: Mapping[str, Any], folder: str | Path) -> Path | None:
    """`acceptance.png` in `folder` for an evaluation report with results; None without matplotlib or results."""
    data = acceptance_png(report)
    if data is None:
        return None
    path = Path(folder) / ACCEPTANCE_CHART
    with temporary_beside(path, "wb") as (fh, _):
        fh.write(data)
    return path


def save_training_chart(history: Sequence[Mapping[str, Any]], folder: str | Path) -> Path | None:
    """`training.png` in `folder` for distill's history; None without matplotlib or a logged step."""
    if not available() or not history:
        return None
    return save(training_figure(history), Path(folder) / TRAINING_CHART)
