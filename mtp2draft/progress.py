"""How long work tells its progress and sizes to a person: the `Progress` sink every stage reports through (one line
per call; the CLI prints it on stderr, tests drop it), the meter of a counted piece of work, human-readable byte
sizes and counts, and transformers' own logs silenced while mtp2draft loads a model. Torch-free.

What this module does not do: draw bars or choose the stream (`cli/progress.py` does, for the CLI).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# Every stage reports progress through a callable taking one line; the CLI prints it on stderr, tests drop it.
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """The default progress sink: drops the line."""


class LineMeter:
    """A counted piece of long work (tensor bytes, steps, prompts, sequences) told through a plain `Progress` sink:
    one line at each tenth of the way. The CLI's sink (`cli.progress.Reporter`) shows a bar instead."""

    def __init__(self, progress: Progress, desc: str, total: int, unit: str = "it", initial: int = 0) -> None:
        self.progress, self.desc, self.total, self.unit, self.n = progress, desc, max(total, 0), unit, initial
        self.tenths = self._tenths()

    def _tenths(self) -> int:
        return 10 if self.total == 0 else min(10, self.n * 10 // self.total)

    def update(self, n: int = 1, note: str = "") -> None:
        self.n += n
        tenths = self._tenths()
        if tenths > self.tenths or self.n == self.total:
            self.tenths = tenths
            done = human_count(self.n, self.unit)
            self.progress(f"{self.desc}: {done}/{human_count(self.total, self.unit)}" + (f"  {note}" if note else ""))

    def write(self, line: str) -> None:
        self.progress(line)

    def close(self) -> None:
        """Nothing to release: lines are already out."""


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (powers of 1024, named as such)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_count(n: int, unit: str) -> str:
    """'3.2 MiB' for bytes (unit "B"), '12 step' otherwise."""
    return human_bytes(n) if unit == "B" else f"{n} {unit}"


def meter(progress: Progress, desc: str, total: int, unit: str = "it", initial: int = 0) -> LineMeter:
    """The meter of a counted piece of work: the sink's own (`progress.meter`, a bar with rate and ETA on a
    terminal) when it has one, else a `LineMeter` of plain lines. Every long loop of a stage reports through this."""
    make = getattr(progress, "meter", None)
    return make(desc, total, unit, initial) if make else LineMeter(progress, desc, total, unit, initial)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' info/warning logs (load reports, deprecations) for the duration."""
    import warnings

    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars of a 5 MB model are noise on stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
