"""Where a checkpoint's bytes come from: files of a local directory, or byte ranges of files in a Hub repo at a fixed
commit (HTTP range requests through huggingface_hub's session, cached on disk per commit so a second run fetches
nothing). Both answer `read(file, start, end)` and count what they read.

What this module does not do: parse safetensors headers or decide which bytes are needed (`checkpoint/tensors.py`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mtp2draft.checkpoint import network
from mtp2draft.errors import CheckpointError, SourceError
from mtp2draft.manifest import temporary_beside


def readable_roots(root: Path) -> tuple[Path, ...]:
    """Where the files of checkpoint directory `root` may lead: `root` itself and, for a Hub cache snapshot
    (`models--ORG--NAME/snapshots/REV`, whose files are links into the repo's blob store), that repo's `blobs/`."""
    real = root.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real, real.parent.parent / "blobs"
    return (real,)


def check_inside(root: Path, path: Path, what: str = "the checkpoint") -> None:
    """Refuse a file of `root` that is a link leading anywhere but `readable_roots(root)`: nothing outside the
    directory the user named is read, save a Hub cache snapshot's own blobs."""
    real = path.resolve()
    if path.is_symlink() and not any(r == real or r in real.parents for r in readable_roots(root)):
        raise CheckpointError(
            f"{path} is a link that leads outside {what} ({real}): refusing to read it; copy the file in, or name "
            "the directory it lies in"
        )


class LocalFiles:
    """Reads byte ranges from files of a local directory; records which files it opened. A file that is a link
    leading outside the directory (or, in a Hub cache snapshot, outside its blob store) is refused."""

    def __init__(self, root: Path):
        self.root = root
        self.opened: set[str] = set()
        self.bytes_read = 0

    def exists(self, file: str) -> bool:
        return (self.root / file).is_file()

    def size(self, file: str) -> int | None:
        path = self.root / file
        return path.stat().st_size if path.is_file() else None

    def read(self, file: str, start: int, end: int) -> bytes:
        path = self.root / file
        if not path.is_file():
            raise CheckpointError(f"shard {file} is named in the index but does not exist in {self.root}")
        check_inside(self.root, path)
        self.opened.add(file)
        data = bytearray(end - start)  # writable: tensors view it without a copy
        with open(path, "rb") as fh:
            fh.seek(start)
            got = fh.readinto(data)
        if got != end - start:
            raise CheckpointError(f"{file}: asked for {end - start} bytes at {start}, got {got} (file truncated?)")
        self.bytes_read += got
        return data

    def describe(self) -> str:
        return str(self.root)


class HubFiles:
    """Reads byte ranges of files in a hub repo at a fixed commit, through an on-disk range cache."""

    def __init__(self, repo_id: str, commit: str, sizes: dict[str, int | None], token: str | bool | None):
        self.repo_id = repo_id
        self.commit = commit
        self.sizes = sizes
        self.token = token
        self.bytes_fetched = 0
        self.requests = 0
        self.cache = range_cache_dir(repo_id, commit)

    def exists(self, file: str) -> bool:
        return file in self.sizes

    def size(self, file: str) -> int | None:
        return self.sizes.get(file)

    def _cached(self, file: str, start: int, end: int) -> bytes | None:
        folder = self.cache / file
        if not folder.is_dir():
            return None
        for entry in folder.iterdir():
            try:
                a, b = (int(x) for x in entry.name.split("-"))
            except ValueError:
                continue
            if a <= start and end <= b:
                data = bytearray(end - start)
                with open(entry, "rb") as fh:
                    fh.seek(start - a)
                    fh.readinto(data)
                return data
        return None

    def read(self, file: str, start: int, end: int) -> bytes | bytearray:
        if end <= start:
            return bytearray()
        cached = self._cached(file, start, end)
        if cached is not None:
            return cached
        if file not in self.sizes:
            raise CheckpointError(f"shard {file} is named in the index but is not in {self.repo_id}@{self.commit[:12]}")
        data = _range_get(self.repo_id, self.commit, file, start, end, self.token, self.sizes.get(file))
        self.bytes_fetched += len(data)
        self.requests += 1
        folder = self.cache / file
        folder.mkdir(parents=True, exist_ok=True)
        with temporary_beside(folder / f"{start}-{end}", "wb") as (fh, _):  # a fresh name: no planted link followed
            fh.write(data)
        return data

    def describe(self) -> str:
        return f"{self.repo_id}@{self.commit[:12]}"


def range_cache_dir(repo_id: str, commit: str) -> Path:
    from huggingface_hub import constants

    root = Path(os.environ.get("MTP2DRAFT_CACHE") or Path(constants.HF_HOME) / "mtp2draft" / "ranges")
    return root / ("models--" + repo_id.replace("/", "--")) / commit


def _range_get(
    repo_id: str, commit: str, file: str, start: int, end: int, token: str | bool | None, size: int | None = None
) -> bytearray:
    """Bytes [start, end) of `file` (`size` bytes in all, as the repo's listing says; None: unknown), streamed
    straight into the buffer the tensors will view (no second copy of a range that can be a whole lm_head)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, http_stream_backoff

    url = hf_hub_url(repo_id, file, revision=commit)
    headers = build_hf_headers(token=token)
    headers["Range"] = f"bytes={start}-{end - 1}"
    network.configure()
    try:
        with http_stream_backoff(
            "GET",
            url,
            headers=headers,
            max_retries=network.retries(),
            retry_on_status_codes=(429, 500, 502, 503, 504),
        ) as response:
            response.raise_for_status()
            problem = network.range_answer_problem(response, start, end, size)
            if problem:  # a page or `{}` standing in for the file: said so, never read as the file's bytes
                first = next(response.iter_bytes(), b"")
                raise SourceError(network.describe_range_answer(url, problem, first))
            # 200: the server ignored the range and sends the whole file (the bytes are spent anyway): keep the slice
            data, got = fill_range(response.iter_bytes(), end - start, skip=start if response.status_code == 200 else 0)
    except SourceError:
        raise
    except Exception as exc:  # network errors after huggingface_hub's retries
        if network.is_network_error(exc):
            raise SourceError(network.describe(exc)) from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"could not fetch bytes {start}-{end - 1} of {file} from {repo_id}: {first}") from exc
    if got != end - start:
        raise CheckpointError(f"{file}: asked for {end - start} bytes at {start}, got {got} (file truncated?)")
    return data


def fill_range(chunks: Iterable[bytes], size: int, skip: int = 0) -> tuple[bytearray, int]:
    """(a buffer of `size` bytes filled from `chunks` after dropping the first `skip`, how many bytes arrived)."""
    data = bytearray(size)
    got = pos = 0  # bytes written; offset of the current chunk in the stream
    for chunk in chunks:
        view = memoryview(chunk)[max(skip - pos, 0) :]
        pos += len(chunk)
        take = min(len(view), size - got)
        data[got : got + take] = view[:take]
        got += take
        if got == size:
            break
    return data, got
