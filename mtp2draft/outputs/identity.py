"""A directory's identity as read now (inodes, sizes, mtimes of its weights, configs and records), so that a stage
that reads a draft twice (export, push, evaluate) can refuse one replaced in between.

What this module does not do: lock anything (`outputs/claims.py`): it detects a change, it does not prevent one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mtp2draft.errors import DraftError

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
