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
from mtp2draft.checkpoint.reader import check_finite, open_checkpoint
from mtp2draft.checkpoint.sources import fill_range
from mtp2draft.checkpoint.tensor_checks import FINITE_CHUNK
from mtp2draft.conversion import convert
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import CheckpointError, SourceError


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
