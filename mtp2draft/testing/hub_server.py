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
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import json
import os
import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
LFS_MIN_SIZE = 1024 * 1024
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class _Blob:
    data: bytes
    lfs: bool
    oid: str  # git blob sha1 of the content, or of the LFS pointer file for LFS blobs
    sha256: str
    pointer_size: int

    @classmethod
    def make(cls, data: bytes, lfs: bool) -> _Blob:
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        stored = pointer if lfs else data
        oid = hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()
        return cls(data, lfs, oid, sha256, len(pointer))


@dataclass
class _Commit:
    oid: str
    parent: str | None
    title: str
    message: str
    author: str
    tree: dict[str, _Blob]  # full snapshot, never mutated once committed
    files: list[str]  # paths added, changed or deleted by this commit
    date: str = field(default_factory=_now)


@dataclass
class _Repo:
    repo_id: str
    repo_type: str
    owner: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)  # in creation order
    created: str = field(default_factory=_now)


class HubError(Exception):
    """An HTTP error answered the way the Hub does (status, X-Error-Code, X-Error-Message, JSON body)."""

    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.commit, self.extra = status, message, code, commit, extra


class HubServer:
    """In-memory loopback Hub. Use as a context manager; binds 127.0.0.1 on a free port."""

    def __init__(self, token: str | None = "hf_test_token", users: dict[str, str] | None = None):
        self.token = token  # None: auth disabled, every request may read and write everything
        self.users = dict(users) if users is not None else {"hf_test_token": "tester"}
        if token is not None:
            self.users.setdefault(token, "tester")
        self.endpoint = ""
        self.fail_next = 0
        self.bytes_served = 0
        self.requests: list[dict] = []
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._lfs: dict[str, _Blob] = {}  # LFS object store, by sha256
        self._lock = threading.RLock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._sockets: set[socket.socket] = set()

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> HubServer:
        if self._httpd is None:
            self._httpd = _Server(("127.0.0.1", 0), _Handler)
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
            repo = self._repos.setdefault((repo_type, repo_id), _Repo(repo_id, repo_type, owner, private))
            head = repo.branches.get(revision) or repo.branches.get("main")
            tree = dict(repo.commits[head].tree) if head else {}
            for path, data in files.items():
                tree[path] = _Blob.make(data, _is_lfs(path, len(data)))
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

    def _repo(self, repo_type: str, repo_id: str, user: str | None, write: bool = False) -> _Repo:
        repo = self._repos.get((repo_type, repo_id))
        allowed = self.token is None or (repo is not None and user == repo.owner)
        if repo is None or (repo.private and not allowed):
            status = 401 if user is None and repo is not None else 404
            raise HubError(status, f"Repository not found: {repo_type} {repo_id}", "RepoNotFound")
        if write and not allowed:
            raise HubError(401 if user is None else 403, f"You don't have the rights to write to {repo_id}")
        return repo

    def _resolve(self, repo: _Repo, revision: str) -> _Commit:
        oid = repo.branches.get(revision) or (revision if revision in repo.commits else None)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    def _commit(self, repo: _Repo, branch: str, parent: str | None, tree: dict[str, _Blob], title: str,
                message: str, author: str) -> _Commit:  # fmt: skip
        old = repo.commits[parent].tree if parent else {}
        changed = sorted(
            p for p in old.keys() | tree.keys() if p not in old or p not in tree or old[p].oid != tree[p].oid
        )
        commit = _Commit(hashlib.sha1(os.urandom(32)).hexdigest(), parent, title, message, author, tree, changed)
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def _entry(self, repo: _Repo, commit: _Commit, path: str, expand: bool) -> dict | None:
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

    def _listing(self, repo: _Repo, commit: _Commit, base: str, recursive: bool, expand: bool) -> list[dict]:
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

    def _info(self, repo: _Repo, commit: _Commit, query: dict) -> dict:
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    hub: HubServer

    def server_bind(self) -> None:  # skip HTTPServer's socket.getfqdn(), which can hang on a host without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: avoid 40 ms delayed-ACK stalls
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.hub._lock:
            self.server.hub._sockets.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.server.hub._lock:
            self.server.hub._sockets.discard(self.connection)

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def _handle(self) -> None:
        hub, url = self.server.hub, urlsplit(self.path)
        self._log = {"method": self.command, "path": unquote(url.path), "range": self.headers.get("Range"),
                     "status": None, "bytes": 0}  # fmt: skip
        try:
            body = self._read_body()
            with hub._lock:
                inject, hub.fail_next = hub.fail_next > 0, max(hub.fail_next - 1, 0)
            if inject:
                raise HubError(500, "Injected failure (HubServer.fail_next)")
            self._route(url.path.split("/")[1:], parse_qs(url.query), body)
        except HubError as e:
            headers = {"X-Error-Message": e.message, "X-Error-Code": e.code, "X-Repo-Commit": e.commit}
            self._send(e.status, {"error": e.message, **e.extra}, {k: v for k, v in headers.items() if v})
        except Exception as e:  # a malformed request or a bug: answer rather than drop the connection
            status = 400 if isinstance(e, (ValueError, LookupError, TypeError)) else 500
            self._send(status, {"error": repr(e)}, {"X-Error-Message": repr(e)[:500]})

    def _send(
        self, status: int, payload: object = None, headers: dict | None = None, raw: bytes | memoryview | None = None
    ):
        """Log the request, then answer. Logging first: a client may inspect `hub.requests` as soon as it has read."""
        hub = self.server.hub
        data = memoryview(raw if raw is not None else json.dumps(payload).encode() if payload is not None else b"")
        body = data if self.command != "HEAD" else data[:0]
        counted = raw is not None and self.command == "GET" and status in (200, 206)
        self._log.update(status=status, bytes=len(body))
        with hub._lock:
            hub.requests.append(self._log)
            hub.bytes_served += len(body) if counted else 0
        content_type = "application/octet-stream" if raw is not None else "application/json"
        sent = 0
        try:
            self.send_response(status)
            for key, value in {"Content-Type": content_type, **(headers or {}), "Content-Length": len(data)}.items():
                value = " ".join(str(value).split())  # header-safe: one line, latin-1
                self.send_header(key, value.encode("latin-1", "replace").decode("latin-1"))
            self.end_headers()
            while sent < len(body):
                self.wfile.write(body[sent : sent + (1 << 22)])
                sent = min(sent + (1 << 22), len(body))
        except OSError:  # the client went away: account only for what was sent
            with hub._lock:
                self._log["bytes"] = sent
                hub.bytes_served -= (len(body) - sent) if counted else 0
            self.close_connection = True

    def _route(self, raw: list[str], query: dict, body: bytes) -> None:
        hub, method, seg = self.server.hub, self.command, [unquote(s) for s in raw]
        if seg[0] == "__lfs":  # LFS upload/verify targets handed out by the batch endpoint (unauthenticated)
            return self._lfs_object(seg[1:], body)
        user = hub._user(self.headers.get("Authorization"))
        if seg == ["api", "whoami-v2"]:
            if user is None and hub.token is not None:
                raise HubError(401, "Invalid credentials in Authorization header")
            return self._send(200, {"type": "user", "name": user or "anonymous", "orgs": [],
                                    "auth": {"type": "access_token", "accessToken": {"role": "write"}}})  # fmt: skip
        if seg == ["api", "validate-yaml"] and method == "POST":
            return self._send(200, {})
        if seg == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(json.loads(body), user)
        if seg[0] == "api" and len(seg) >= 4 and seg[1] in _PLURAL:
            return self._api(_PLURAL[seg[1]], "/".join(seg[2:4]), raw[4:], query, body, user)
        repo_type = "model"
        if seg[0] in ("datasets", "spaces"):
            repo_type, raw, seg = _PLURAL[seg[0]], raw[1:], seg[1:]
        if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve_file(repo_type, "/".join(seg[:2]), seg[3], unquote("/".join(raw[4:])), user)
        if len(seg) == 6 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"]:
            repo = hub._repo(repo_type, f"{seg[0]}/{seg[1][:-4]}", user, write=True)
            return self._lfs_batch(repo, json.loads(body))
        raise HubError(404, f"Not found: {method} {self.path}")

    def _create_repo(self, payload: dict, user: str | None) -> None:
        hub = self.server.hub
        repo_type = payload.get("type") or "model"
        namespace = payload.get("organization") or user or "anonymous"
        if hub.token is not None and user is None:
            raise HubError(401, "You must be authenticated to create a repo")
        if hub.token is not None and namespace != user:
            raise HubError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{namespace}"')
        repo_id = f"{namespace}/{payload['name']}"
        url = f"{hub.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}"
        private = payload.get("visibility", "private" if payload.get("private") else "public") == "private"
        with hub._lock:
            if (repo_type, repo_id) in hub._repos:  # the client reads `url` from this 409 body when exist_ok=True
                raise HubError(409, f"You already created this {repo_type} repo: {repo_id}", url=url)
            repo = hub._repos[(repo_type, repo_id)] = _Repo(repo_id, repo_type, namespace, private)
            hub._commit(repo, "main", None, {}, "initial commit", "", namespace)
        self._send(200, {"url": url, "name": repo_id, "id": repo_id})

    def _api(self, repo_type: str, repo_id: str, rest: list[str], query: dict, body: bytes, user: str | None):
        hub, method = self.server.hub, self.command
        action, rev = (rest[0] if rest else ""), unquote("/".join(rest[1:]))  # revisions arrive quoted (safe="")
        with hub._lock:
            write = method == "POST" and action in ("preupload", "commit", "branch")
            repo = hub._repo(repo_type, repo_id, user, write=write)
            if method == "GET" and action in ("", "revision"):
                return self._send(200, hub._info(repo, hub._resolve(repo, rev or "main"), query))
            if method == "GET" and action == "tree":
                commit, path = hub._resolve(repo, unquote(rest[1])), unquote("/".join(rest[2:]))
                recursive, expand = (
                    query.get(key, [""])[0] in ("true", "1", "True") for key in ("recursive", "expand")
                )
                return self._send(200, hub._listing(repo, commit, path, recursive, expand))
            if method == "POST" and action == "paths-info":
                commit = hub._resolve(repo, rev)
                if body.lstrip().startswith(b"{"):
                    form = json.loads(body)
                    paths, expand = form.get("paths", []), bool(form.get("expand"))
                else:
                    form = parse_qs(body.decode())
                    paths, expand = form.get("paths", []), form.get("expand", [""])[0] in ("true", "True", "1")
                entries = (hub._entry(repo, commit, path.strip("/"), expand) for path in paths)
                return self._send(200, [entry for entry in entries if entry is not None])
            if method == "GET" and action == "refs":
                refs = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in repo.branches.items()]
                pulls = [{**r, "ref": r["name"]} for r in refs if r["name"].startswith("refs/pr/")]
                branches = [r for r in refs if not r["name"].startswith("refs/pr/")]
                return self._send(200, {"branches": branches, "converts": [], "tags": [], "pullRequests": pulls})
            if method == "GET" and action == "commits":
                commit, history = hub._resolve(repo, rev or "main"), []
                while commit is not None:
                    history.append({"id": commit.oid, "title": commit.title, "message": commit.message,
                                    "authors": [{"user": commit.author}], "date": commit.date})  # fmt: skip
                    commit = repo.commits[commit.parent] if commit.parent else None
                return self._send(200, history)
            if method == "POST" and action == "preupload":
                commit, files = hub._resolve(repo, rev), []
                for f in json.loads(body)["files"]:
                    lfs = f["size"] > 0 and _is_lfs(f["path"], f["size"])
                    files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False})
                    if (blob := commit.tree.get(f["path"])) is not None:  # the client then drops unchanged files
                        files[-1]["oid"] = blob.sha256 if blob.lfs else blob.oid
                return self._send(200, {"files": files, "commitOid": commit.oid})
            if method == "POST" and action == "commit":
                return self._commit(repo, rev, query, body, user)
            if method == "POST" and action == "branch":
                if rev in repo.branches:
                    raise HubError(409, f"Reference already exists: refs/heads/{rev}")
                start = (json.loads(body) if body.strip() else {}).get("startingPoint") or "main"
                repo.branches[rev] = hub._resolve(repo, start).oid
                return self._send(200, {})
        raise HubError(404, f"Not found: {method} {self.path}")

    def _commit(self, repo: _Repo, branch: str, query: dict, body: bytes, user: str | None) -> None:
        hub = self.server.hub
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        head = hub._resolve(repo, branch)
        if branch not in repo.branches:
            raise HubError(400, f"Cannot commit on a commit sha, use a branch name: {branch}")
        if header.get("parentCommit") and not head.oid.startswith(header["parentCommit"]):
            raise HubError(412, "A commit has happened since. Please refresh and try again.")
        pr_url = None
        if query.get("create_pr", ["0"])[0] in ("1", "true"):
            number = 1 + sum(name.startswith("refs/pr/") for name in repo.branches)
            branch = f"refs/pr/{number}"
            pr_url = f"{hub.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}/discussions/{number}"
        tree = dict(head.tree)
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                tree[value["path"]] = _Blob.make(base64.b64decode(value["content"]), lfs=False)
            elif key == "lfsFile":
                if value["oid"] not in hub._lfs:
                    raise HubError(400, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                tree[value["path"]] = hub._lfs[value["oid"]]
            elif key == "deletedFile" and tree.pop(value["path"], None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                tree = {path: blob for path, blob in tree.items() if not path.startswith(folder)}
        title, message = header.get("summary") or "", header.get("description") or ""
        commit = hub._commit(repo, branch, head.oid, tree, title, message, user or repo.owner)
        url = f"{hub.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}/commit/{commit.oid}"
        self._send(200, {"success": True, "commitUrl": url, "commitOid": commit.oid, "pullRequestUrl": pr_url})

    def _lfs_batch(self, repo: _Repo, payload: dict) -> None:
        hub, objects = self.server.hub, []
        for obj in payload.get("objects", []):
            objects.append({"oid": obj["oid"], "size": obj["size"], "authenticated": True})
            if obj["oid"] not in hub._lfs:  # no `actions` = already stored: the client skips the upload
                objects[-1]["actions"] = {"upload": {"href": f"{hub.endpoint}/__lfs/{obj['oid']}"},
                                          "verify": {"href": f"{hub.endpoint}/__lfs/verify"}}  # fmt: skip
        self._send(200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_object(self, seg: list[str], body: bytes) -> None:
        hub = self.server.hub
        if self.command == "POST" and seg == ["verify"]:
            obj = json.loads(body)
            blob = hub._lfs.get(obj["oid"])
            if blob is None or len(blob.data) != obj["size"]:
                raise HubError(404, f"LFS object {obj['oid']} (size {obj['size']}) not found")
            return self._send(200, {})
        if self.command != "PUT" or len(seg) != 1:
            raise HubError(404, f"Not found: {self.command} {self.path}")
        blob = _Blob.make(body, lfs=True)
        if blob.sha256 != seg[0]:
            raise HubError(400, f"sha256 mismatch: expected {seg[0]}, received {blob.sha256}")
        with hub._lock:
            hub._lfs[blob.sha256] = blob
        self._send(200, {})

    def _resolve_file(self, repo_type: str, repo_id: str, revision: str, path: str, user: str | None) -> None:
        hub = self.server.hub
        with hub._lock:
            commit = hub._resolve(hub._repo(repo_type, repo_id, user), revision)
        blob = commit.tree.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", commit.oid)
        size = len(blob.data)
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{blob.oid}"', "Accept-Ranges": "bytes"}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(size)})
        start, end, status = 0, size - 1, 200
        match = _RANGE.fullmatch(self.headers.get("Range") or "")  # anything else (e.g. multi-range) is ignored
        if match and (match[1] or match[2]):
            if match[1]:
                start, end = int(match[1]), min(int(match[2]), size - 1) if match[2] else size - 1
            else:
                start = size - min(int(match[2]), size) if int(match[2]) else size  # suffix "-0" is unsatisfiable
            if start >= size or start > end:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, {"error": f"Range not satisfiable: {match[0]} (size {size})"}, headers)
            status, headers["Content-Range"] = 206, f"bytes {start}-{end}/{size}"
        self._log["file"] = path
        self._send(status, headers=headers, raw=memoryview(blob.data)[start : end + 1])
