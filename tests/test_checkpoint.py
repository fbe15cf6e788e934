"""Reading checkpoints: headers, selective reads, FP8 dequantisation, and every way a checkpoint can be broken."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtp2draft.checkpoint.fp8 import DEFAULT_FP8_BLOCK, dequantize_fp8, fp8_block_size, quantize_fp8
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.checkpoint.sources import fill_range
from mtp2draft.checkpoint.tensor_checks import FINITE_CHUNK
from mtp2draft.checkpoint.tensors import check_finite
from mtp2draft.conversion import convert
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import CheckpointError, NoMtpLayerError, SourceError


def _reference_dequant(w: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Plain element-by-block re-implementation of the reference formula."""
    out = torch.empty(w.shape, dtype=torch.float32)
    for i in range(0, w.shape[0], block):
        for j in range(0, w.shape[1], block):
            out[i : i + block, j : j + block] = w[i : i + block, j : j + block].float() * s[i // block, j // block]
    return out


@pytest.mark.parametrize("shape", [(128, 128), (300, 200), (7, 129), (257, 1)])
def test_fp8_dequantisation_is_bit_exact_with_ragged_edge_blocks(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(shape, generator=gen) * 3).to(torch.float8_e4m3fn)
    s = torch.rand((math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)), generator=gen) + 0.01
    got = dequantize_fp8(w, s)
    assert torch.equal(got.view(torch.int32), _reference_dequant(w, s).view(torch.int32))


def test_fp8_requantisation_round_trip_is_close() -> None:
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(1))
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 2)
    back = dequantize_fp8(q, s)
    assert (back - w).abs().max() <= w.abs().max() * 0.07  # e4m3 keeps 3 mantissa bits


def test_fp8_scale_of_wrong_shape_is_rejected() -> None:
    w = torch.zeros(300, 200, dtype=torch.float8_e4m3fn)
    with pytest.raises(CheckpointError, match=r"expected \[3, 2\]"):
        dequantize_fp8(w, torch.ones(2, 2))


def test_headers_agree_with_safetensors(build) -> None:
    path = build("deepseek_v3")
    ckpt = open_checkpoint(str(path))
    some = sorted(ckpt.weight_map)[::7]
    ours = ckpt.read_raw(some)
    for key in some:
        theirs = load_file(str(path / ckpt.weight_map[key]))[key]
        assert torch.equal(ours[key], theirs), key


def test_fp8_checkpoint_loads_as_dequantised_weights(build) -> None:
    fp8, plain = build("deepseek_v3_fp8"), build("deepseek_v3")
    a, b = load_native(str(fp8)), load_native(str(plain))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(x, y, atol=0.08 * float(y.abs().max()) + 1e-6), name
    ckpt = open_checkpoint(str(fp8))
    assert any(k.endswith("_scale_inv") for k in ckpt.weight_map)


def test_unneeded_shards_are_never_opened(build, tmp_path: Path) -> None:
    # layer-0 tensors live in a shard of garbage bytes: opening it would fail to parse
    path = build("deepseek_v3", decoy="model.layers.0.")
    ckpt = open_checkpoint(str(path))
    assert "model-decoy.safetensors" in set(ckpt.weight_map.values())
    load_native(ckpt)
    assert "model-decoy.safetensors" not in ckpt.files.opened
    convert(str(path), tmp_path / "out")  # the whole stage too
    assert (tmp_path / "out" / "model.safetensors").is_file()


def _copy(path: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(path, dst)
    return dst


def _mtp_shard(path: Path, key: str = "model.layers.2.eh_proj.weight") -> Path:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return path / index["weight_map"][key]


def test_index_naming_a_missing_shard(build, tmp_path: Path) -> None:
    path = _copy(build("deepseek_v3"), tmp_path)
    _mtp_shard(path).unlink()
    with pytest.raises(CheckpointError, match="does not exist|missing"):
        load_native(str(path))


@pytest.mark.parametrize("damage", ["truncated", "garbage_json", "huge_length"])
def test_corrupt_header_in_a_needed_shard(build, tmp_path: Path, damage: str) -> None:
    path = _copy(build("deepseek_v3"), tmp_path)
    shard = _mtp_shard(path)
    raw = shard.read_bytes()
    if damage == "truncated":
        shard.write_bytes(raw[:5])
    elif damage == "garbage_json":
        n = struct.unpack("<Q", raw[:8])[0]
        shard.write_bytes(raw[:8] + b"{" * n + raw[8 + n :])
    else:
        shard.write_bytes(struct.pack("<Q", 10**12) + raw[8:])
    with pytest.raises(CheckpointError, match=shard.name):
        load_native(str(path))


def test_fp8_weight_without_its_scale(build, tmp_path: Path) -> None:
    path = _copy(build("deepseek_v3_fp8"), tmp_path)
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    del index["weight_map"]["model.layers.2.self_attn.q_a_proj.weight_scale_inv"]
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="has no model.layers.2.self_attn.q_a_proj.weight_scale_inv"):
        load_native(str(path))


def test_tensor_shape_disagreeing_with_config(build, tmp_path: Path) -> None:
    path = _copy(build("deepseek_v3"), tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["hidden_size"] = 96
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="has shape .* but the config implies"):
        load_native(str(path))


def test_missing_local_directory_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        open_checkpoint(str(tmp_path / "nowhere"))


def test_check_finite_finds_a_nan_past_the_first_chunk() -> None:
    """The check runs in chunks (to bound its temporaries); a bad value in any chunk is still found and counted."""
    w = torch.zeros(FINITE_CHUNK * 2 + 4)
    w[-1] = float("nan")
    with pytest.raises(CheckpointError, match=r"holds non-finite values \(1 NaN, 0 Inf"):
        check_finite("w", w.view(-1, 4))
    assert check_finite("ok", torch.zeros(FINITE_CHUNK + 1)).numel() == FINITE_CHUNK + 1


