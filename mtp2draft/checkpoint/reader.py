"""Resolve a SOURCE (hub repo id or local directory) into a `Checkpoint` (`checkpoint/tensors.py`), so that a 700 GB
checkpoint costs the MTP layer's bytes and little more:
1. config.json and model.safetensors.index.json (the index maps every key to its shard);
2. the safetensors header of each shard that holds a needed key (8 bytes, then the JSON header);
3. the byte ranges of the needed tensors, coalesced per shard.
From the Hub, steps 2 and 3 are HTTP range requests through huggingface_hub's session, cached on disk per commit so a
second run fetches nothing; the commit is resolved once (offline: from the cache's recorded refs). Locally, shards
that hold no needed key are never opened.

What this module does not do: read tensors (`checkpoint/tensors.py`), know anything about MTP layers or families
(`family/spec.py`, `conversion/`), or download whole shards.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from mtp2draft.checkpoint import network
from mtp2draft.checkpoint.sources import HubFiles, LocalFiles, check_inside, range_cache_dir
from mtp2draft.checkpoint.tensors import UNINDEXED_MTP_FILES, Checkpoint
from mtp2draft.errors import CheckpointError, Mtp2DraftError, SourceError, read_json_object
from mtp2draft.manifest import write_text_safely

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


# ---- resolution ---------------------------------------------------------------------------------------------------
def open_checkpoint(
    source: str | os.PathLike, revision: str | None = None, token: str | bool | None = None
) -> Checkpoint:
    """Resolve SOURCE: an existing local directory, else a hub repo id (with optional revision)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if revision:
            raise SourceError(f"--revision applies to hub repos; {path} is a local directory")
        return _open_local(path)
    if path.exists():
        raise SourceError(f"{path} is a file; SOURCE must be a checkpoint directory or a hub repo id")
    return _open_hub(hub_repo_id(str(source)), revision, token)


# What a Hub repo id is, said when a SOURCE is neither a directory nor one (huggingface_hub's `validate_repo_id`).
REPO_ID_RULE = (
    "a repo id is `name` or `org/name`: letters, digits, `-`, `_`, `.`, no `--` or `..`, at most 96 characters"
)


