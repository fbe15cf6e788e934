"""The one progress facility of the command line: where long work shows itself, on stderr.

`Reporter` is the `Progress` sink every command hands the library: a line goes to stderr; a counted piece of work
(`progress.meter`: tensor bytes of a conversion, distill steps, evaluated prompts, dumped sequences) becomes a bar with
rate and ETA as huggingface_hub shows downloads (its tqdm, which honours HF_HUB_DISABLE_PROGRESS_BARS) when stderr
is a terminal, and plain lines at each tenth of the way when it is not (CI logs, pipes).

What this module does not do: decide what is long (the stages call `progress.meter`) or print data (stdout is for data).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from mtp2draft.progress import LineMeter


class _Bar:
    """A tqdm bar behind the `LineMeter` interface (update / write / close)."""

    def __init__(self, bar: Any, stream: TextIO) -> None:
        self.bar, self.stream = bar, stream

    def update(self, n: int = 1, note: str = "") -> None:
        if note:
            self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(n)

    def write(self, line: str) -> None:
        self.bar.write(line, file=self.stream)  # above the bar, on the bar's stream (tqdm's default is stdout)

    def close(self) -> None:
        self.bar.close()


class Reporter:
    """Progress and logs on `stream` (stderr), so stdout stays data."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stderr  # looked up late: tests capture sys.stderr after the CLI module loads

    def __call__(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    def meter(self, desc: str, total: int, unit: str = "it", initial: int = 0) -> Any:
        """A `_Bar` on a terminal, else `progress.LineMeter` lines."""
        if not self.out.isatty():
            return LineMeter(self, desc, total, unit, initial)
        from huggingface_hub.utils import tqdm

        scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
        bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.out, dynamic_ncols=True, **scale)
        return _Bar(bar, self.out)
