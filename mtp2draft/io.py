"""Writing outputs safely: directories that appear complete or not at all, claimed and marked as mtp2draft's (and a
distill run's checkpoint folder marked as one, told apart from a draft), and safetensors files streamed tensor by
tensor so peak memory tracks the largest tensor group rather than the whole file; and the progress-callback type
every stage reports through.

What this module does not do: decide what to write (the stages do) or read checkpoints (`checkpoint/reader.py`).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import math
import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.dtypes import ST_DTYPES, TORCH_TO_ST
from mtp2draft.errors import DraftError, OutputExistsError
from mtp2draft.manifest import (
    CHECKPOINT_ENTRY,
    CHECKPOINTS_MARKER,
    MARKER,
    PARTIAL,
    foreign_file,
    is_ours,
    mark,
    temporary_beside,
    umask,
)
from mtp2draft.redact import scrub

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


def human_count(n: int, unit: str) -> str:
    """'3.2 MiB' for bytes (unit "B"), '12 step' otherwise."""
    from mtp2draft.units import human_bytes

    return human_bytes(n) if unit == "B" else f"{n} {unit}"


def meter(progress: Progress, desc: str, total: int, unit: str = "it", initial: int = 0) -> LineMeter:
    """The meter of a counted piece of work: the sink's own (`progress.meter`, a bar with rate and ETA on a
    terminal) when it has one, else a `LineMeter` of plain lines. Every long loop of a stage reports through this."""
    make = getattr(progress, "meter", None)
    return make(desc, total, unit, initial) if make else LineMeter(progress, desc, total, unit, initial)


# A distill run's checkpoint folder (`<out>.checkpoints`, or --checkpoint-dir) carries CHECKPOINTS_MARKER as well: it
# tells the folder apart from a draft mtp2draft wrote there (`convert --out foo.checkpoints`), which a later
# `distill --out foo` must never fill with checkpoints nor delete when it finishes.
_OLD_BEST_FILES = {"best.json", "best.json.tmp", "model.safetensors"}


def is_checkpoint_folder(folder: Path) -> bool:
    """Whether `folder` is a distill run's checkpoint folder: it carries `CHECKPOINTS_MARKER`; or, written by an older
    mtp2draft, every entry is one a run writes there and it carries `MARKER`, or it only holds the `best/` that older
    runs killed before their first checkpoint left unmarked."""
    if (folder / CHECKPOINTS_MARKER).is_file():
        return True
    entries = list(folder.iterdir())
    if not all(CHECKPOINT_ENTRY.match(p.name) for p in entries):
        return False
    if is_ours(folder):
        return True
    return [p.name for p in entries] == ["best"] and all(p.name in _OLD_BEST_FILES for p in entries[0].iterdir())


def check_checkpoint_folder(folder: Path, inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse a checkpoint folder that is an input, a file, or a non-empty directory that is not a checkpoint folder
    (a user's files, or a draft mtp2draft wrote): distill fills it and deletes it when it finishes."""
    if folder.is_dir() and any(folder.iterdir()) and is_checkpoint_folder(folder):
        _check_outside_inputs(folder, inputs)
        return
    check_output_dir(folder, True, inputs)
    if folder.is_dir() and any(folder.iterdir()):
        raise OutputExistsError(
            f"{folder} is not a checkpoint folder of mtp2draft's (it holds a draft or other files), and distill "
            "keeps its checkpoints there and deletes them when it finishes: move it away, or choose another --out "
            "or --checkpoint-dir"
        )


