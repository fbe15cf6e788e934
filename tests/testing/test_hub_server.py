"""The loopback Hub against the real `huggingface_hub` client: downloads, ranges, uploads, errors, retries."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    hf_hub_download,
    hf_hub_url,
    metadata_update,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import get_session, http_backoff
from safetensors.torch import save as save_safetensors
from support.hub_server import HubServer

pytestmark = [
    pytest.mark.hub,
    # The client itself PUTs LFS bytes with httpx2's deprecated `data=<file>`: not ours to fix.
    pytest.mark.filterwarnings("ignore:Use 'content=<...>' to upload raw bytes:DeprecationWarning"),
]

FILES = {
    "config.json": b'{"model_type": "toy", "hidden_size": 8}',
    "model.safetensors": bytes(range(256)) * 4,  # LFS by suffix
    "nested/dir/notes.txt": b"hello from a subfolder\n",
}


def _lfs_puts(hub: HubServer) -> list[dict]:
    return [r for r in hub.requests if r["method"] == "PUT" and r["path"].startswith("/__lfs/")]


def _write_folder(folder: Path, text: str, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.txt").write_text(text)
    (folder / "weights.safetensors").write_bytes(weights)
    return folder


def test_hf_hub_download_and_snapshot_download(tmp_path: Path) -> None:
    with HubServer() as hub, hub.activate():
        sha = hub.add_repo("tester/toy", FILES)
        assert len(sha) == 40 and int(sha, 16) >= 0

        path = hf_hub_download("tester/toy", "model.safetensors", cache_dir=tmp_path / "c1")
        assert Path(path).read_bytes() == FILES["model.safetensors"]
        assert f"/snapshots/{sha}/" in path
        path = hf_hub_download("tester/toy", "nested/dir/notes.txt", revision=sha, cache_dir=tmp_path / "c1")
        assert Path(path).read_bytes() == FILES["nested/dir/notes.txt"]

        snap = Path(snapshot_download("tester/toy", cache_dir=tmp_path / "c2"))
        assert {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()} == FILES

        hub.reset_counters()
        only = Path(snapshot_download("tester/toy", cache_dir=tmp_path / "c3", allow_patterns=["*.json"]))
        assert sorted(p.name for p in only.rglob("*") if p.is_file()) == ["config.json"]
        assert hub.bytes_served == len(FILES["config.json"])
        assert hub.bytes_served_for("model.safetensors") == 0

        local = Path(snapshot_download("tester/toy", local_dir=tmp_path / "local"))
        assert (local / "nested/dir/notes.txt").read_bytes() == FILES["nested/dir/notes.txt"]


def test_repo_info_tree_paths_info_refs_and_commits() -> None:
    with HubServer() as hub, hub.activate():
        sha = hub.add_repo("tester/toy", FILES)
        api = HfApi()
        info = api.model_info("tester/toy")
        assert info.sha == sha and info.private is False
        assert sorted(s.rfilename for s in info.siblings) == sorted(FILES)

        detailed = {s.rfilename: s for s in api.model_info("tester/toy", files_metadata=True).siblings}
        assert detailed["model.safetensors"].size == len(FILES["model.safetensors"])
        assert detailed["model.safetensors"].lfs.sha256 == hashlib.sha256(FILES["model.safetensors"]).hexdigest()
        assert detailed["config.json"].lfs is None

        assert sorted(api.list_repo_files("tester/toy")) == sorted(FILES)
        top = {e.path: type(e).__name__ for e in api.list_repo_tree("tester/toy")}
        assert top == {"config.json": "RepoFile", "model.safetensors": "RepoFile", "nested": "RepoFolder"}
        assert [e.path for e in api.list_repo_tree("tester/toy", path_in_repo="nested/dir")] == ["nested/dir/notes.txt"]
        with pytest.raises(RemoteEntryNotFoundError):
            list(api.list_repo_tree("tester/toy", path_in_repo="missing"))

        infos = {e.path: e for e in api.get_paths_info("tester/toy", ["model.safetensors", "nested", "nope.txt"])}
        assert set(infos) == {"model.safetensors", "nested"}
        assert infos["model.safetensors"].lfs.size == len(FILES["model.safetensors"])
        assert infos["model.safetensors"].size == len(FILES["model.safetensors"])

        second = hub.add_repo("tester/toy", {"config.json": b"{}"})
        assert api.model_info("tester/toy", revision=sha).sha == sha  # a commit sha is a revision too
        refs = api.list_repo_refs("tester/toy")
        assert [(b.name, b.target_commit) for b in refs.branches] == [("main", second)]
        assert [c.commit_id for c in api.list_repo_commits("tester/toy")] == [second, sha]
        assert [c["oid"] for c in hub.commits("tester/toy")] == [second, sha]
        assert hub.commits("tester/toy")[0]["files"] == ["config.json"]
        assert hub.files("tester/toy", revision=sha) == FILES
        assert api.repo_exists("tester/toy") and not api.repo_exists("tester/nope")
        assert api.file_exists("tester/toy", "config.json") and not api.file_exists("tester/toy", "x.bin")


def test_range_requests_and_byte_accounting() -> None:
    data = bytes(range(200))
    with HubServer() as hub, hub.activate():
        hub.add_repo("tester/toy", {"blob.bin": data, "small.txt": b"0123456789"})
        url = hf_hub_url("tester/toy", "blob.bin")
        session = get_session()
        hub.reset_counters()

        cases = {
            "bytes=10-19": data[10:20],
            "bytes=190-": data[190:],
            "bytes=-5": data[-5:],
            "bytes=195-999": data[195:],
        }
        for header, expected in cases.items():
            response = session.get(url, headers={"Range": header})
            assert response.status_code == 206, header
            assert response.content == expected, header
            start = 200 - len(expected) if header.startswith("bytes=-") else int(header[6:].split("-")[0])
            assert response.headers["Content-Range"] == f"bytes {start}-{start + len(expected) - 1}/200"
        expected_total = sum(len(v) for v in cases.values())
        assert hub.bytes_served == expected_total

        full = session.get(url)
        assert full.status_code == 200 and full.content == data
        assert full.headers["Accept-Ranges"] == "bytes"
        assert full.headers["X-Linked-Size"] == "200" and full.headers["X-Repo-Commit"]
        head = session.head(url)
        assert head.status_code == 200 and head.headers["Content-Length"] == "200"
        for bad in ("bytes=200-", "bytes=500-600", "bytes=-0"):
            response = session.get(url, headers={"Range": bad})
            assert response.status_code == 416, bad
            assert response.headers["Content-Range"] == "bytes */200"
        small = session.get(hf_hub_url("tester/toy", "small.txt"), headers={"Range": "bytes=3-4"})
        assert small.content == b"34" and "X-Linked-Etag" not in small.headers

        assert hub.bytes_served == expected_total + 200 + 2  # HEAD and 416 count nothing
        assert hub.bytes_served_for("blob.bin") == expected_total + 200
        assert hub.bytes_served_for("small.txt") == 2
        logged = [r for r in hub.requests if r["range"] == "bytes=10-19"]
        assert logged == [{"method": "GET", "path": "/tester/toy/resolve/main/blob.bin", "range": "bytes=10-19",
                           "status": 206, "bytes": 10, "file": "blob.bin"}]  # fmt: skip


def test_parse_safetensors_metadata_reads_only_the_header() -> None:
    tensors = {"embed.weight": torch.arange(4096, dtype=torch.float32).reshape(64, 64), "bias": torch.ones(3)}
    blob = save_safetensors(tensors, metadata={"format": "pt"})
    with HubServer() as hub, hub.activate():
        hub.add_repo("tester/st", {"model.safetensors": blob + bytes(200_000)})  # padding: the header read is ranged
        hub.reset_counters()
        meta = HfApi().parse_safetensors_file_metadata("tester/st", "model.safetensors")
        assert meta.metadata == {"format": "pt"}
        assert meta.tensors["embed.weight"].shape == [64, 64] and meta.tensors["embed.weight"].dtype == "F32"
        assert hub.bytes_served < 100_002 and hub.requests[0]["range"] == "bytes=0-100000"

        header_len = struct.unpack("<Q", blob[:8])[0]
        begin, end = json.loads(blob[8 : 8 + header_len])["embed.weight"]["data_offsets"]
        url = hf_hub_url("tester/st", "model.safetensors")
        start = 8 + header_len + begin
        raw = get_session().get(url, headers={"Range": f"bytes={start}-{start + end - begin - 1}"}).content
        tensor = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(64, 64)
        assert torch.equal(tensor, tensors["embed.weight"])


def test_create_repo_and_upload_folder_roundtrip(tmp_path: Path) -> None:
    weights = os.urandom(1024 * 1024 + 17)
    folder = _write_folder(tmp_path / "out", "tiny draft\n", weights)
    with HubServer() as hub, hub.activate():
        api = HfApi()
        url = api.create_repo("draft")
        assert url.repo_id == "tester/draft" and url.endpoint == hub.endpoint
        assert api.create_repo("tester/draft", exist_ok=True).repo_id == "tester/draft"
        with pytest.raises(HfHubHTTPError) as exc:
            api.create_repo("tester/draft")
        assert exc.value.response.status_code == 409

        info = api.upload_folder(repo_id="tester/draft", folder_path=folder, commit_message="first upload")
        assert info.oid == hub.commits("tester/draft")[0]["oid"]
        assert hub.files("tester/draft") == {"README.txt": b"tiny draft\n", "weights.safetensors": weights}
        assert len(_lfs_puts(hub)) == 1
        tree = {e.path: e for e in api.list_repo_tree("tester/draft")}
        assert tree["weights.safetensors"].lfs is not None and tree["README.txt"].lfs is None

        snap = Path(snapshot_download("tester/draft", cache_dir=tmp_path / "fresh"))
        assert (snap / "weights.safetensors").read_bytes() == weights
        assert (snap / "README.txt").read_text() == "tiny draft\n"


def test_reupload_does_not_resend_stored_lfs_objects(tmp_path: Path) -> None:
    weights = os.urandom(1024 * 1024 + 1)
    folder = _write_folder(tmp_path / "out", "v1\n", weights)
    with HubServer() as hub, hub.activate():
        api = HfApi()
        api.create_repo("tester/draft")
        first = api.upload_folder(repo_id="tester/draft", folder_path=folder).oid
        assert len(_lfs_puts(hub)) == 1

        # Unchanged folder: like the real Hub, preupload reports the remote oids and the client makes no commit.
        assert api.upload_folder(repo_id="tester/draft", folder_path=folder).oid == first
        # Changed text + the same weights under a second name: a new commit, but the LFS object is not re-sent.
        _write_folder(folder, "v2\n", weights)
        (folder / "copy.safetensors").write_bytes(weights)
        second = api.upload_folder(repo_id="tester/draft", folder_path=folder).oid
        assert second != first
        assert len(_lfs_puts(hub)) == 1
        assert hub.commits("tester/draft")[0]["files"] == ["README.txt", "copy.safetensors"]
        assert hub.files("tester/draft")["copy.safetensors"] == weights
        assert len(hub.commits("tester/draft")) == 3  # initial (empty) commit from create_repo + 2 uploads


def test_branch_pr_delete_and_parent_commit(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "out", "on dev\n", b"w" * 10)
    with HubServer() as hub, hub.activate():
        api = HfApi()
        main = hub.add_repo("tester/draft", {"README.txt": b"on main\n"})
        api.create_branch("tester/draft", branch="dev")
        api.create_branch("tester/draft", branch="dev", exist_ok=True)
        api.upload_folder(repo_id="tester/draft", folder_path=folder, revision="dev")
        assert hub.files("tester/draft", revision="dev")["README.txt"] == b"on dev\n"
        assert hub.files("tester/draft") == {"README.txt": b"on main\n"}
        assert {b.name for b in api.list_repo_refs("tester/draft").branches} == {"main", "dev"}
        path = hf_hub_download("tester/draft", "README.txt", revision="dev", cache_dir=tmp_path / "c")
        assert Path(path).read_bytes() == b"on dev\n"

        add = [CommitOperationAdd("pr.txt", b"proposal")]
        pr = api.create_commit("tester/draft", operations=add, commit_message="PR", create_pr=True)
        assert pr.pr_revision == "refs/pr/1" and "pr.txt" in hub.files("tester/draft", revision="refs/pr/1")
        assert "pr.txt" not in hub.files("tester/draft")

        delete = [CommitOperationDelete("README.txt")]
        with pytest.raises(HfHubHTTPError) as exc:
            api.create_commit("tester/draft", operations=delete, commit_message="x", parent_commit="0" * 40)
        assert exc.value.response.status_code == 412
        api.create_commit("tester/draft", operations=delete, commit_message="rm", parent_commit=main)
        assert hub.files("tester/draft") == {}


def test_metadata_update_pushes_a_model_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with HubServer() as hub, hub.activate():
        hub.add_repo("tester/draft", {"config.json": b"{}"})
        metadata_update("tester/draft", {"license": "apache-2.0", "tags": ["speculative-decoding"]})
        card = hub.files("tester/draft")["README.md"].decode()
        assert "license: apache-2.0" in card and "speculative-decoding" in card
        assert any(r["path"] == "/api/validate-yaml" for r in hub.requests)


def test_errors_map_to_client_exceptions(tmp_path: Path) -> None:
    with HubServer(users={"hf_test_token": "tester", "hf_other": "other"}) as hub, hub.activate():
        hub.add_repo("tester/toy", FILES)
        hub.add_repo("other/theirs", {"a.txt": b"a"})
        hub.add_repo("tester/secret", {"a.txt": b"a"}, private=True)
        api = HfApi()
        cache = tmp_path / "cache"
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download("tester/missing", "config.json", cache_dir=cache)
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("tester/missing")
        with pytest.raises(RevisionNotFoundError):
            hf_hub_download("tester/toy", "config.json", revision="nope", cache_dir=cache)
        with pytest.raises(RevisionNotFoundError):
            api.list_repo_files("tester/toy", revision="nope")
        with pytest.raises(RemoteEntryNotFoundError) as missing:
            hf_hub_download("tester/toy", "missing.json", cache_dir=cache)
        assert isinstance(missing.value, EntryNotFoundError)

        assert api.model_info("tester/secret").private is True
        with pytest.raises(RepositoryNotFoundError) as private:
            api.model_info("tester/secret", token=False)
        assert private.value.response.status_code == 401
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("tester/secret", token="hf_other")

        with pytest.raises(HfHubHTTPError) as forbidden:
            api.create_repo("other/new-repo")
        assert forbidden.value.response.status_code == 403
        assert 'namespace "other"' in forbidden.value.response.headers["X-Error-Message"]
        with pytest.raises(HfHubHTTPError) as forbidden:
            api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="other/theirs")
        assert forbidden.value.response.status_code == 403
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="other/theirs", token="hf_other")
        assert hub.files("other/theirs")["x.txt"] == b"x"

        assert api.whoami()["name"] == "tester" and api.whoami(token="hf_other")["name"] == "other"
        with pytest.raises(HfHubHTTPError) as bad:
            api.whoami(token="hf_wrong")
        assert bad.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError) as bad:
            api.model_info("tester/toy", token="hf_wrong")
        assert bad.value.response.status_code == 401


def test_fail_next_is_absorbed_by_client_retries(tmp_path: Path) -> None:
    with HubServer() as hub, hub.activate():
        hub.add_repo("tester/toy", FILES)
        hub.fail_next = 1
        path = hf_hub_download("tester/toy", "config.json", cache_dir=tmp_path)
        assert Path(path).read_bytes() == FILES["config.json"]
        assert [r["status"] for r in hub.requests[-3:]] == [500, 200, 200] and hub.fail_next == 0

        hub.fail_next = 2
        response = http_backoff("GET", hf_hub_url("tester/toy", "config.json"), base_wait_time=0.01)
        assert response.status_code == 200 and response.content == FILES["config.json"]
        assert [r["status"] for r in hub.requests[-3:]] == [500, 500, 200]


def test_activate_patches_and_restores_client_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import hf_api

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def state() -> tuple:
        return (
            constants.ENDPOINT,
            constants.HUGGINGFACE_CO_URL_TEMPLATE,
            constants.HF_HUB_DISABLE_XET,
            hf_api.api.endpoint,
        )

    before = state()
    with HubServer(token=None) as hub:
        with hub.activate():
            assert constants.ENDPOINT == hub.endpoint == os.environ["HF_ENDPOINT"] == hf_api.api.endpoint
            assert constants.HF_HUB_DISABLE_XET and "HF_TOKEN" not in os.environ and "HF_HUB_OFFLINE" not in os.environ
            hub.add_repo("someone/anything", {"a.txt": b"a"}, private=True)
            assert hf_api.model_info("someone/anything").sha  # auth disabled: private repos are readable
            hf_api.upload_file(path_or_fileobj=b"b", path_in_repo="b.txt", repo_id="someone/anything")
            assert hub.files("someone/anything") == {"a.txt": b"a", "b.txt": b"b"}
        assert state() == before and os.environ["HF_HUB_OFFLINE"] == "1"


def test_datasets_and_folder_sources(tmp_path: Path) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.txt").write_bytes(b"x")
    (tmp_path / "src" / "big.dat").write_bytes(b"\0" * (1024 * 1024))  # LFS by size
    with HubServer() as hub, hub.activate():
        hub.add_repo("tester/data", tmp_path / "src", repo_type="dataset")
        files = HfApi().list_repo_tree("tester/data", repo_type="dataset", recursive=True)
        is_lfs = {e.path: getattr(e, "lfs", None) is not None for e in files}
        assert is_lfs == {"big.dat": True, "sub": False, "sub/x.txt": False}
        path = hf_hub_download("tester/data", "sub/x.txt", repo_type="dataset", cache_dir=tmp_path / "c")
        assert Path(path).read_bytes() == b"x"
        with pytest.raises(RepositoryNotFoundError):
            HfApi().model_info("tester/data")  # a dataset is not a model


def test_lfs_upload_target_accepts_chunked_bodies_and_checks_sha256() -> None:
    data = os.urandom(100_000)
    oid = hashlib.sha256(data).hexdigest()
    with HubServer() as hub, hub.activate():
        session = get_session()
        assert session.put(f"{hub.endpoint}/__lfs/{oid}", content=b"not it").status_code == 400
        chunked = session.put(f"{hub.endpoint}/__lfs/{oid}", content=iter([data[:5000], data[5000:]]))
        assert chunked.status_code == 200
        hub.add_repo("tester/toy", {"a.txt": b"a"})
        batch = session.post(
            f"{hub.endpoint}/tester/toy.git/info/lfs/objects/batch",
            headers={"Authorization": "Bearer hf_test_token"},
            json={"operation": "upload", "objects": [{"oid": oid, "size": len(data)}, {"oid": "0" * 64, "size": 1}]},
        ).json()
        assert batch["transfer"] == "basic"
        assert "actions" not in batch["objects"][0]  # already stored: nothing to upload
        assert batch["objects"][1]["actions"]["upload"]["href"] == f"{hub.endpoint}/__lfs/{'0' * 64}"
    with pytest.raises(httpx2.ConnectError):  # stopped: the port is closed
        get_session().get(f"{hub.endpoint}/api/whoami-v2")
