"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: conversion, key selection, and the MTP layer against the computation the
reference table spells out (one assertion per detail that differs from the DeepSeek-style layer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from support.fixtures import write_checkpoint
from support.references import config_of, tensors, weight_map

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.conversion import convert, inspect_checkpoint, plan_mtp_layer, resolve_layer
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import NoMtpLayerError
from mtp2draft.family.spec import find_spec, get_spec

# fixture -> (spec, transformers model_type of the (text) config, modeling module, decoder-layer class)
FAMILIES = {
    "qwen3_next": ("qwen3_next", "qwen3_next", "qwen3_next.modeling_qwen3_next", "Qwen3NextDecoderLayer"),
    "qwen3_5": ("qwen3_5_text", "qwen3_5_text", "qwen3_5.modeling_qwen3_5", "Qwen3_5DecoderLayer"),
    "qwen3_5_tied": ("qwen3_5_text", "qwen3_5_text", "qwen3_5.modeling_qwen3_5", "Qwen3_5DecoderLayer"),
    "qwen3_5_moe": (
        "qwen3_5_moe_text",
        "qwen3_5_moe_text",
        "qwen3_5_moe.modeling_qwen3_5_moe",
        "Qwen3_5MoeDecoderLayer",
    ),
}


# ---- conversion and key selection -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_convert_selects_exactly_the_mtp_keys(build, tmp_path: Path, fixture: str) -> None:
    path = build(fixture)
    ckpt = open_checkpoint(str(path))
    spec = find_spec(ckpt.config)
    assert spec.name == FAMILIES[fixture][0]
    mtp_keys = {k for k in weight_map(path) if k.startswith("mtp.")}
    assert set(plan_mtp_layer(ckpt, spec, 0).checkpoint_keys) == mtp_keys  # all of mtp.*, nothing of the trunk
    info = inspect_checkpoint(str(path))
    assert info["spec"] == spec.name and info["num_mtp_layers"] == 1
    assert {t["name"] for t in info["layers"][0]["tensors"]} == mtp_keys

    for kind in ("mtp", "eagle3"):
        result = convert(str(path), tmp_path / kind, to=kind, dtype="float32")
        assert result.spec == spec.name and result.num_mtp_layers == 1
    direct = load_native(str(path), attach_target=False)
    loaded = load_draft(tmp_path / "mtp")
    for (k, a), (k2, b) in zip(loaded.state_dict().items(), direct.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    # the MTP block is a full-attention layer although the trunk's layer 0 is linear attention
    assert direct.block.block_type == "full_attention" and hasattr(direct.block, "self_attn")
    assert hasattr(direct.block.mlp, "experts") == (fixture != "qwen3_5")

    eagle = load_draft(tmp_path / "eagle3")
    prov = json.loads((tmp_path / "eagle3" / "provenance.json").read_text())["tensors"]
    how = prov["midlayer.self_attn.q_proj.weight"]["how"]
    assert "gate rows dropped" in how and "q_norm linearised" in how
    assert "partial RoPE (8/32 dims)" in how  # partial_rotary_factor 0.25, read from rope_parameters
    assert prov["norm.weight"]["exact"] and "1 + w folded" in prov["norm.weight"]["how"]
    final_norm = tensors(path)["mtp.norm.weight"]
    assert torch.allclose(eagle.norm.weight, 1 + final_norm)


def test_count_fields(build) -> None:
    """Qwen3-Next releases have no count field (engines assume 1; vLLM reads num_nextn_predict_layers, SGLang sets
    it); Qwen3.5 keeps it inside text_config as mtp_num_hidden_layers."""
    next_cfg = config_of(build("qwen3_next"))
    assert "num_nextn_predict_layers" not in next_cfg and "mtp_num_hidden_layers" not in next_cfg
    spec = get_spec("qwen3_next")
    assert spec.num_mtp_layers(next_cfg) == 1
    assert spec.num_mtp_layers({**next_cfg, "num_nextn_predict_layers": 0}) == 0

    cfg = config_of(build("qwen3_5"))
    spec = get_spec("qwen3_5_text")
    assert "mtp_num_hidden_layers" not in cfg and cfg["text_config"]["mtp_num_hidden_layers"] == 1
    none = {**cfg, "mtp_num_hidden_layers": 1, "text_config": {**cfg["text_config"], "mtp_num_hidden_layers": 0}}
    assert spec.num_mtp_layers(none) == 0  # the nested field counts, not a top-level one


def test_checkpoint_declaring_no_mtp_layer(build, tmp_path: Path) -> None:
    path = tmp_path / "ck"
    shutil.copytree(build("qwen3_next"), path)
    cfg = config_of(path)
    cfg["num_nextn_predict_layers"] = 0
    (path / "config.json").write_text(json.dumps(cfg))
    ckpt = open_checkpoint(str(path))
    with pytest.raises(NoMtpLayerError, match="num_nextn_predict_layers is 0"):
        resolve_layer(ckpt, find_spec(ckpt.config), None)


def test_both_qwen3_5_specs_match_their_own_checkpoints(build) -> None:
    dense, moe = config_of(build("qwen3_5")), config_of(build("qwen3_5_moe"))
    assert find_spec(dense).name == "qwen3_5_text" and find_spec(moe).name == "qwen3_5_moe_text"
    # by model_type when architectures is missing: the top-level one, not the nested qwen3_5(_moe)_text
    assert find_spec({"model_type": dense["model_type"]}).name == "qwen3_5_text"
    assert find_spec({"model_type": moe["model_type"]}).name == "qwen3_5_moe_text"
    assert dense["text_config"]["model_type"] == "qwen3_5_text"


# ---- the layer against the reference row ------------------------------------------------------------------------------
def _reference(
    w: dict[str, torch.Tensor],
    config: dict,
    fixture: str,
    nxt: torch.Tensor,
    hidden: torch.Tensor,
    pos: torch.Tensor,
    norm: str = "zero_centered",
    order: str = "embed_hidden",
) -> torch.Tensor:
    """Qwen3-Next / Qwen3.5 MTP as the reference table spells it, from the checkpoint's key names: zero-centred
    RMSNorms, fc over [embed, hidden], a full-attention decoder block (transformers' class, eager, causal mask,
    hand-made partial RoPE), mtp.norm, then the target's lm_head (the embedding when tied)."""
    import importlib

    from transformers import AutoConfig

    _, model_type, module, cls = FAMILIES[fixture]
    text = config.get("text_config", config)
    eps = text["rms_norm_eps"]

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        scale = 1 + weight if norm == "zero_centered" else weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

    embed = w.get("model.embed_tokens.weight", w.get("model.language_model.embed_tokens.weight"))
    head = w.get("lm_head.weight", embed)
    e = rms(F.embedding(nxt, embed), w["mtp.pre_fc_norm_embedding.weight"])
    h = rms(hidden, w["mtp.pre_fc_norm_hidden.weight"])
    x = torch.cat([e, h] if order == "embed_hidden" else [h, e], -1) @ w["mtp.fc.weight"].T

    cfg = AutoConfig.for_model(
        model_type, **{k: v for k, v in text.items() if k not in ("model_type", "architectures")}
    )
    cfg.layer_types = ["full_attention"]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    block = getattr(importlib.import_module(f"transformers.models.{module}"), cls)(cfg, 0)
    p = "mtp.layers.0."
    state = {k[len(p) :]: v for k, v in w.items() if k.startswith(p)}
    if "mlp.experts.0.gate_proj.weight" in state:  # per-expert hub keys (Qwen3-Next): fuse by hand, gate rows first
        n = text["num_experts"]
        gate_up = [torch.cat([state.pop(f"mlp.experts.{i}.{g}_proj.weight") for g in ("gate", "up")]) for i in range(n)]
        state["mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        state["mlp.experts.down_proj"] = torch.stack([state.pop(f"mlp.experts.{i}.down_proj.weight") for i in range(n)])
    block.load_state_dict(state)  # strict: every mtp.layers.0.* tensor is used, none is missing

    rope = text.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", text.get("rope_theta", 0)))
    rd = int(text["head_dim"] * text["partial_rotary_factor"])
    freqs = pos[..., None].float() / theta ** (torch.arange(0, rd, 2).float() / rd)
    emb = torch.cat([freqs, freqs], -1)  # text-only positions: the interleaved M-RoPE is this plain partial RoPE
    t = x.shape[1]
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
    y = block(x, position_embeddings=(emb.cos(), emb.sin()), attention_mask=causal, position_ids=pos)
    return rms(y, w["mtp.norm.weight"]) @ head.T


def _inputs(config: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    text = config.get("text_config", config)
    gen = torch.Generator().manual_seed(3)
    nxt = torch.randint(0, text["vocab_size"], (2, 9), generator=gen)
    hidden = torch.randn(2, 9, text["hidden_size"], generator=gen) * 3
    return nxt, hidden, torch.arange(9).expand(2, -1)


@pytest.mark.parametrize("fixture", ["qwen3_next", "qwen3_5", "qwen3_5_tied", "qwen3_5_moe"])
def test_layer_follows_the_reference_row(build, monkeypatch, fixture: str) -> None:
    path = build(fixture)
    config, w = config_of(path), tensors(path)
    ours = load_native(str(path)).eval()
    nxt, hidden, pos = _inputs(config)
    with torch.no_grad():
        mine, _ = ours(nxt, hidden, pos)
        right = _reference(w, config, fixture, nxt, hidden, pos)
        standard_norms = _reference(w, config, fixture, nxt, hidden, pos, norm="standard")
        swapped = _reference(w, config, fixture, nxt, hidden, pos, order="hidden_embed")
        with monkeypatch.context() as m:  # the attention output gate disabled: sigmoid(gate) -> 1
            m.setattr(torch, "sigmoid", torch.ones_like)
            ungated = _reference(w, config, fixture, nxt, hidden, pos)
    assert (mine - right).abs().max() <= 1e-4
    # (a) the MTP norms are zero-centred, x * (1 + w): with x * w the layer computes something else
    assert (mine - standard_norms).abs().max() > 1e-2
    # (b) the attention output is gated by sigmoid(gate) from q_proj's gate rows
    assert (mine - ungated).abs().max() > 1e-2
    # (c) the projection reads [embed, hidden]
    assert (mine - swapped).abs().max() > 1e-2


def test_tied_head_is_the_embedding(build, tmp_path: Path) -> None:
    """(d) Small Qwen3.5 releases tie lm_head to model.language_model.embed_tokens and store no lm_head.weight."""
    path = build("qwen3_5_tied")
    cfg = config_of(path)
    assert "lm_head.weight" not in weight_map(path) and cfg["text_config"]["tie_word_embeddings"]
    embed = tensors(path)["model.language_model.embed_tokens.weight"]
    assert torch.equal(load_native(str(path)).head_weight, embed)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    assert torch.equal(load_file(str(tmp_path / "e" / "model.safetensors"))["lm_head.weight"], embed)


def test_fused_experts_load_like_per_expert_keys(build, tmp_path: Path) -> None:
    """(e) Qwen3.5-MoE stores experts fused: gate_up_proj [E, 2I, H] with gate rows first, down_proj [E, H, I]. They
    load to the same module as per-expert keys (some re-releases) would, and the module computes expert e exactly
    as vLLM / SGLang read the hub tensor (chunk(2, dim=-2) -> gate, up; no transpose)."""
    path = build("qwen3_5_moe")
    config = config_of(path)
    text = config["text_config"]
    tensors = {k: v for file in sorted(path.glob("model-0*.safetensors")) for k, v in load_file(str(file)).items()}
    p = "mtp.layers.0.mlp.experts."
    gate_up, down = tensors[p + "gate_up_proj"], tensors[p + "down_proj"]
    n, i, h = text["num_experts"], text["moe_intermediate_size"], text["hidden_size"]
    assert tuple(gate_up.shape) == (n, 2 * i, h) and tuple(down.shape) == (n, h, i) and 2 * i != h
    assert not [k for k in tensors if k.startswith(p) and k.split(".")[4].isdigit()]  # no per-expert MTP keys

    per_expert = {k: v for k, v in tensors.items() if not k.startswith(p)}
    for e in range(n):
        per_expert[f"{p}{e}.gate_proj.weight"] = gate_up[e, :i].clone()
        per_expert[f"{p}{e}.up_proj.weight"] = gate_up[e, i:].clone()
        per_expert[f"{p}{e}.down_proj.weight"] = down[e].clone()
    split = write_checkpoint(tmp_path / "split", config, per_expert)
    fused_module, split_module = load_native(str(path)), load_native(str(split))
    for (k, a), (k2, b) in zip(fused_module.state_dict().items(), split_module.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    for src, out in ((path, "f"), (split, "s")):  # EAGLE-3's dense MLP reads experts either way
        convert(str(src), tmp_path / out, to="eagle3", dtype="float32")
    f, s = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("f", "s"))
    assert all(torch.equal(f[k], s[k]) for k in f if ".mlp." in k)

    experts = fused_module.block.mlp.experts
    x = torch.randn(5, h, generator=torch.Generator().manual_seed(0))
    e = 3
    g, u = gate_up[e].float().chunk(2, dim=-2)
    want = (F.silu(x @ g.T) * (x @ u.T)) @ down[e].float().T
    with torch.no_grad():
        got = experts(x, torch.full((5, 1), e), torch.ones(5, 1))
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("fixture", ["qwen3_5", "qwen3_5_moe"])
def test_nextn_export_cuts_the_per_layer_lists(build, tmp_path: Path, fixture: str) -> None:
    """A one-layer NextN config keeps one `layer_types` entry (the MTP block's full attention): left at the trunk's N
    entries, transformers refuses the config (`num_hidden_layers` (1) must equal len(layer_types)) and every Qwen3.5
    nextn export failed its own validation."""
    from mtp2draft.formats.export import export, validate

    path = build(fixture)
    assert len(config_of(path)["text_config"]["layer_types"]) > 1  # the trunk is hybrid: linear + full attention
    convert(str(path), tmp_path / "mtp", to="mtp", dtype="float32")
    export(tmp_path / "mtp", "nextn", tmp_path / "nx")
    text = config_of(tmp_path / "nx")["text_config"]
    assert text["num_hidden_layers"] == 1 and text["mtp_num_hidden_layers"] == 1
    assert text["layer_types"] == ["full_attention"]
    assert validate(tmp_path / "nx") == []
    cfg = config_of(tmp_path / "nx")
    cfg["text_config"]["layer_types"] = config_of(path)["text_config"]["layer_types"]  # the bug, re-introduced
    (tmp_path / "nx" / "config.json").write_text(json.dumps(cfg))
    assert any("layer_types has" in p for p in validate(tmp_path / "nx"))