def hub_repo_id(text: str) -> str:
    """`text` as a Hub repo id, once no directory of that name exists; otherwise one line naming both things tried:
    "directory `./my model` does not exist, and it is not a Hub repo id (...)". A path-like text (`./x`, `/x`,
    `~/x`, `a/b/c`) is never taken for a repo id: the user meant a directory."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    shown = text if text.isprintable() else repr(text)  # a newline in a name must not break the one line
    path_like = not text or text.startswith((".", "/", "~")) or text.count("/") > 1
    try:
        if path_like:
            raise HFValidationError(text)
        validate_repo_id(text)
    except HFValidationError:
        raise SourceError(
            f"directory `{shown}` does not exist, and `{shown}` is not a Hub repo id ({REPO_ID_RULE})"
        ) from None
    return text


def _open_local(root: Path) -> Checkpoint:
    files = LocalFiles(root)
    config = read_config(root)
    weight_map = _weight_map_local(root, files)
    sizes = {f: files.size(f) for f in set(weight_map.values())}
    ckpt = Checkpoint(str(root), files, config, weight_map, file_sizes=sizes)
    add_unindexed_files(ckpt, [p.name for p in root.iterdir() if p.is_file()])
    return ckpt


def add_unindexed_files(ckpt: Checkpoint, names: Iterable[str]) -> None:
    """Add to `ckpt.weight_map` the tensors of the top-level files among `names` (the repo's or directory's file
    list) that match `UNINDEXED_MTP_FILES` and that the index does not name; only their headers are read here. A
    tensor such a file shares with the index is refused in one line: which copy is the checkpoint's is not ours to
    guess."""
    indexed = set(ckpt.weight_map.values())
    extra = sorted(n for n in names if "/" not in n and fnmatch.fnmatch(n, UNINDEXED_MTP_FILES) and n not in indexed)
    for file in extra:
        keys = sorted(ckpt.header(file))
        clash = [k for k in keys if k in ckpt.weight_map]
        if clash:
            raise CheckpointError(
                f"{file}, which {INDEX_FILE} does not list, holds {clash[0]}, which the index places in "
                f"{ckpt.weight_map[clash[0]]}: refusing to guess which copy is the checkpoint's"
            )
        ckpt.weight_map.update(dict.fromkeys(keys, file))
        ckpt.file_sizes[file] = ckpt.files.size(file)
        ckpt.unindexed[file] = len(keys)


def _weight_map_local(root: Path, files: LocalFiles) -> dict[str, str]:
    index = root / INDEX_FILE
    if index.is_file():
        return parse_index(read_json_object(index, CheckpointError), INDEX_FILE)
    if (root / SINGLE_FILE).is_file():
        ckpt = Checkpoint(str(root), files, {}, {}, file_sizes={})
        return {k: SINGLE_FILE for k in ckpt.header(SINGLE_FILE)}
    raise CheckpointError(f"{root} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def parse_index(index: dict[str, Any], where: str) -> dict[str, str]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{where} has no valid 'weight_map'")
    for file in set(weight_map.values()):
        check_shard_name(file, where)
    return dict(weight_map)


def check_shard_name(file: str, where: str, inside: str = "the checkpoint") -> None:
    """A shard named by an index (or a dump's manifest: `inside`) must be a plain relative name inside the
    directory: no absolute path, no `..`.

    Checked by name, never by resolving: HF cache snapshots are symlinks into the blob store, and those are fine."""
    parts = PurePosixPath(file).parts
    if (
        not file
        or "\\" in file
        or "\0" in file
        or PurePosixPath(file).is_absolute()
        or PureWindowsPath(file).drive
        or any(part in ("..", ".") for part in parts)
    ):
        raise CheckpointError(f"{where} names the shard {file!r}, which lies outside {inside}: refusing to read it")


def read_config(root: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory: a JSON object, or one line saying why not."""
    if (root / "config.json").is_file():
        check_inside(root, root / "config.json")
    return read_json_object(root / "config.json", CheckpointError, f"{root} has no config.json")


def _open_hub(repo_id: str, revision: str | None, token: str | bool | None) -> Checkpoint:
    from huggingface_hub import HfApi, constants, hf_hub_download

    where = f"{repo_id}" + (f"@{revision}" if revision else "")
    network.configure()
    try:
        if constants.HF_HUB_OFFLINE:
            commit, sizes = _offline_commit(repo_id, revision)
        else:
            with network.checked_answer("model_info", SourceError):
                info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
                if not isinstance(info.sha, str) or not info.sha or not isinstance(info.siblings, list | None):
                    raise KeyError("sha")  # a commit to fetch from is the one thing this answer must say
            commit = info.sha
            sizes = {s.rfilename: s.size for s in (info.siblings or [])}
        names = set(sizes)

        def fetch_json(name: str) -> dict[str, Any]:
            local = hf_hub_download(repo_id, name, revision=commit, token=token)
            return read_json_object(Path(local), CheckpointError)

        if "config.json" not in names:
            raise SourceError(f"hub repo {where} has no config.json: not a transformers checkpoint")
        config = fetch_json("config.json")
        files = HubFiles(repo_id, commit, sizes, token)
        if INDEX_FILE in names:
            weight_map = parse_index(fetch_json(INDEX_FILE), f"{where}/{INDEX_FILE}")
        elif SINGLE_FILE in names:
            probe = Checkpoint(repo_id, files, {}, {}, file_sizes=sizes)
            weight_map = {k: SINGLE_FILE for k in probe.header(SINGLE_FILE)}
        else:
            raise CheckpointError(f"hub repo {where} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    except Exception as exc:
        mapped = _hub_failure(exc, repo_id, revision, where)
        if mapped is exc:
            raise
        raise mapped from exc
    if not constants.HF_HUB_OFFLINE and revision != commit:
        _record_ref(repo_id, revision or "main", commit)
    ckpt = Checkpoint(repo_id, files, config, weight_map, revision=revision, commit=commit, file_sizes=sizes)
    add_unindexed_files(ckpt, names)
    # Remember the file list beside the range cache so HF_HUB_OFFLINE=1 runs can resolve this commit later.
    meta = files.cache / "files.json"
    if not meta.is_file():
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(sizes))
    return ckpt


def _hub_failure(exc: Exception, repo_id: str, revision: str | None, where: str) -> Exception:
    """The one-line error for a failure while opening hub repo `repo_id`; `exc` itself when it is not one (a bug)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, Mtp2DraftError):
        return exc
    if line := network.not_the_hubs_download(exc):  # before EntryNotFound: a page served for a file says so
        return SourceError(line)
    if isinstance(exc, RevisionNotFoundError):
        return SourceError(f"revision {revision!r} does not exist in hub repo {repo_id}")
    if isinstance(exc, GatedRepoError):
        return SourceError(f"hub repo {repo_id} is gated: accept its terms on the Hub, then log in")
    if isinstance(exc, RepositoryNotFoundError):
        return SourceError(f"hub repo {repo_id} not found (or private: log in with `hf auth login` or pass --token)")
    if isinstance(exc, EntryNotFoundError):
        return SourceError(f"hub repo {where} is missing a file: {exc}")
    if isinstance(exc, OfflineModeIsEnabled):
        return SourceError(f"{where} is not in the local cache and HF_HUB_OFFLINE is set")
    if isinstance(exc, HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return SourceError(f"hub request for {where} failed: {first}")
    if network.is_network_error(exc):
        return SourceError(network.describe(exc))
    if isinstance(exc, OSError):
        return SourceError(f"could not reach the hub for {where}: {exc}")
    return exc


def _record_ref(repo_id: str, ref: str, commit: str) -> None:
    """Write `refs/<ref>` = commit into the HF cache, as huggingface_hub does for the downloads it resolves itself:
    files are fetched here by commit sha, so without this an offline run could not tell which commit `main` is."""
    from huggingface_hub import constants

    path = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "refs" / ref
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text().strip() != commit:
            write_text_safely(path, commit)  # a fresh temporary name: a planted link is never followed
    except OSError:  # a read-only cache only costs offline reuse
        pass


def _offline_commit(repo_id: str, revision: str | None) -> tuple[str, dict[str, int | None]]:
    """Commit and file list from the hub cache alone (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    ref = folder / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    meta = range_cache_dir(repo_id, commit) / "files.json"
    if not (folder / "snapshots" / commit).is_dir() or not meta.is_file():
        raise SourceError(f"{repo_id}@{rev} is not in the local cache and HF_HUB_OFFLINE is set")
    return commit, json.loads(meta.read_text())
