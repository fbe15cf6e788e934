"""What mtp2draft wrote, and how it writes and reads single files without following a planted link.

Every directory mtp2draft writes carries `MARKER`, a manifest listing the files it wrote there (relative paths).
`--overwrite` may replace a directory only when every file in it is listed (`foreign_file` finds one that is not):
a file the user added to a draft (`notes.txt`) makes the directory theirs as much as ours, so it is refused, never
deleted. A nested directory carrying its own marker (`run --work`'s stages) is judged by its own manifest. A marker
written by an older mtp2draft (plain text, no list) counts only the kinds of file mtp2draft writes.

`temporary_beside` makes the temporary twin of a file with O_EXCL and a fresh name, so a link planted at a
predictable temporary name is never followed; `file_inside` refuses a file that is a link leaving its directory.

`write_json` writes a JSON file that way, every known secret redacted.

What this module does not do: claim outputs or rename directories into place (`outputs/`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from mtp2draft.errors import DraftError
from mtp2draft.redact import scrub

MARKER = ".mtp2draft"
PARTIAL = ".mtp2draft-partial"  # inside a temporary output directory while it is written (a killed run's leftover)
_MANIFEST_KEY = "written_by_mtp2draft"
# What an older marker (no list) vouches for: the files mtp2draft writes, by kind.
_LEGACY = re.compile(r".*\.(safetensors|json|png|md)$")
# A distill run's checkpoint folder (outputs/checkpoint_folder.py) carries this file, and holds only these entries (finished steps, best
# weights, and their temporary twins a killed run leaves behind: `.step-0000010.tmp`, `.best-0000010.old`).
CHECKPOINTS_MARKER = ".mtp2draft-checkpoints"
CHECKPOINT_ENTRY = re.compile(r"^(\.?(step|best)-\d+(\.tmp|\.old)?|best|\.mtp2draft|\.mtp2draft-checkpoints)$")
# Claims and leftovers of mtp2draft's own writes inside a directory (`.NAME.mtp2draft-lock`).
_OWN_TRANSIENT = re.compile(r"^\..+\.mtp2draft-lock$")


def is_ours(path: Path) -> bool:
    """Whether `path` is a directory mtp2draft wrote (it carries the marker)."""
    return (path / MARKER).is_file()


def _files(root: Path) -> list[str]:
    """Every file and link under `root` (links not followed), as sorted relative paths, the marker excluded."""
    found = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        found += [(here / n).relative_to(root).as_posix() for n in names]
        found += [(here / d).relative_to(root).as_posix() for d in dirs if (here / d).is_symlink()]
    return sorted(f for f in found if Path(f).name not in (MARKER, PARTIAL))  # markers, nested ones too


def listed(path: Path) -> set[str] | None:
    """The files `path`'s manifest says mtp2draft wrote; None for an older marker that lists none."""
    try:
        data = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    files = data.get(_MANIFEST_KEY) if isinstance(data, dict) else None
    return {str(f) for f in files} if isinstance(files, list) else None


def mark(path: Path, files: Iterable[str] | None = None) -> None:
    """Mark directory `path` as written by mtp2draft, listing `files` (default: every file under it now, for a
    directory only this run filled) beside those an earlier manifest listed."""
    before = listed(path)
    if before is None and is_ours(path):  # an older marker lists nothing: what it vouched for, by kind
        before = {f for f in _files(path) if _LEGACY.match(Path(f).name)}
    names = set(_files(path) if files is None else files) | (before or set())
    (path / PARTIAL).unlink(missing_ok=True)
    text = json.dumps({_MANIFEST_KEY: sorted(names), "note": "`--overwrite` may replace these files"}, indent=1)
    write_text_safely(path / MARKER, text + "\n")


def add_written(path: Path, *names: str) -> None:
    """Record that mtp2draft wrote `names` into the directory `path` it wrote before (`evaluate --save`)."""
    if is_ours(path):
        mark(path, names)


def foreign_file(root: Path) -> Path | None:
    """The first file under `root` that no manifest says mtp2draft wrote, or None when `--overwrite` may replace it."""
    names = listed(root)
    for rel in _files(root):
        entry = root / rel
        first = root / Path(rel).parts[0]
        if _OWN_TRANSIENT.match(entry.name) or (first.is_dir() and (first / PARTIAL).is_file()):
            continue  # a claim, or a killed run's temporary directory
        owner = _nearest_marked(root, entry)
        if owner is not None:
            if (owner / CHECKPOINTS_MARKER).is_file():  # a distill run's checkpoint folder: what a run writes there
                if CHECKPOINT_ENTRY.match(entry.relative_to(owner).parts[0]):
                    continue
                return entry
            own = listed(owner)
            inner = entry.relative_to(owner).as_posix()
            if (own is None and _LEGACY.match(entry.name)) or (own is not None and inner in own):
                continue
            return entry
        if (names is None and _LEGACY.match(entry.name)) or (names is not None and rel in names):
            continue
        return entry
    return None


def _nearest_marked(root: Path, entry: Path) -> Path | None:
    """The innermost marked directory strictly between `root` and `entry`, if any."""
    for parent in entry.parents:
        if parent == root:
            return None
        if is_ours(parent) and not parent.is_symlink():
            return parent
    return None


_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process umask (read by setting it and putting it back: no other way exists)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextlib.contextmanager
def temporary_beside(path: Path, mode: str = "w") -> Iterator[tuple[IO, Path]]:
    """An open file with a fresh hidden name beside `path`, created with O_EXCL (a link planted there is never
    followed, it only makes the name taken), renamed over `path` when the block ends well and removed otherwise."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 is private; the file gets what `open` would have given it
        with os.fdopen(fd, mode) as fh:
            yield fh, tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_safely(path: Path, text: str) -> None:
    """`text` at `path`, whole or not at all, through a fresh temporary (`temporary_beside`)."""
    with temporary_beside(path) as (fh, _):
        fh.write(text)


def file_inside(root: Path, name: str) -> Path | None:
    """`root / name` when it is a file, None when absent; DraftError when it is a link leading outside `root`
    (nothing outside the directory the user named is read, nor published)."""
    path = root / name
    if not path.is_file():
        return None
    real = path.resolve()
    if path.is_symlink() and root.resolve() not in real.parents:
        raise DraftError(f"{path} leads outside {root} (to {real}): refusing to read it; copy the file in instead")
    return path


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically write `data` as JSON, with every known secret (Hub token) redacted: no file mtp2draft writes can
    carry one, whatever a caller put in `data`."""
    text = json.dumps(scrub(data), indent=2, sort_keys=False, default=str) + "\n"
    with temporary_beside(path) as (fh, _):  # a fresh name: a link planted at `path.tmp` is never followed
        fh.write(text)
