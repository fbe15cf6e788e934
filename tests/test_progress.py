"""The one progress facility: `progress.meter` gives plain lines at each tenth through a plain sink, the CLI's Reporter a
tqdm bar on a terminal and the same lines elsewhere; `--help` still imports no torch (tests/test_imports.py)."""

from __future__ import annotations

import io as stdio

from mtp2draft.cli.progress import Reporter
from mtp2draft.progress import LineMeter, meter


def test_a_plain_sink_gets_a_line_at_each_tenth_and_at_the_end() -> None:
    lines: list[str] = []
    bar = meter(lines.append, "convert", 1000, "B")
    assert isinstance(bar, LineMeter)
    for _ in range(40):
        bar.update(25)
    assert len(lines) == 10 and lines[-1] == "convert: 1000 B/1000 B"
    steps: list[str] = []
    bar = meter(steps.append, "distill", 3, "step", initial=1)
    bar.update(1, "loss 1.0")
    bar.update(1)
    assert steps == ["distill: 2 step/3 step  loss 1.0", "distill: 3 step/3 step"]


class _Terminal(stdio.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cli_reporter_shows_a_byte_bar_on_a_terminal_and_lines_elsewhere(monkeypatch) -> None:
    import importlib

    hf_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")

    # the loopback Hub of the suite turns huggingface_hub's bars off (HF_HUB_DISABLE_PROGRESS_BARS): on for this test
    monkeypatch.setattr(hf_tqdm, "are_progress_bars_disabled", lambda *a, **k: False)
    term = _Terminal()
    bar = Reporter(term).meter("convert", 4 * 1024 * 1024, "B")
    bar.update(2 * 1024 * 1024)
    bar.write("a log line")
    bar.close()
    text = term.getvalue()
    assert "convert:  50%" in text and "2.00M/4.00M" in text and "B/s" in text  # scaled bytes, with a rate
    assert "a log line\n" in text
    pipe = stdio.StringIO()
    bar = Reporter(pipe).meter("evaluate", 2, "prompt")
    bar.update(1)
    bar.update(1)
    assert pipe.getvalue().splitlines() == ["evaluate: 1 prompt/2 prompt", "evaluate: 2 prompt/2 prompt"]
