"""Precision as promised: a tensor the checkpoint stores in fp32 (DeepSeek-V4's `hc_*` stream mixers and attention
sinks) stays fp32 through convert, distill's write and the native exports unless the user names a dtype, and
provenance's `exact` is measured tensor by tensor, never assumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mtp2draft.conversion import convert
from mtp2draft.formats.export import export


def _stored(target: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(target.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
    return out


def _with_fine_fp32(src: Path, out: Path) -> Path:
    """A copy of checkpoint `src` whose fp32 tensors hold values bf16 cannot (the release's own are not bf16's)."""
    shutil.copytree(src, out)
    for shard in sorted(out.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for key, t in tensors.items():
            if t.dtype == torch.float32:
                tensors[key] = t * (1 + 1e-3 * torch.linspace(-1, 1, t.numel()).reshape(t.shape)) + 1e-5
        save_file(tensors, str(shard), {"format": "pt"})
    return out


def test_fp32_tensors_stay_fp32_and_exact_is_measured(build, tmp_path: Path) -> None:
    target = _with_fine_fp32(build("deepseek_v4_fp4"), tmp_path / "v4")
    stored = _stored(target)
    fp32 = {k for k, v in stored.items() if k.startswith("mtp.") and v.dtype == torch.float32}
    assert any(".hc_" in k for k in fp32) and any("attn_sink" in k for k in fp32)
    convert(str(target), tmp_path / "d")
    weights = load_file(str(tmp_path / "d" / "model.safetensors"))
    tensors = json.loads((tmp_path / "d" / "provenance.json").read_text())["tensors"]
    kept = {k for k, t in tensors.items() if set(t["from"]) <= fp32}
    assert kept and all(weights[k].dtype == torch.float32 and tensors[k]["exact"] for k in kept)
    # the stitched export puts every fp32 tensor back bit for bit
    export(tmp_path / "d", "stitched", tmp_path / "st", target=str(target))
    back = _stored(tmp_path / "st")
    assert all(torch.equal(back[k], stored[k]) for k in fp32 if k in back) and fp32 & back.keys()
    # and so does the nextn export, which without --target takes the dtypes from provenance
    export(tmp_path / "d", "nextn", tmp_path / "nx")
    nextn = [t for t in _stored(tmp_path / "nx").values() if t.dtype == torch.float32]
    assert all(any(t.shape == stored[k].shape and torch.equal(t, stored[k]) for t in nextn) for k in fp32)
    # a dtype the user names is honoured, and provenance says which tensors it rounded
    convert(str(target), tmp_path / "b", dtype="bfloat16")
    named = load_file(str(tmp_path / "b" / "model.safetensors"))
    rounded = json.loads((tmp_path / "b" / "provenance.json").read_text())["tensors"]
    assert all(named[k].dtype == torch.bfloat16 for k in kept if not k.endswith("e_score_correction_bias"))
    assert all(not rounded[k]["exact"] for k in kept if named[k].dtype == torch.bfloat16)


def test_validate_names_a_dtype_the_config_does_not_and_an_impossible_figure(build, tmp_path: Path) -> None:
    from mtp2draft.formats.export import validate

    convert(str(build("mimo")), tmp_path / "d")  # bf16
    assert validate(tmp_path / "d") == []
    weights = tmp_path / "d" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["eh_proj.weight"] = tensors["eh_proj.weight"].to(torch.float16)
    save_file(tensors, str(weights), {"format": "pt"})
    (problem,) = validate(tmp_path / "d")
    assert "stored as float16 under config torch_dtype bfloat16 (first: eh_proj.weight)" in problem
    tensors["eh_proj.weight"] = tensors["eh_proj.weight"].to(torch.bfloat16)
    save_file(tensors, str(weights), {"format": "pt"})
    for mean, fine in ((0.5, False), (1.0, True), (4.0, True), (9, False)):
        figures = {"acceptance_per_position": [0.5, 0.4, 0.3], "mean_acceptance_length": mean}
        (tmp_path / "d" / "evaluation.json").write_text(json.dumps({"results": [figures]}))
        problems = validate(tmp_path / "d")
        assert (problems == []) == fine and all("impossible at k = 3" in p for p in problems), (mean, problems)
