"""The loopback Hub's HTTP side: routes the requests the `huggingface_hub` client makes (repo info, listings, resolve
with byte ranges, repo and branch creation, preupload, LFS batch and objects, NDJSON commits, whoami, YAML
validation) onto the `HubServer` that owns the repos, and answers errors the way the Hub does.

What this module does not do: hold state (`hub_server.HubServer` does; the handler reaches it as `server.hub`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from support.hub_store import PLURAL, RANGE, URL_PREFIX, Blob, HubError, Repo, is_lfs


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    hub: Any  # the hub_server.HubServer that owns the repos (not imported: it imports this module)

    def server_bind(self) -> None:  # skip HTTPServer's socket.getfqdn(), which can hang on a host without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: avoid 40 ms delayed-ACK stalls
    server: HubHTTPServer

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
                hub.answered += 1
                broken = hub.broken_from is not None and hub.answered >= hub.broken_from[0]
            if broken:
                return self._impostor(hub.broken_from[1])
            if inject:
                raise HubError(500, "Injected failure (HubServer.fail_next)")
            self._route(url.path.split("/")[1:], parse_qs(url.query), body)
        except HubError as e:
            headers = {"X-Error-Message": e.message, "X-Error-Code": e.code, "X-Repo-Commit": e.commit}
            self._send(e.status, {"error": e.message, **e.extra}, {k: v for k, v in headers.items() if v})
        except Exception as e:  # a malformed request or a bug: answer rather than drop the connection
            status = 400 if isinstance(e, (ValueError, LookupError, TypeError)) else 500
            self._send(status, {"error": repr(e)}, {"X-Error-Message": repr(e)[:500]})

    def _impostor(self, kind: str) -> None:
        """Answer 200 with what hub_impostor's server answers for `kind` (logged as a request like any other)."""
        from support.hub_impostor import ANSWERS

        content_type, body = ANSWERS[kind]
        self._send(200, raw=body, headers={"Content-Type": content_type})

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
        if seg[0] == "api" and len(seg) >= 4 and seg[1] in PLURAL:
            return self._api(PLURAL[seg[1]], "/".join(seg[2:4]), raw[4:], query, body, user)
        repo_type = "model"
        if seg[0] in ("datasets", "spaces"):
            repo_type, raw, seg = PLURAL[seg[0]], raw[1:], seg[1:]
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
        url = f"{hub.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"
        private = payload.get("visibility", "private" if payload.get("private") else "public") == "private"
        with hub._lock:
            if (repo_type, repo_id) in hub._repos:  # the client reads `url` from this 409 body when exist_ok=True
                raise HubError(409, f"You already created this {repo_type} repo: {repo_id}", url=url)
            repo = hub._repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, namespace, private)
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
                    lfs = f["size"] > 0 and is_lfs(f["path"], f["size"])
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

    def _commit(self, repo: Repo, branch: str, query: dict, body: bytes, user: str | None) -> None:
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
            pr_url = f"{hub.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}/discussions/{number}"
        tree = dict(head.tree)
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                tree[value["path"]] = Blob.make(base64.b64decode(value["content"]), lfs=False)
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
        url = f"{hub.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}/commit/{commit.oid}"
        self._send(200, {"success": True, "commitUrl": url, "commitOid": commit.oid, "pullRequestUrl": pr_url})

    def _lfs_batch(self, repo: Repo, payload: dict) -> None:
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
        blob = Blob.make(body, lfs=True)
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
        match = RANGE.fullmatch(self.headers.get("Range") or "")  # anything else (e.g. multi-range) is ignored
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
