"""In-memory loopback Hugging Face Hub for tests and benchmarks.

`HubServer` serves, on 127.0.0.1, the part of the Hub HTTP API that the real `huggingface_hub` client (2.x) uses to
download and upload: repo info, tree / paths-info listings, refs, commit history, `resolve` (HEAD, GET, byte ranges),
repo and branch creation, preupload, the LFS batch API (basic transfer, upload + verify), NDJSON commits (with
`create_pr`), whoami and YAML validation. Errors carry the Hub's `X-Error-Code` / `X-Error-Message` headers, so the
client raises its usual `RepositoryNotFoundError`, `RevisionNotFoundError`, `EntryNotFoundError`. `activate()` points
an already-imported `huggingface_hub` at the server (env vars and the module state read at import time).

Deliberately not done: the git protocol (no clone/push), Xet storage (activate() disables it), tags, discussions,
multipart LFS, pagination (every listing is one page), namespace-less repo ids (`gpt2`), organisations, auth beyond
"a valid token may write to its own user's namespace", a default `.gitattributes` (a new repo's first commit is
empty), and persistence: everything lives in memory and is gone on `stop()`.

This module holds the server and its state; the HTTP routes are in `hub_http.py`, the repo/commit/blob model in
`hub_store.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from support.hub_http import HubHandler, HubHTTPServer
from support.hub_store import (
    Blob,
    Commit,
    HubError,
    Repo,
    is_lfs,
)


class HubServer:
    """In-memory loopback Hub. Use as a context manager; binds 127.0.0.1 on a free port."""

    def __init__(self, token: str | None = "hf_test_token", users: dict[str, str] | None = None):
        self.token = token  # None: auth disabled, every request may read and write everything
        self.users = dict(users) if users is not None else {"hf_test_token": "tester"}
        if token is not None:
            self.users.setdefault(token, "tester")
        self.endpoint = ""
        self.fail_next = 0
        # (n, kind): the n-th request (1-based) and every later one is answered 200 with hub_impostor.ANSWERS[kind]
        # (HTML, `{}`, JSON cut short): a Hub that works at first and breaks on a later call (a proxy's session ends)
        self.broken_from: tuple[int, str] | None = None
        self.answered = 0
        self.bytes_served = 0
        self.requests: list[dict] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._lfs: dict[str, Blob] = {}  # LFS object store, by sha256
        self._lock = threading.RLock()
        self._httpd: HubHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._sockets: set[socket.socket] = set()

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> HubServer:
        if self._httpd is None:
            self._httpd = HubHTTPServer(("127.0.0.1", 0), HubHandler)
            self._httpd.hub = self
            self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:  # close keep-alive connections so no client pool keeps a socket to a dead server
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def activate(self) -> Iterator[HubServer]:
        """Point `huggingface_hub` at this server (env vars + module state read at import time); restore on exit."""
        constants = importlib.import_module("huggingface_hub.constants")
        hf_api = importlib.import_module("huggingface_hub.hf_api")
        http = importlib.import_module("huggingface_hub.utils._http")
        tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
        env = {"HF_ENDPOINT": self.endpoint, "HF_TOKEN": self.token, "HUGGING_FACE_HUB_TOKEN": None,
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}  # fmt: skip
        patches = [
            (constants, "ENDPOINT", self.endpoint),
            (constants, "HUGGINGFACE_CO_URL_TEMPLATE", self.endpoint + "/{repo_id}/resolve/{revision}/{filename}"),
            (constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"}),
            (constants, "HF_HUB_DISABLE_XET", True),
            (constants, "HF_HUB_DISABLE_TELEMETRY", True),
            (constants, "HF_HUB_DISABLE_PROGRESS_BARS", True),
            (constants, "HF_HUB_OFFLINE", False),
            (tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", True),  # a `from ..constants import` copy
            (http, "_HUB_ORIGINS", http._HUB_ORIGINS | {http._url_origin(self.endpoint)}),  # computed at import
            (hf_api.api, "endpoint", self.endpoint),  # module-level HfApi() behind `upload_file`, `model_info`, ...
            (hf_api.api, "_whoami_cache", {}),
        ]
        saved_env = {key: os.environ.get(key) for key in env}
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
        try:
            for key, value in env.items():
                _set_env(key, value)
            for obj, name, value in patches:
                setattr(obj, name, value)
            yield self
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
            for key, value in saved_env.items():
                _set_env(key, value)

    # ---- server-side helpers for tests --------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes] | str | os.PathLike, *, revision: str = "main",
                 repo_type: str = "model", owner_token: str | None = None, private: bool = False) -> str:  # fmt: skip
        """Create the repo if needed and commit `files` (added/overwritten) on `revision`; return the commit sha.

        `files` is a {path: bytes} dict or a local folder (all files, recursive). A new branch starts from `main`.
        The owner is `users[owner_token]`, or the namespace of `repo_id` by default.
        """
        if repo_id.count("/") != 1:
            raise ValueError(f"repo_id must be 'namespace/name', got {repo_id!r}")
        if not isinstance(files, dict):
            root = Path(files)
            files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        owner = self.users[owner_token] if owner_token else repo_id.split("/")[0]
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), Repo(repo_id, repo_type, owner, private))
            head = repo.branches.get(revision) or repo.branches.get("main")
            tree = dict(repo.commits[head].tree) if head else {}
            for path, data in files.items():
                tree[path] = Blob.make(data, is_lfs(path, len(data)))
                if tree[path].lfs:
                    self._lfs[tree[path].sha256] = tree[path]
            return self._commit(repo, revision, head, tree, f"Add {len(files)} file(s)", "", owner).oid

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        with self._lock:
            commit = self._resolve(self._repos[(repo_type, repo_id)], revision)
        return {path: blob.data for path, blob in commit.tree.items()}

    def commits(self, repo_id: str, repo_type: str = "model") -> list[dict]:
        """All commits of the repo (every branch), newest first."""
        with self._lock:
            commits = list(self._repos[(repo_type, repo_id)].commits.values())
        return [{"oid": c.oid, "parent": c.parent, "title": c.title, "message": c.message, "files": c.files}
                for c in reversed(commits)]  # fmt: skip

    def reset_counters(self) -> None:
        with self._lock:
            self.bytes_served = 0
            self.requests.clear()

    def bytes_served_for(self, path_suffix: str) -> int:
        with self._lock:
            return sum(r["bytes"] for r in self.requests if r.get("file", "").endswith(path_suffix))

    # ---- model ----------------------------------------------------------------------------------------------------
    def _user(self, authorization: str | None) -> str | None:
        token = authorization[7:].strip() if authorization and authorization.startswith("Bearer ") else None
        if token and token not in self.users and self.token is not None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.users.get(token) if token else None

    def _repo(self, repo_type: str, repo_id: str, user: str | None, write: bool = False) -> Repo:
        repo = self._repos.get((repo_type, repo_id))
        allowed = self.token is None or (repo is not None and user == repo.owner)
        if repo is None or (repo.private and not allowed):
            status = 401 if user is None and repo is not None else 404
            raise HubError(status, f"Repository not found: {repo_type} {repo_id}", "RepoNotFound")
        if write and not allowed:
            raise HubError(401 if user is None else 403, f"You don't have the rights to write to {repo_id}")
        return repo

    def _resolve(self, repo: Repo, revision: str) -> Commit:
        oid = repo.branches.get(revision) or (revision if revision in repo.commits else None)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    def _commit(self, repo: Repo, branch: str, parent: str | None, tree: dict[str, Blob], title: str,
                message: str, author: str) -> Commit:  # fmt: skip
        old = repo.commits[parent].tree if parent else {}
        changed = sorted(
            p for p in old.keys() | tree.keys() if p not in old or p not in tree or old[p].oid != tree[p].oid
        )
        commit = Commit(hashlib.sha1(os.urandom(32)).hexdigest(), parent, title, message, author, tree, changed)
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _entry(self, repo: Repo, commit: Commit, path: str, expand: bool) -> dict | None:
        """Tree entry of a file or folder, as the /tree and /paths-info endpoints return it (None if absent)."""
        blob = commit.tree.get(path)
        if blob is None:
            inside = sorted(f"{p}:{b.oid}" for p, b in commit.tree.items() if p.startswith(path + "/"))
            oid = hashlib.sha1("\n".join(inside).encode()).hexdigest()
            return {"type": "directory", "oid": oid, "size": 0, "path": path} if inside and path else None
        out = {"type": "file", "oid": blob.oid, "size": len(blob.data), "path": path}
        if blob.lfs:
            out["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": blob.pointer_size}
        if expand:
            last = commit
            while last.parent and path not in last.files:
                last = repo.commits[last.parent]
            out["lastCommit"] = {"id": last.oid, "title": last.title, "date": last.date}
        return out

    def _listing(self, repo: Repo, commit: Commit, base: str, recursive: bool, expand: bool) -> list[dict]:
        prefix = base.strip("/") + "/" if base.strip("/") else ""
        paths: set[str] = set()
        for path in commit.tree:
            if path.startswith(prefix):
                parts = path[len(prefix) :].split("/")
                depths = range(1, len(parts) + 1) if recursive else [1]
                paths.update(prefix + "/".join(parts[:depth]) for depth in depths)
        if prefix and not paths:
            raise HubError(404, f"Entry not found: {base}", "EntryNotFound", commit.oid)
        return [self._entry(repo, commit, path, expand) for path in sorted(paths)]  # type: ignore[misc]

    def _info(self, repo: Repo, commit: Commit, query: dict) -> dict:
        siblings = []
        for path, blob in sorted(commit.tree.items()):
            sibling: dict = {"rfilename": path}
            if query.get("blobs", [""])[0] in ("true", "1", "True"):
                sibling.update(size=len(blob.data), blobId=blob.oid)
                if blob.lfs:  # NB: `sha256` here, where /tree says `oid`
                    sibling["lfs"] = {"sha256": blob.sha256, "size": len(blob.data), "pointerSize": blob.pointer_size}
            siblings.append(sibling)
        info = {"_id": repo.repo_id, "id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": commit.oid,
                "lastModified": commit.date, "createdAt": repo.created, "private": repo.private, "gated": False,
                "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                "usedStorage": sum(len(b.data) for b in commit.tree.values())}  # fmt: skip
        if "expand" in query:
            info = {key: value for key, value in info.items() if key in ("_id", "id", *query["expand"])}
        return info


class SilentServer(HubServer):
    """An endpoint that accepts TCP connections and never answers: the kernel completes the handshake from the
    listen backlog, nothing ever reads. For timeout tests (`with SilentServer() as s, s.activate(): ...`)."""

    def __init__(self) -> None:
        super().__init__()
        self._listener: socket.socket | None = None

    def start(self) -> SilentServer:
        if self._listener is None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(64)
            self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        return self

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
