"""Writing outputs safely: directories that appear complete or not at all, and safetensors files streamed tensor by
tensor so peak memory tracks the largest tensor group rather than the whole file; and the progress-callback type
every stage reports through.

What this module does not do: decide what to write (the stages do) or read checkpoints (`checkpoint.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.reader import DTYPES, TORCH_TO_ST
from mtp2draft.errors import OutputExistsError
from mtp2draft.redact import scrub

# Every stage reports progress through a callable taking one line; the CLI prints it on stderr, tests drop it.
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """The default progress sink: drops the line."""


# Every directory mtp2draft writes carries this file; --overwrite replaces only such directories (or empty ones), so
# a mistyped --out can never delete a user's files.
MARKER = ".mtp2draft"


def is_ours(path: Path) -> bool:
    """Whether `path` is a directory mtp2draft wrote (it carries the marker)."""
    return (path / MARKER).is_file()


def mark(path: Path) -> None:
    """Mark a directory as written by mtp2draft (see `MARKER`)."""
    (path / MARKER).write_text("written by mtp2draft; `--overwrite` may replace this directory\n")


def check_output_dir(out: str | Path, overwrite: bool, inputs: Iterable[str | Path | None] = ()) -> Path:
    """Fail early (before any work) when `out` cannot be written without destroying something.

    Refused: an `out` that is, contains or lies inside one of `inputs` (local paths the command reads; hub ids and
    None are skipped) or the working directory; an existing file; a non-empty directory without --overwrite; and,
    even with --overwrite, a non-empty directory that mtp2draft did not write."""
    out = Path(out)
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
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"--out {out} exists and is a file")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(f"--out {out} exists and is not empty (pass --overwrite to replace it)")
        if not is_ours(out):
            raise OutputExistsError(
                f"--out {out} holds files mtp2draft did not write: --overwrite only replaces directories mtp2draft "
                "wrote (or empty ones); remove it yourself or choose another --out"
            )
    return out


@contextlib.contextmanager
def atomic_output_dir(
    out: str | Path, overwrite: bool = False, inputs: Iterable[str | Path | None] = ()
) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `out` in one rename, on failure it vanishes."""
    out = check_output_dir(out, overwrite, inputs)
    out = Path(os.path.abspath(out))  # '.', '..' and trailing slashes resolved, symlinks kept
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        mark(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically write `data` as JSON, with every known secret (Hub token) redacted: no file mtp2draft writes can
    carry one, whatever a caller put in `data`."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(scrub(data), indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        for name, dtype, shape in plan:
            size = math.prod(shape) * DTYPES[TORCH_TO_ST[dtype]][1]
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
