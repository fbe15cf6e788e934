"""What must never happen, proven end to end: a Hub token in anything written or pushed, an offline rerun that
forgets what it fetched, `--overwrite` / `--resume` deleting what mtp2draft did not write. (Traversal, pickles and
inputs used as outputs are rows of tests/test_bad_inputs.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import constants
from support.hub_server import HubServer

from mtp2draft.cli.app import main
from mtp2draft.evaluation.saved import save_evaluation
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.redact import command_line, redact, register_secret, scrub

TOKEN = "hf_" + "Q7xK" * 9  # shaped like a real user access token
REPORT = {"results": [{"name": "d", "num_draft_tokens": 2, "mean_acceptance_length": 1.5,
                       "acceptance_per_position": [0.4, 0.2], "per_draft_acceptance": [0.4, 0.1]}]}  # fmt: skip
OTHER = "not-shaped-like-a-token-but-secret"


def _every_file(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_command_lines_are_recorded_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", OTHER)
    argv = ["/usr/bin/mtp2draft", "convert", "org/m", "--token", "abc12345xyz", "--out", "o", f"--token={TOKEN}"]
    assert command_line(argv) == "mtp2draft convert org/m --token *** --out o --token=***"
    # a token typed where no option expects one, and the environment's token, are redacted too
    assert command_line(["mtp2draft", "push", f"--repo-id={TOKEN}", OTHER]) == "mtp2draft push --repo-id=*** ***"
    register_secret("s3cret-value-1234")
    assert scrub({"a": ["x s3cret-value-1234 y"], "b": 3}) == {"a": ["x *** y"], "b": 3}
    assert redact("short") == "short"  # only strings that can be secrets are masked


@pytest.mark.hub
def test_a_token_never_reaches_anything_written_or_pushed(
    build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    work = tmp_path / "work"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache" / "hub"))
    monkeypatch.setenv("MTP2DRAFT_CACHE", str(tmp_path / "cache" / "ranges"))
    with HubServer(token=TOKEN) as hub, hub.activate():
        monkeypatch.delenv("HF_TOKEN")  # the token only arrives through --token
        hub.add_repo("org/tiny", build("deepseek_v3", num_hidden_layers=6), owner_token=TOKEN)
        assert main(["convert", "org/tiny", "--to", "eagle3", "--out", str(work / "e3"), "--token", TOKEN]) == 0
        assert main(["export", str(work / "e3"), "--format", "sglang", "--out", str(work / "x"), "--token", TOKEN]) == 0
        # an export written by an older mtp2draft that recorded the command line verbatim
        prov = json.loads((work / "x" / "provenance.json").read_text())
        (work / "x" / "provenance.json").write_text(json.dumps({**prov, "command": f"convert --token {TOKEN}"}))
        assert main(["push", str(work / "x"), "--repo-id", "tester/draft", f"--token={TOKEN}"]) == 0
        pushed = hub.files("tester/draft")
    out, err = capsys.readouterr()
    written = _every_file(work)
    assert pushed and written and "provenance.json" in pushed and "README.md" in pushed
    leaks = [name for name, data in {**written, **pushed}.items() if TOKEN.encode() in data and "x/prov" not in name]
    assert leaks == [] and TOKEN not in out + err
    recorded = json.loads((work / "e3" / "provenance.json").read_text())["command"]
    assert "--token ***" in recorded and recorded.split()[1:3] == ["convert", "org/tiny"]
    assert b"--token ***" in pushed["provenance.json"]  # the old file went up redacted; the user's copy is untouched
    assert TOKEN.encode() in (work / "x" / "provenance.json").read_bytes()


@pytest.mark.hub
def test_push_refuses_a_link_that_leads_outside_the_directory(build, hub, tmp_path: Path, capsys) -> None:
    assert (
        main(["convert", str(build("mimo", num_hidden_layers=6)), "--to", "eagle3", "--out", str(tmp_path / "e3")]) == 0
    )
    assert main(["export", str(tmp_path / "e3"), "--format", "sglang", "--out", str(tmp_path / "x")]) == 0
    (tmp_path / "secret.txt").write_text("private notes")
    (tmp_path / "x" / "notes.txt").symlink_to(tmp_path / "secret.txt")
    capsys.readouterr()
    assert main(["push", str(tmp_path / "x"), "--repo-id", "tester/draft"]) == 2
    assert "leads outside" in capsys.readouterr().err
    with pytest.raises(KeyError):  # refused before the repo is created: no empty repo is left behind
        hub.files("tester/draft")


@pytest.mark.hub
def test_offline_rerun_reuses_what_an_online_convert_fetched(
    build, hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    hub.add_repo("org/tiny", build("deepseek_v3"))
    assert main(["convert", "org/tiny", "--out", str(tmp_path / "online")]) == 0
    served = hub.bytes_served
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    capsys.readouterr()
    assert main(["convert", "org/tiny", "--out", str(tmp_path / "offline")]) == 0, capsys.readouterr().err
    assert hub.bytes_served == served  # nothing fetched
    a, b = (tmp_path / "online" / "model.safetensors"), (tmp_path / "offline" / "model.safetensors")
    assert a.read_bytes() == b.read_bytes()
    # a revision never fetched online is still a clear one-line miss
    assert main(["convert", "org/tiny", "--revision", "v9", "--out", str(tmp_path / "v9")]) == 2
    assert "not in the local cache" in capsys.readouterr().err


def test_overwrite_replaces_only_what_mtp2draft_wrote(build, tmp_path: Path, capsys) -> None:
    src = str(build("mimo"))
    assert main(["convert", src, "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / ".mtp2draft").is_file()
    assert main(["convert", src, "--out", str(tmp_path / "d"), "--overwrite"]) == 0  # ours: replaced
    (tmp_path / "empty").mkdir()
    assert main(["convert", src, "--out", str(tmp_path / "empty"), "--overwrite"]) == 0  # empty: fine
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("keep")
    assert main(["convert", src, "--out", str(mine), "--overwrite"]) == 2
    assert (mine / "a.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["a.txt"]
    # a file the user put inside a draft mtp2draft wrote makes it theirs too: refused, the file named, nothing lost
    (tmp_path / "d" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["convert", src, "--out", str(tmp_path / "d"), "--overwrite"]) == 2
    assert "(notes.txt)" in capsys.readouterr().err and (tmp_path / "d" / "notes.txt").read_text() == "mine"
    (tmp_path / "d" / "notes.txt").unlink()
    # what evaluate --save adds is on the manifest: the draft stays replaceable
    save_evaluation(tmp_path / "d", REPORT)
    assert main(["convert", src, "--out", str(tmp_path / "d"), "--overwrite"]) == 0


def test_a_planted_temporary_link_is_never_followed(tmp_path: Path) -> None:
    """evaluate --save writes evaluation.json and its chart through fresh temporary names: links planted at the
    names an older mtp2draft used (`evaluation.json.tmp`, `.acceptance.png.tmp`) leave their targets untouched."""
    draft = tmp_path / "draft"
    draft.mkdir()
    for name in ("evaluation.json.tmp", ".acceptance.png.tmp", ".evaluation.json.tmp"):
        (tmp_path / f"outside-{name}").write_text("private")
        (draft / name).symlink_to(tmp_path / f"outside-{name}")
    report = REPORT
    save_evaluation(draft, report)
    assert all(p.read_text() == "private" for p in tmp_path.glob("outside-*"))
    assert json.loads((draft / "evaluation.json").read_text()) == report


def test_a_killed_writes_temporary_directory_is_removed_by_the_next_run(build, tmp_path: Path) -> None:
    """A run killed while writing leaves `.OUT.tmp-*` (marked partial); the next run into OUT removes it. A
    directory of the user's with a similar name is left alone."""
    src = str(build("mimo"))
    with pytest.raises(KeyboardInterrupt), atomic_output_dir(tmp_path / "o") as tmp:
        (tmp / "model.safetensors").write_bytes(b"half")
        os.rename(tmp, tmp_path / ".o.tmp-killed")  # what a kill -9 leaves (the cleanup never runs)
        tmp.mkdir()
        raise KeyboardInterrupt
    (tmp_path / ".o.tmp-mine").mkdir()
    assert main(["convert", src, "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".o.")) == [".o.tmp-mine"]


def test_the_safety_page_counts_every_hostile_case() -> None:
    """docs/safety.md's table, per command and per table, is what the four hostile-case tables hold today."""
    from case_tables import PAGE, descriptions, expected_block, table, table_block

    text = PAGE.read_text()
    expected = expected_block(text)
    assert table_block(text) == expected, (
        f"{PAGE.name}'s case table is not what the tables count; `PYTHONPATH=tests python -m case_tables --write` "
        f"writes:\n{expected}"
    )
    empty = [command for command, said in descriptions(expected).items() if not said]
    assert not empty, f"describe what {PAGE.name} refuses for {empty}"
    assert set(descriptions(expected)) == set(table())
    assert sum(sum(c.values()) for c in table().values()) > 150


def test_only_token_shapes_and_the_token_itself_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A path a person named is recorded as named, even with `hf_` and many letters in it; a string shaped like a
    Hub token (30+ random letters and digits, both cases) or the token this process holds is masked."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("mtp2draft.redact.known_secrets", lambda: set())
    for path in ("/data/hf_abcdefghijklmnopqrstuvwxyz/model", "/srv/hf_models_cache_for_the_team_2026/x", "api_key"):
        assert redact(path, set()) == path
    assert redact(f"--token {TOKEN}", set()) == "--token ***"
    assert redact("x/hf_abcdefghijklmnopqrstuvwxyz/y", {"hf_abcdefghijklmnopqrstuvwxyz"}) == "x/***/y"


def test_a_work_directory_of_marked_stages_is_judged_by_their_manifests(tmp_path: Path) -> None:
    from mtp2draft.manifest import foreign_file, mark

    work = tmp_path / "work"
    (work / "raw-mtp").mkdir(parents=True)
    (work / "raw-mtp" / "model.safetensors").write_bytes(b"")
    mark(work / "raw-mtp")
    mark(work, files=())  # `run --work`: its stages mark their own directories
    assert foreign_file(work) is None
    (work / "raw-mtp" / "notes.txt").write_text("mine")
    assert foreign_file(work) == work / "raw-mtp" / "notes.txt"


def test_a_hub_cache_snapshot_of_links_into_its_blobs_is_read(build, tmp_path: Path) -> None:
    """What "nothing outside the named directory is read" allows: a Hub cache snapshot, whose files are links into
    the repo's own `blobs/`. A link from a snapshot to anywhere else is refused like any other."""
    src = build("mimo")
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for n, file in enumerate(sorted(src.iterdir())):
        (repo / "blobs" / f"blob{n}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{n}")
    assert main(["convert", str(snapshot), "--out", str(tmp_path / "d")]) == 0
    shard = sorted(snapshot.glob("*.safetensors"))[-1]  # the shard holding the MTP layer
    (tmp_path / "outside.safetensors").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(tmp_path / "outside.safetensors")
    assert main(["convert", str(snapshot), "--out", str(tmp_path / "e")]) == 2


def test_a_marker_of_an_older_mtp2draft_still_vouches_for_its_files(build, tmp_path: Path) -> None:
    """An older marker (plain text, no list) covers the kinds of file mtp2draft writes; evaluate --save turning it
    into a manifest keeps them covered, and a user's file is still refused."""
    from mtp2draft.manifest import MARKER, foreign_file

    src = str(build("mimo"))
    assert main(["convert", src, "--out", str(tmp_path / "d")]) == 0
    (tmp_path / "d" / MARKER).write_text("written by mtp2draft; `--overwrite` may replace this directory\n")
    save_evaluation(tmp_path / "d", REPORT)
    assert foreign_file(tmp_path / "d") is None
    (tmp_path / "d" / "notes.txt").write_text("mine")
    assert foreign_file(tmp_path / "d") == tmp_path / "d" / "notes.txt"