def make_checkpoint_folder(folder: Path) -> bool:
    """Create (and mark) the checkpoint folder if needed; True when this call created it. Marked the moment it exists:
    a run killed between the two leaves an empty folder, which every rule accepts."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / CHECKPOINTS_MARKER).is_file():
        (folder / CHECKPOINTS_MARKER).write_text("a distill run's checkpoints; distill deletes them when it finishes\n")
        if not is_ours(folder):
            mark(folder)
    return made


def remove_checkpoint_folder(folder: Path) -> None:
    """Delete what distill wrote in its checkpoint folder, then the folder if that leaves it empty: a file someone
    put there is kept (and the folder with it)."""
    if not folder.is_dir() or not is_checkpoint_folder(folder):
        return
    for entry in folder.iterdir():
        if CHECKPOINT_ENTRY.match(entry.name) and entry.name not in (MARKER, CHECKPOINTS_MARKER):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    if all(p.name in (MARKER, CHECKPOINTS_MARKER) for p in folder.iterdir()):
        for name in (CHECKPOINTS_MARKER, MARKER):
            (folder / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the finished directory `tmp` at `final` in one rename; a `final` already there (the same step written
    again by a resumed run) is moved aside first and deleted after."""
    if not final.exists():
        os.rename(tmp, final)
        return
    aside = final.with_name(f".{final.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(final, aside)
    os.rename(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)


def _check_outside_inputs(out: Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an `out` that is, contains or lies inside one of `inputs`, or is or contains the working directory."""
    where = out.expanduser().resolve()
    for given in inputs:
        if given is None or not Path(given).expanduser().exists():
            continue
        inp = Path(given).expanduser().resolve()
        if where == inp or where in inp.parents or inp in where.parents:
            relation = "is" if where == inp else "contains" if where in inp.parents else "lies inside"
            raise OutputExistsError(f"--out {out} {relation} the input {given}: choose an output outside every input")
    cwd = Path.cwd().resolve()
    if where == cwd or where in cwd.parents:
        raise OutputExistsError(f"--out {out} is or contains the working directory: choose a directory below it")


def check_output_dir(out: str | Path, overwrite: bool, inputs: Iterable[str | Path | None] = ()) -> Path:
    """Fail early (before any work) when `out` cannot be written without destroying something.

    Refused: an `out` that is, contains or lies inside one of `inputs` (local paths the command reads; hub ids and
    None are skipped) or the working directory; an existing file; a non-empty directory without --overwrite; and,
    even with --overwrite, a non-empty directory that mtp2draft did not write."""
    out = Path(out)
    _check_outside_inputs(out, inputs)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"--out {out} exists and is a file")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(f"--out {out} exists and is not empty (pass --overwrite to replace it)")
        if not is_ours(out) or (foreign := foreign_file(out)) is not None:
            named = "" if not is_ours(out) else f" ({foreign.relative_to(out)})"
            raise OutputExistsError(
                f"--out {out} holds files mtp2draft did not write{named}: --overwrite only replaces what mtp2draft "
                "wrote (or an empty directory); move them away or choose another --out"
            )
    return out


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


# What a directory's identity is made of: the files whose change would make an earlier read of it stale.
_IDENTITY_FILES = ("*.safetensors", "config.json", "manifest.json")
# A draft's identity for a command that carries more of it along (export, push): its records and chart too.
_DRAFT_FILES = (*_IDENTITY_FILES, "provenance.json", "evaluation.json", "acceptance.png")


def draft_identity(path: str | Path) -> tuple:
    """`dir_identity` over every file export and push carry from a draft (weights, configs, records, chart)."""
    return dir_identity(path, _DRAFT_FILES)


def check_unchanged(path: str | Path, identity: tuple, what: str) -> None:
    """Refuse when draft `path` is no longer the one whose `draft_identity` was taken before it was read: a
    result would otherwise carry one draft's records and another's weights."""
    if not Path(path).is_dir() or draft_identity(path) != identity:
        raise DraftError(
            f"{path} changed while it was {what} (another run replaced or rewrote it): nothing was {what}; "
            "run again once it is settled"
        )


def dir_identity(path: str | Path, patterns: Iterable[str] = _IDENTITY_FILES) -> tuple:
    """The identity of the directory `path` as read now: its own inode and, for each weights, config or manifest
    file in it (at any depth), its name, inode, size and mtime. `--overwrite` puts a new directory in place by a
    rename, so a directory replaced after a read never has the identity recorded at that read."""
    root = Path(path)
    info = root.stat()
    files = sorted({p for pattern in patterns for p in root.rglob(pattern) if p.is_file()})
    stats = [(str(p.relative_to(root)), p.stat()) for p in files]
    return (info.st_dev, info.st_ino, tuple((n, s.st_ino, s.st_size, s.st_mtime_ns) for n, s in stats))


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


@contextlib.contextmanager
def atomic_output_dir(
    out: str | Path, overwrite: bool = False, inputs: Iterable[str | Path | None] = ()
) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `out` in one rename, on failure it vanishes.

    The whole write holds the claim on `out` (`claim_output`); the output rules (`check_output_dir`) are checked
    before the work and again under the claim, and a directory being replaced is moved aside and checked once more
    before it is deleted: if something else appeared there in between, it is put back and the run is refused."""
    out = check_output_dir(out, overwrite, inputs)
    out = Path(os.path.abspath(out))  # '.', '..' and trailing slashes resolved, symlinks kept
    with claim_output(out):
        check_output_dir(out, overwrite, inputs)  # again, now that no other mtp2draft run can write here
        _remove_leftovers(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            (tmp / PARTIAL).write_text("being written by mtp2draft; a run that is killed leaves this behind\n")
            as_umask_allows(tmp)
            yield tmp
            mark(tmp)
            _replace(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _remove_leftovers(out: Path) -> None:
    """Delete the temporary directories that runs into `out` killed before they finished left beside it. Called
    under `out`'s claim, so no live run is writing any of them; only directories carrying `PARTIAL` are touched."""
    for leftover in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        if leftover.is_dir() and not leftover.is_symlink() and (leftover / PARTIAL).is_file():
            shutil.rmtree(leftover, ignore_errors=True)


def as_umask_allows(folder: Path) -> None:
    """Give a directory `tempfile.mkdtemp` made (mode 0700, private) the mode `mkdir` would have given it: an output
    that a serving process run as another user of the group must read is not left readable by its owner alone."""
    os.chmod(folder, 0o777 & ~umask())


def _replace(tmp: Path, out: Path, overwrite: bool) -> None:
    """Put the finished `tmp` at `out`. An existing `out` is moved aside first and deleted only once the moved copy is
    known to be one mtp2draft may replace (the check is on the very directory moved, so no swap can slip in)."""
    if not out.exists() and not out.is_symlink():
        try:
            os.rename(tmp, out)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # appeared in between (a writer that does not claim)
                raise OutputExistsError(
                    f"--out {out} appeared while this run was writing: nothing was replaced"
                ) from None
            raise
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, aside / "old")
    old = aside / "old"
    if old.is_symlink():  # a link given as --out: the link is replaced, whatever it points to is left alone
        os.rename(tmp, out)
        old.unlink()
        aside.rmdir()
        return
    empty = old.is_dir() and not any(old.iterdir())
    if not old.is_dir() or not (empty or (overwrite and is_ours(old) and foreign_file(old) is None)):
        os.rename(old, out)  # not ours to delete: back where it was
        aside.rmdir()
        raise OutputExistsError(
            f"--out {out} changed while this run was writing (it now holds files mtp2draft did not write, or "
            "--overwrite was not given): nothing was replaced"
        )
    os.rename(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically write `data` as JSON, with every known secret (Hub token) redacted: no file mtp2draft writes can
    carry one, whatever a caller put in `data`."""
    text = json.dumps(scrub(data), indent=2, sort_keys=False, default=str) + "\n"
    with temporary_beside(path) as (fh, _):  # a fresh name: a link planted at `path.tmp` is never followed
        fh.write(text)


class SafetensorsWriter:
    """Write a safetensors file whose tensor names, dtypes and shapes are known up front, one tensor at a time.

    The header is written first from the plan; `write(name, tensor)` then appends data in plan order, so the
    caller never holds more than the tensor it is producing.
    """

    def __init__(self, path: Path, plan: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata=None) -> None:
        self.path = path
        self.plan = plan
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = scrub({str(k): str(v) for k, v in metadata.items()})
        offset = 0
        for name, dtype, shape in plan:
            size = math.prod(shape) * ST_DTYPES[TORCH_TO_ST[dtype]][1]
            header[name] = {"dtype": TORCH_TO_ST[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close() / __exit__
        self._fh.write(struct.pack("<Q", len(raw)) + raw)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want_name, dtype, shape = self.plan[self._next]
        if name != want_name or tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise RuntimeError(
                f"writer expected {want_name} {dtype} {list(shape)}, got {name} {tensor.dtype} {list(tensor.shape)}"
            )
        t = tensor.detach().contiguous().cpu()
        if t.numel():
            self._fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # no copy
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.plan):
            self._fh.close()
            raise RuntimeError(f"writer closed after {self._next} of {len(self.plan)} tensors")
        self._fh.close()

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._fh.close()


def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata=None) -> None:
    """Small helper: write a dict of tensors through the streaming writer (same byte layout everywhere)."""
    plan = [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    with SafetensorsWriter(path, plan, metadata) as writer:
        for key, value in tensors.items():
            writer.write(key, value)


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
