"""The convert stage: local and hub sources, bytes fetched, atomic output, and every bad input as a one-line error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.fixtures import eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, inspect_checkpoint, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.family.spec import find_spec
from mtp2draft.settings import HubAccess


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_reads_headers_only(build) -> None:
    info = inspect_checkpoint(str(build("deepseek_v3_fp8")))
    assert info["spec"] == "deepseek_v3" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["fp8_weights"] > 0 and layer["stored_embed"] and layer["stored_head"]
    names = {t["name"] for t in layer["tensors"]}
    assert "model.layers.2.eh_proj.weight" in names and "model.layers.2.shared_head.head.weight" not in names
    assert 0 < info["convert_bytes"] < info["checkpoint_bytes"]
    header_bytes = info["bytes_read_by_inspect"]
    assert header_bytes < info["convert_bytes"]  # headers, not tensors


# ---- bad input: one line, exit 2, no traceback, nothing written ----------------------------------------------
def _assert_clean_failure(code: int, out: str, err: str, needle: str, out_dir: Path | None = None) -> None:
    assert code == 2  # Mtp2DraftError's status: the input is at fault
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and out == ""
    if out_dir is not None:
        assert not out_dir.exists() or not any(out_dir.iterdir())
        assert not [p for p in out_dir.parent.iterdir() if p.name.startswith(f".{out_dir.name}")]


def test_unknown_family_lists_supported(build, tmp_path: Path, capsys) -> None:
    path = tmp_path / "llama"
    shutil.copytree(build("mimo"), path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    code, out, err = run_cli(capsys, "convert", str(path), "--out", str(tmp_path / "o"))
    _assert_clean_failure(code, out, err, "no spec matches", tmp_path / "o")
    # one short line pointing at the list (naming every family made it 1,173 characters)
    assert "`mtp2draft specs` lists them" in err and len(err.strip().splitlines()[-1]) < 300


def test_checkpoint_without_mtp_layer(build, tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "convert", str(build("kimi_k2")), "--out", str(tmp_path / "o"))
    _assert_clean_failure(code, out, err, "has no MTP layer (num_nextn_predict_layers is 0)", tmp_path / "o")


def test_checkpoint_declaring_mtp_but_holding_no_keys(build, tmp_path: Path, capsys) -> None:
    path = tmp_path / "ck"
    shutil.copytree(build("kimi_k2"), path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_cli(capsys, "convert", str(path), "--out", str(tmp_path / "o"))
    _assert_clean_failure(code, out, err, "holds no MTP weights", tmp_path / "o")


def test_layer_out_of_range(build, tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "convert", str(build("mimo")), "--out", str(tmp_path / "o"), "--layer", "3")
    _assert_clean_failure(code, out, err, "--layer 3 is out of range", tmp_path / "o")


def test_out_not_empty_without_overwrite(build, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    code, out, err = run_cli(capsys, "convert", str(build("mimo")), "--out", str(out_dir))
    assert code == 2 and "--overwrite" in err and (out_dir / "keep.txt").read_text() == "mine"
    # --overwrite never deletes files mtp2draft did not write ...
    code, out, err = run_cli(capsys, "convert", str(build("mimo")), "--out", str(out_dir), "--overwrite")
    assert code == 2 and "did not write" in err and (out_dir / "keep.txt").read_text() == "mine"
    # ... and replaces a directory it did write, unless a file it did not write was put in it since
    ours = tmp_path / "ours"
    assert run_cli(capsys, "convert", str(build("mimo")), "--out", str(ours))[0] == 0
    code, out, err = run_cli(capsys, "convert", str(build("mimo")), "--out", str(ours), "--overwrite")
    assert code == 0 and (ours / "model.safetensors").is_file()
    (ours / "added.txt").write_text("put there since")
    code, out, err = run_cli(capsys, "convert", str(build("mimo")), "--out", str(ours), "--overwrite")
    assert code == 2 and "(added.txt)" in err and (ours / "added.txt").is_file()


def test_failure_midway_leaves_nothing(build, tmp_path: Path, capsys) -> None:
    path = tmp_path / "ck"
    shutil.copytree(build("deepseek_v3"), path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = path / index["weight_map"]["model.layers.2.mlp.experts.7.down_proj.weight"]
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) - 64]))  # header fine, last tensor cut short
    code, out, err = run_cli(capsys, "convert", str(path), "--out", str(tmp_path / "o"))
    _assert_clean_failure(code, out, err, shard.name, tmp_path / "o")


def test_debug_variable_shows_the_traceback(build, tmp_path: Path) -> None:
    env = {**os.environ, "MTP2DRAFT_DEBUG": "1"}
    cmd = [sys.executable, "-m", "mtp2draft.cli.app", "convert", str(build("kimi_k2")), "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" in proc.stderr  # uncaught and "NoMtpLayerError" in proc.stderr
    env.pop("MTP2DRAFT_DEBUG")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


# ---- the hub --------------------------------------------------------------------------------------------------------
@pytest.mark.hub
def test_convert_from_the_hub_fetches_only_mtp_bytes_and_caches_them(build, hub, tmp_path: Path) -> None:
    path = build("deepseek_v3_fp8")
    commit = hub.add_repo("deepseek-ai/tiny-v3", path)
    local = open_checkpoint(str(path))
    plan = plan_mtp_layer(local, find_spec(local.config), 0)
    needed = local.needed_keys(plan.checkpoint_keys)
    need_bytes = sum(local.info(k).nbytes for k in needed)
    mtp_shards = {local.weight_map[k] for k in needed}
    header_bytes = sum(8 + min(local.info(k).start for k in local.header(f)) - 8 for f in mtp_shards)

    result = convert("deepseek-ai/tiny-v3", tmp_path / "a")
    served = sum(hub.bytes_served_for(f) for f in set(local.weight_map.values()))
    assert result.bytes_fetched == served
    # tensor bytes + each needed shard's header; coalescing may bridge gaps of at most 4 KB per run
    assert need_bytes + header_bytes <= served <= need_bytes + header_bytes + 4096 * len(needed)
    for shard in set(local.weight_map.values()) - mtp_shards:
        assert hub.bytes_served_for(shard) == 0
    prov = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert prov["commit"] == commit and prov["source"] == "deepseek-ai/tiny-v3"
    # same tensors as a local conversion
    assert torch.equal(load_native(str(path)).eh_proj.weight, load_native("deepseek-ai/tiny-v3").eh_proj.weight)

    hub.reset_counters()
    convert("deepseek-ai/tiny-v3", tmp_path / "b")
    assert hub.bytes_served == 0  # second run: everything from the cache
    assert not [r for r in hub.requests if r["method"] == "GET" and r["path"].endswith(".safetensors")]


@pytest.mark.hub
def test_hub_revision_pins_the_commit(build, hub, tmp_path: Path) -> None:
    first = hub.add_repo("org/m", build("mimo"))
    hub.add_repo("org/m", {"README.md": b"new"})
    result = convert("org/m", tmp_path / "o", hub=HubAccess(revision=first))
    assert result.provenance["commit"] == first


@pytest.mark.hub
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nobody/nothing"], "hub repo nobody/nothing not found"),
        (["org/m", "--revision", "v9"], "revision 'v9' does not exist in hub repo org/m"),
    ],
)
def test_hub_repo_or_revision_that_does_not_exist(build, hub, tmp_path: Path, capsys, args, needle) -> None:
    hub.add_repo("org/m", build("mimo"))
    code, out, err = run_cli(capsys, "convert", *args, "--out", str(tmp_path / "o"))
    _assert_clean_failure(code, out, err, needle, tmp_path / "o")


@pytest.mark.hub
def test_inspect_from_the_hub_reads_no_tensor_bytes(build, hub, capsys) -> None:
    path = build("glm4_6")
    hub.add_repo("zai-org/tiny-glm", path)
    code, out, err = run_cli(capsys, "inspect", "zai-org/tiny-glm", "--json")
    info = json.loads(out)
    assert code == 0 and info["spec"] == "glm4_moe" and info["layers"][0]["stored_embed"] is None
    shards = set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values())
    served = sum(hub.bytes_served_for(f) for f in shards)
    assert info["bytes_read_by_inspect"] == served  # only headers were served
    assert served < info["convert_bytes"]


def test_specs_command_lists_the_registry(capsys) -> None:
    from mtp2draft.family.spec import registry

    code, out, _ = run_cli(capsys, "specs", "--json")
    assert code == 0 and [r["name"] for r in json.loads(out) if r["supported"] and "draft_kind" not in r] == list(
        registry()
    )


def _break(kind: str, path: Path) -> str:
    """Damage a copy of a checkpoint; returns a fragment the one-line error must contain."""
    n = json.loads((path / "config.json").read_text())["num_hidden_layers"]  # the MTP layer's index
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    mtp_shard = path / index["weight_map"][f"model.layers.{n}.eh_proj.weight"]
    if kind == "missing_shard":
        mtp_shard.unlink()
        return mtp_shard.name
    if kind == "corrupt_header":
        mtp_shard.write_bytes(b"\xff" * 8 + mtp_shard.read_bytes()[8:])
        return "corrupt safetensors header"
    if kind == "fp8_without_scale":
        del index["weight_map"][f"model.layers.{n}.self_attn.kv_b_proj.weight_scale_inv"]
        index_file.write_text(json.dumps(index))
        return f"has no model.layers.{n}.self_attn.kv_b_proj.weight_scale_inv"
    if kind == "shape_mismatch":
        cfg = json.loads((path / "config.json").read_text())
        cfg["moe_intermediate_size"] = 48
        (path / "config.json").write_text(json.dumps(cfg))
        return "but the config implies"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing_shard", "corrupt_header", "fp8_without_scale", "shape_mismatch"])
@pytest.mark.parametrize("to", ["mtp", "eagle3"])
def test_broken_checkpoints_fail_in_one_line_and_write_nothing(build, tmp_path: Path, capsys, kind, to) -> None:
    path = tmp_path / "ck"
    shutil.copytree(build("deepseek_v3_fp8", **eagle3_depth("deepseek_v3_fp8", to)), path)
    needle = _break(kind, path)
    code, out, err = run_cli(capsys, "convert", str(path), "--out", str(tmp_path / "o"), "--to", to)
    _assert_clean_failure(code, out, err, needle, tmp_path / "o")
