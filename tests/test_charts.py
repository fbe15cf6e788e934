"""The charts a user looks at (mtp2draft/formats/charts.py): drawn from the numbers saved beside them, written where the
commands promise, linked by the model card, and never left beside another evaluation's numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from mtp2draft.evaluation.saved import save_evaluation
from mtp2draft.formats import charts

REPORT = {
    "data": "heldout.jsonl",
    "results": [
        {
            "name": "distilled mtp",
            "num_draft_tokens": 3,
            "mean_acceptance_length": 2.9,
            "acceptance_per_position": [0.81, 0.7, 0.55],
            "per_draft_acceptance": [0.81, 0.567, 0.312],
        },
        {
            "name": "raw MTP head (baseline)",
            "num_draft_tokens": 3,
            "mean_acceptance_length": 2.2,
            "acceptance_per_position": [0.8, 0.4, 0.3],
            "per_draft_acceptance": [0.8, 0.32, 0.096],
        },
    ],
}


def _lines(ax) -> dict[str, list[float]]:
    return {line.get_label().split(" (accept len")[0]: [float(y) for y in line.get_ydata()] for line in ax.get_lines()}


def test_acceptance_chart_draws_the_reports_numbers_per_draft_and_metric() -> None:
    fig = charts.acceptance_figure(REPORT)
    conditional, per_draft = fig.axes
    for r in REPORT["results"]:
        assert _lines(conditional)[r["name"]] == r["acceptance_per_position"]
        assert _lines(per_draft)[r["name"]] == r["per_draft_acceptance"]
    assert [float(x) for x in conditional.get_lines()[0].get_xdata()] == [1, 2, 3]  # draft positions 1..k
    labels = [t.get_text() for t in conditional.get_legend().get_texts()]
    assert labels == ["distilled mtp (accept len 2.90)", "raw MTP head (baseline) (accept len 2.20)"]


def test_save_evaluation_writes_a_png_that_decodes_at_its_size(tmp_path: Path) -> None:
    saved, chart = save_evaluation(tmp_path, REPORT)
    assert json.loads(saved.read_text()) == REPORT and chart == tmp_path / charts.ACCEPTANCE_CHART
    pixels = imread(chart)
    assert pixels.shape[:2] == (charts.SIZE[1] * charts.DPI, charts.SIZE[0] * charts.DPI)
    assert pixels.std() > 0.05  # not a blank image
    assert not list(tmp_path.glob(".*.tmp"))


def test_without_matplotlib_no_chart_and_no_stale_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_evaluation(tmp_path, REPORT)
    monkeypatch.setattr(charts, "available", lambda: False)
    saved, chart = save_evaluation(tmp_path, {**REPORT, "data": "other.jsonl"})
    assert chart is None and saved.is_file() and not (tmp_path / charts.ACCEPTANCE_CHART).exists()


def test_training_chart_draws_loss_and_each_steps_top1() -> None:
    history = [
        {"step": 10, "loss": 3.0, "accuracy": [0.5, 0.3]},
        {"step": 20, "loss": 2.5, "accuracy": [0.6, 0.4]},
    ]
    loss, accuracy = charts.training_figure(history).axes
    assert [float(y) for y in loss.get_lines()[0].get_ydata()] == [3.0, 2.5]
    assert _lines(accuracy) == {"draft step 1": [0.5, 0.6], "draft step 2": [0.3, 0.4]}
    assert [int(x) for x in loss.get_lines()[0].get_xdata()] == [10, 20]


def test_card_links_the_chart_and_export_carries_it(build, tmp_path: Path) -> None:
    from mtp2draft.conversion import convert
    from mtp2draft.formats.export import export
    from mtp2draft.hub.card import model_card

    convert(str(build("deepseek_v3", num_hidden_layers=2)), tmp_path / "mtp", to="mtp")
    link = f"]({charts.ACCEPTANCE_CHART})"
    (tmp_path / "mtp" / "evaluation.json").write_text(json.dumps(REPORT))
    assert link not in str(model_card(tmp_path / "mtp"))  # no chart drawn: no link
    save_evaluation(tmp_path / "mtp", REPORT)
    assert link in str(model_card(tmp_path / "mtp"))
    export(tmp_path / "mtp", "nextn", tmp_path / "out")
    assert (tmp_path / "out" / charts.ACCEPTANCE_CHART).read_bytes() == (
        tmp_path / "mtp" / charts.ACCEPTANCE_CHART
    ).read_bytes()
    assert link in str(model_card(tmp_path / "out"))


def _broken(*_: object) -> None:
    raise OSError("cannot write the PNG: a damaged font cache")


def test_a_chart_that_fails_keeps_the_figures_and_never_the_old_chart(tmp_path: Path, monkeypatch) -> None:
    """evaluate --save draws before it writes: a drawing that fails still saves the new figures, removes the chart
    of the earlier evaluation (push would publish it beside numbers it does not show) and says why."""
    save_evaluation(tmp_path, REPORT)
    monkeypatch.setattr(charts, "acceptance_figure", _broken)
    said: list[str] = []
    saved, chart = save_evaluation(tmp_path, {**REPORT, "data": "other.jsonl"}, progress=said.append)
    assert chart is None and json.loads(saved.read_text())["data"] == "other.jsonl"
    assert not (tmp_path / charts.ACCEPTANCE_CHART).exists()
    assert len(said) == 1 and "damaged font cache" in said[0]


def test_a_failing_training_chart_keeps_the_distilled_draft(target, text_data, tmp_path: Path, monkeypatch, capsys):
    from mtp2draft.cli.app import main
    from mtp2draft.conversion import convert

    convert(str(target("mimo")), tmp_path / "d")
    monkeypatch.setattr(charts, "training_figure", _broken)
    argv = ["distill", str(tmp_path / "d"), "--target", str(target("mimo")), "--data", str(text_data), "--out",
            str(tmp_path / "ft"), "--steps", "2", "--batch-size", "2", "--max-length", "32", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "training chart could not be drawn" in err and "Traceback" not in err
    assert (tmp_path / "ft" / "model.safetensors").is_file() and not (tmp_path / "ft" / charts.TRAINING_CHART).exists()


def test_a_broken_chart_install_is_named_not_sent_to_install(monkeypatch) -> None:
    """A matplotlib whose drawing backend (or Pillow under it) fails to import is reported as broken, with the
    error; only a missing matplotlib asks for the extra."""
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    why = charts.unavailable()
    assert why is not None and "installed but does not import" in why and "backend_agg" in why
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends", None)
    assert charts.EXTRA in (charts.unavailable() or "")
