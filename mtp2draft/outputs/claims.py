"""Claims on output directories: a run claims `--out` with a lock file created beside it with O_EXCL, so two runs can
never both write it; a claim left by a killed run on this host is recognised and taken over, and a reader checks
that no live run is writing what it reads (`being_written`).

What this module does not do: write or rename the directory (`outputs/directories.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from mtp2draft.errors import OutputExistsError
from mtp2draft.redact import scrub

# A run claims its output by creating this file beside it with O_EXCL (one winner, whatever the interleaving); it holds
# the claimant's pid and host, so a claim left by a killed run on this host is recognised and taken over.
LOCK_SUFFIX = ".mtp2draft-lock"
_held = threading.local()  # the claims this thread holds: a stage inside a claimed run (distill's final write) nests


def lock_path(out: str | Path) -> Path:
    """The lock file that claims output directory `out` (a hidden sibling, so it never lands inside the output)."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}{LOCK_SUFFIX}"


def _stale(lock: Path) -> bool:
    """Whether `lock` was left by a process of this host that no longer runs (killed before it could remove it)."""
    try:
        owner = json.loads(lock.read_text())
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable (being written, or not ours): never taken over
    if host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _take(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "command": scrub(_command())}, fh)
    return True


def _command() -> str:
    from mtp2draft.redact import command_line

    return command_line()


@contextlib.contextmanager
def claim_output(out: str | Path) -> Iterator[Path]:
    """Hold the claim on output directory `out` for the duration (`lock_path(out)`, created with O_EXCL): a second
    run into the same `out` is refused in one line while this one runs, and two runs can never both write it.
    Re-entrant within one thread; the parent directory is created if needed (and removed again if it stays empty)."""
    out = Path(os.path.abspath(out))
    held = getattr(_held, "paths", None)
    if held is None:
        held = _held.paths = set()
    if out in held:
        yield out
        return
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path(out)
    if not _take(lock) and not (_stale(lock) and _retake(lock)):
        _remove_empty(made)
        raise OutputExistsError(
            f"--out {out} is being written by another mtp2draft run (its claim is {lock}): wait for it to finish, "
            "or delete that file if no run is writing there"
        )
    held.add(out)
    try:
        yield out
    finally:
        held.discard(out)
        lock.unlink(missing_ok=True)
        _remove_empty(made)


def being_written(path: str | Path) -> Path | None:
    """The claim (`lock_path`) of a live mtp2draft run writing `path` at this moment, or None (no claim, or one left
    by a killed run). Readers do not claim what they read (two runs may read one draft); they check this instead."""
    lock = lock_path(path)
    return lock if lock.is_file() and not _stale(lock) else None


def _retake(lock: Path) -> bool:
    """Replace a stale claim: the stale file is moved away under a unique name first, so of several runs taking it
    over at once exactly one moves it (the others find it gone) and only then competes for a new one with O_EXCL."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}-{threading.get_ident()}")
    try:
        os.replace(lock, aside)
    except FileNotFoundError:
        pass
    else:
        aside.unlink(missing_ok=True)
    return _take(lock)


def _remove_empty(dirs: list[Path]) -> None:
    for d in dirs:  # innermost first
        with contextlib.suppress(OSError):
            d.rmdir()
