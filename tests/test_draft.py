"""The draft modules: the native MTP layer against independent implementations, the EAGLE-3 layer's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from support.fixtures import eagle3_depth

from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import load_native
from mtp2draft.draft.modules import Eagle3Draft, NativeMtpDraft, vocab_maps


def _checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("model-0*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(file)).items()})
    return out


@pytest.mark.parametrize(
    ("fixture", "cls"),
    [("deepseek_v3", "DeepseekV3ForCausalLM"), ("glm4_moe", "Glm4MoeForCausalLM"), ("glm4_6", "Glm4MoeForCausalLM")],
)
def test_native_layer_matches_transformers_mtp_model(build, monkeypatch, fixture: str, cls: str) -> None:
    """Oracle: transformers' own MtpModel on the same checkpoint, max |diff| <= 1e-4 in fp32."""
    from transformers.modeling_layers import MtpModel

    path = build(fixture)
    config = json.loads((path / "config.json").read_text())
    model_cls = getattr(transformers, cls)
    # transformers finds MTP keys through this attribute, hard-coded to the release's layer (61 / 92 / 46)
    monkeypatch.setattr(
        model_cls, "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{config['num_hidden_layers']}.*"]
    )
    target = model_cls.from_pretrained(str(path), dtype=torch.float32).eval()
    oracle = MtpModel.from_pretrained(target).float().eval()
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (2, 10), generator=gen)
    nxt = torch.randint(0, config["vocab_size"], (2, 10), generator=gen)
    pos = torch.arange(10).expand(2, -1)
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[-1]  # post final norm
        theirs = oracle._project_to_logits(oracle.forward_layer(0, hidden, pos, None, input_ids=nxt))
        mine, handover = ours(nxt, hidden, pos)
    assert (mine - theirs).abs().max().item() <= 1e-4
    # the hidden handed to the next step is the post-final-norm output, as MtpModel chains it
    with torch.no_grad():
        chained = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
    assert torch.allclose(handover, chained, atol=1e-5)


def _mimo_reference(w: dict[str, torch.Tensor], config: dict, nxt, hidden, pos, order: str) -> torch.Tensor:
    """MiMo's MTP layer as the reference table spells it, from checkpoint key names; `order` of the concat."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    def rms(x, weight, eps=config["rms_norm_eps"]):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    p = "model.mtp_layers.0."
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    e, h = rms(e, w[p + "token_layernorm.weight"]), rms(hidden, w[p + "hidden_layernorm.weight"])
    x = torch.cat([h, e] if order == "hidden_embed" else [e, h], -1) @ w[p + "input_proj.weight"].T
    cfg = Qwen2Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    block = Qwen2DecoderLayer(cfg, 0)
    block.load_state_dict(
        {k[len(p) :]: v for k, v in w.items() if k.startswith(p) and k[len(p) :] in block.state_dict()}
    )
    t = x.shape[1]
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
    y = block(x, attention_mask=causal, position_embeddings=Qwen2RotaryEmbedding(cfg)(x, pos), position_ids=pos)
    return rms(y, w[p + "final_layernorm.weight"]) @ w["lm_head.weight"].T


def test_mimo_layer_follows_the_reference_row(build) -> None:
    """MiMo concatenates [hidden, embed] (not [embed, hidden]) through model.mtp_layers.{i}.* and a Qwen2 block."""
    path = build("mimo")
    config = json.loads((path / "config.json").read_text())
    w = _checkpoint_tensors(path)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(1)
    nxt = torch.randint(0, 256, (1, 9), generator=gen)
    hidden = torch.randn(1, 9, 64, generator=gen) * 3
    pos = torch.arange(9)[None]
    with torch.no_grad():
        mine, _ = ours(nxt, hidden, pos)
        right = _mimo_reference(w, config, nxt, hidden, pos, "hidden_embed")
        wrong = _mimo_reference(w, config, nxt, hidden, pos, "embed_hidden")
    assert (mine - right).abs().max() < 1e-4
    assert (mine - wrong).abs().max() > 1e-2  # the order matters, and ours is the reference's


def test_native_draft_directory_loads_back_exactly(build, tmp_path: Path) -> None:
    path = build("deepseek_v3")
    convert(str(path), tmp_path / "d", dtype="float32")
    loaded, direct = load_draft(tmp_path / "d"), load_native(str(path), attach_target=False)
    assert isinstance(loaded, NativeMtpDraft)
    for (k, a), (k2, b) in zip(loaded.state_dict().items(), direct.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    # bf16 output: the same weights rounded once
    convert(str(path), tmp_path / "b")
    stored = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert stored["eh_proj.weight"].dtype == torch.bfloat16
    assert stored["block.mlp.gate.e_score_correction_bias"].dtype == torch.float32


@pytest.mark.parametrize("fixture", ["deepseek_v3", "glm4_moe", "mimo"])
def test_eagle3_draft_has_the_sglang_layout(build, tmp_path: Path, fixture: str) -> None:
    path = build(fixture, **eagle3_depth(fixture))
    convert(str(path), tmp_path / "e", to="eagle3")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    h, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    v, vd = cfg["vocab_size"], cfg["draft_vocab_size"]
    expect = {
        "fc.weight": (h, 3 * cfg["target_hidden_size"]),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (cfg["intermediate_size"], h),
        "midlayer.mlp.up_proj.weight": (cfg["intermediate_size"], h),
        "midlayer.mlp.down_proj.weight": (h, cfg["intermediate_size"]),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
    }
    # convert keeps the full vocabulary: no d2t/t2d (vLLM 0.32 refuses a full-vocabulary draft that carries them)
    assert vd == v
    assert {k: tuple(t.shape) for k, t in w.items()} == expect
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # vLLM reads 'input of layer' ids
    draft = load_draft(tmp_path / "e")
    assert isinstance(draft, Eagle3Draft) and not any("embed" in k for k in draft.state_dict())
    assert torch.equal(draft.to_target_ids(torch.arange(vd)), torch.arange(vd))  # identity maps put back
    prov = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]
    assert prov["norm.weight"]["exact"] and prov["lm_head.weight"]["exact"]
    assert not prov["midlayer.self_attn.q_proj.weight"]["exact"]


def test_mimo_mlp_transfers_exactly(build, tmp_path: Path) -> None:
    path = build("mimo", num_hidden_layers=4)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    src = _checkpoint_tensors(path)
    assert torch.equal(w["midlayer.mlp.down_proj.weight"], src["model.mtp_layers.0.mlp.down_proj.weight"])
    prov = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]
    assert prov["midlayer.mlp.down_proj.weight"]["exact"]
    assert "bias dropped" in prov["midlayer.self_attn.q_proj.weight"]["how"]


def test_vocab_maps_follow_the_reference_definition() -> None:
    used = torch.tensor([9, 2, 5, 7])
    d2t, t2d = vocab_maps(used, 12)
    assert d2t.tolist() == [2 - 0, 5 - 1, 7 - 2, 9 - 3]  # sorted ascending, d2t[i] = used[i] - i
    assert t2d.tolist() == [i in (2, 5, 7, 9) for i in range(12)]
    assert (torch.arange(4) + d2t).tolist() == [2, 5, 7, 9]
