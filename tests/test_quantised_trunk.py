"""A quantised release as the target of `distill` / `evaluate` (`target/dequantised.py`): its trunk runs on CPU with
its own quantised weights dequantised, and its outputs equal those of the same model whose weights were
dequantised by the quantisation library's own code (compressed-tensors' `PackedQuantizationCompressor`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.fixtures import write_checkpoint
from support.re_releases import QUANTISED, release_variant

from mtp2draft.pipeline import BUNDLED_TARGET

MTP = "model.layers.8."
W4A16 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}


def _library_dequantised(release: Path) -> dict[str, torch.Tensor]:
    """The release's tensors with every packed weight decompressed by compressed-tensors itself."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**W4A16))
    stored: dict[str, torch.Tensor] = {}
    for shard in sorted(release.glob("model-0*.safetensors")):
        stored.update(load_file(shard))
    out = {k: v for k, v in stored.items() if not re.search(r"\.weight_(packed|scale|shape)$", k)}
    for key in [k for k in stored if k.endswith(".weight_packed")]:
        stem = key.removesuffix("weight_packed")
        parts = {p: stored[stem + "weight_" + p] for p in ("packed", "scale", "shape")}
        packed = {f"weight_{p}": t for p, t in parts.items()}
        out[stem + "weight"] = PackedQuantizationCompressor.decompress(packed, scheme)["weight"]
    return out


@pytest.fixture(scope="module")
def int4_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return release_variant(BUNDLED_TARGET, tmp_path_factory.mktemp("w4a16") / "release", MTP, scheme="int4")


def test_the_trunk_of_a_w4a16_release_equals_the_librarys_dequantisation(int4_release: Path, tmp_path: Path) -> None:
    from mtp2draft.target.hidden import TargetModel

    config = json.loads((BUNDLED_TARGET / "config.json").read_text())
    reference = write_checkpoint(tmp_path / "reference", config, _library_dequantised(int4_release))
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(3))
    ours = TargetModel(str(int4_release)).features(ids)
    theirs = TargetModel(str(reference)).features(ids)
    assert torch.equal(ours.logits, theirs.logits) and torch.equal(ours.final, theirs.final)
    # and the weights were quantised: the release's trunk is not the base's
    base = TargetModel(str(BUNDLED_TARGET)).features(ids)
    assert not torch.allclose(ours.logits, base.logits, atol=1e-3)
    assert any(QUANTISED.search(k) for k in _library_dequantised(int4_release))


def test_the_release_is_never_written_and_the_view_goes_away(int4_release: Path) -> None:
    from mtp2draft.target.hidden import TargetModel

    before = {p.name: p.stat().st_mtime_ns for p in int4_release.iterdir()}
    target = TargetModel(str(int4_release))
    view = Path(target._view.name)
    assert view.is_dir() and "quantization_config" not in json.loads((view / "config.json").read_text())
    target._view.cleanup()
    assert not view.exists()
    assert {p.name: p.stat().st_mtime_ns for p in int4_release.iterdir()} == before
