"""Output directories that appear complete or not at all: `check_output_dir` refuses, before any work, an `--out`
that would destroy an input, the working directory or files mtp2draft did not write; `atomic_output_dir` writes into
a temporary sibling and renames it into place under the output's claim; `publish_dir` renames a finished step
directory into place.

What this module does not do: claim an output (`outputs/claims.py`), list what was written (`manifest.py`), or
decide what to write (the stages do).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from mtp2draft.errors import OutputExistsError
from mtp2draft.manifest import PARTIAL, foreign_file, is_ours, mark, umask
from mtp2draft.outputs.claims import claim_output


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


def check_outside_inputs(out: Path, inputs: Iterable[str | Path | None]) -> None:
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
    check_outside_inputs(out, inputs)
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
