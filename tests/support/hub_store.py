"""The loopback Hub's data model: repos, commits (full snapshots) and blobs (plain or LFS), the Hub's error answer, and
the constants its HTTP side and the server share. See `hub_server.py`.

What this module does not do: serve HTTP (`hub_http.py`) or hold the server's state (`hub_server.HubServer`).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
LFS_MIN_SIZE = 1024 * 1024
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool
    oid: str  # git blob sha1 of the content, or of the LFS pointer file for LFS blobs
    sha256: str
    pointer_size: int

    @classmethod
    def make(cls, data: bytes, lfs: bool) -> Blob:
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        stored = pointer if lfs else data
        oid = hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()
        return cls(data, lfs, oid, sha256, len(pointer))


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    tree: dict[str, Blob]  # full snapshot, never mutated once committed
    files: list[str]  # paths added, changed or deleted by this commit
    date: str = field(default_factory=_now)


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    owner: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)  # in creation order
    created: str = field(default_factory=_now)


class HubError(Exception):
    """An HTTP error answered the way the Hub does (status, X-Error-Code, X-Error-Message, JSON body)."""

    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.commit, self.extra = status, message, code, commit, extra