@pytest.mark.parametrize("skip", [0, 3, 1000])
def test_range_bytes_fill_one_buffer_from_any_chunking(skip: int) -> None:
    """A streamed range lands in one buffer; a server that ignores the range (200) has its prefix dropped."""
    body = bytes(range(256)) * 8
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    data, got = fill_range(chunks, 500, skip=skip)
    assert got == 500 and bytes(data) == body[skip : skip + 500]
    data, got = fill_range(chunks, 5000, skip=skip)  # asked for more than arrives: the count says so
    assert got == len(body) - skip


def test_fp8_block_size_defaults_to_128_and_follows_the_config() -> None:
    assert fp8_block_size({}) == (128, 128) == DEFAULT_FP8_BLOCK
    assert fp8_block_size({"quantization_config": {"weight_block_size": [64, 32]}}) == (64, 32)


# ---- MTP tensors outside the index (model_mtp.safetensors) --------------------------------------------------------
MTP_FILE = "model_mtp.safetensors"


def _mtp_outside_the_index(src: Path, dst: Path) -> list[str]:
    """A copy of the nemotron_h fixture (MTP layer under mtp.*) as MiMo-V2.5 / Nemotron-3.5 Lightning ship it: the
    MTP tensors moved into model_mtp.safetensors, which the index does not name. Returns the moved keys."""
    from mtp2draft.outputs.writer import save_tensors

    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    moved = sorted(k for k in index["weight_map"] if k.startswith("mtp."))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        every = load_file(str(src / shard))  # the source's copy: dst's is rewritten below
        tensors.update({k: every.pop(k) for k in moved if k in every})
        save_tensors(dst / shard, every, {"format": "pt"})
    save_tensors(dst / MTP_FILE, tensors, {"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in moved}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return moved


def _same_draft(a: Path, b: Path) -> None:
    mine, theirs = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_mtp_file_outside_the_index_is_found_by_listing_the_directory(build, tmp_path: Path) -> None:
    from mtp2draft.conversion import inspect_checkpoint

    moved = _mtp_outside_the_index(build("nemotron_h"), tmp_path / "ck")
    (tmp_path / "ck" / "notes.safetensors").write_bytes(b"not a safetensors file")  # not *mtp*: never opened
    info = inspect_checkpoint(str(tmp_path / "ck"))
    assert info["unindexed_files"] == {MTP_FILE: len(moved)} and info["num_mtp_layers"] == 1
    assert open_checkpoint(str(tmp_path / "ck")).files.opened == {MTP_FILE}  # its header; notes.safetensors never
    assert {t["name"] for t in info["layers"][0]["tensors"]} == set(moved)
    convert(str(tmp_path / "ck"), tmp_path / "out", to="mtp")
    convert(str(build("nemotron_h")), tmp_path / "ref", to="mtp")
    _same_draft(tmp_path / "out", tmp_path / "ref")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert prov["unindexed_files"] == {MTP_FILE: len(moved)}
    (tmp_path / "ck" / MTP_FILE).unlink()  # without it the layer is missing, as before
    with pytest.raises(NoMtpLayerError, match="mtp.layers.0"):
        convert(str(tmp_path / "ck"), tmp_path / "none", to="mtp")


def test_inspect_says_where_it_found_the_mtp_layer(build, tmp_path: Path, capsys) -> None:
    from mtp2draft.cli.app import main

    moved = _mtp_outside_the_index(build("nemotron_h"), tmp_path / "ck")
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert f"{len(moved)} tensors found in {MTP_FILE}, which the index does not list" in out


def test_mtp_file_outside_the_index_from_the_hub(build, tmp_path: Path, hub) -> None:
    """The real huggingface_hub client against the loopback Hub: the file is found in the repo's file list (the one
    call that resolves the commit), its header and tensors read by range; the other shards give headers only."""
    from mtp2draft.conversion import inspect_checkpoint

    moved = _mtp_outside_the_index(build("nemotron_h"), tmp_path / "ck")
    hub.add_repo("nvidia/tiny-nano", tmp_path / "ck")
    hub.reset_counters()
    info = inspect_checkpoint("nvidia/tiny-nano")
    assert info["unindexed_files"] == {MTP_FILE: len(moved)}
    assert {t["name"] for t in info["layers"][0]["tensors"]} == set(moved)
    assert hub.bytes_served_for(MTP_FILE) < (tmp_path / "ck" / MTP_FILE).stat().st_size  # its header only
    whole = [r for r in hub.requests if r["method"] == "GET" and r["path"].endswith(".safetensors") and not r["range"]]
    assert whole == []  # every safetensors byte came by range
    result = convert("nvidia/tiny-nano", tmp_path / "out", to="mtp")
    convert(str(build("nemotron_h")), tmp_path / "ref", to="mtp")
    _same_draft(tmp_path / "out", tmp_path / "ref")
    assert result.bytes_fetched < result.checkpoint_bytes / 2


def test_a_tensor_both_in_the_index_and_outside_it_is_refused(build, tmp_path: Path) -> None:
    from mtp2draft.outputs.writer import save_tensors

    ck = tmp_path / "ck"
    shutil.copytree(build("nemotron_h"), ck)
    save_tensors(ck / MTP_FILE, {"mtp.layers.0.eh_proj.weight": torch.zeros(2, 2)}, {"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model_mtp.safetensors, which .* does not list, holds mtp.layers.0"):
        open_checkpoint(str(ck))
