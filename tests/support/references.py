"""The computations the family tests hold each MTP layer to, one named function per family, as the family table
(tests/family_table.py) names them; and the key mappings of engines' loaders that the table checks key lists with.

Each reference is written from an engine's source or is transformers' own model, reading the fixture checkpoint's
tensors by their hub names, so the spec's renames are not what a reference relies on. Every reference has the
signature `reference(path, nxt, hidden, pos, **variant) -> (logits, hidden handed on)` on inputs nxt [B, T], hidden
[B, T, H], pos [B, T]; a `variant` gets one detail wrong on purpose (a trunk block's weights, no window, no RoPE), so
the table can show each check can fail.

What this module does not do: build fixtures (`fixtures.py`) or assert anything about our own module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

GLUE = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight"}  # the MTP glue around a block


# ---- a fixture checkpoint, read back ---------------------------------------------------------------------------
def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (bf16) fixture checkpoint by its hub name, in fp32."""
    out = {}
    for file in sorted(path.glob("model-0*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(file)).items()})
    return out


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal(t: int) -> torch.Tensor:
    return torch.full((t, t), float("-inf")).triu(1)[None, None]  # [1, 1, T, T] additive


def _windowed(t: int, window: int | None) -> torch.Tensor:
    """Additive causal mask [1, 1, t, t]; with a window, key k is visible from query q iff q - window < k <= q."""
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (k <= q) & (k > q - window) if window else k <= q
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def _glue(w: dict, embed: str, hidden: torch.Tensor, nxt: torch.Tensor, norms: tuple[str, str], proj: str, eps: float):
    """RMSNorm(embed) | RMSNorm(hidden) -> the projection: the input every MTP layer here starts from."""
    e = torch.nn.functional.embedding(nxt, w[embed])
    return torch.cat([rms(e, w[norms[0]], eps), rms(hidden, w[norms[1]], eps)], -1) @ w[proj].T


# ---- engines' loaders: a checkpoint key as the engine maps it onto its module ----------------------------------------
# vLLM's hf_to_vllm_mapper (exaone_moe_mtp.py): q/k/v stacked into qkv_proj, the dense MLP's gate/up into gate_up_proj
_EXAONE_STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj",
                   ".mlp.gate_proj": ".mlp.gate_up_proj", ".mlp.up_proj": ".mlp.gate_up_proj"}  # fmt: skip


def exaone_vllm_loads(key: str) -> str:
    """A checkpoint key as vLLM 0.33's Exaone4_5_MTP / ExaoneMoeMTP.load_weights maps it (mtp. -> model., stacking)."""
    key = "model." + key[len("mtp.") :]
    for old, new in _EXAONE_STACKED.items():
        if old in key:
            return key.replace(old, new)
    return key


def bailing_vllm_loads(key: str) -> str:
    """A non-expert MTP key as vLLM's BailingMoeV3MTPModel.load_weights maps it (attention. -> self_attn., the
    shared expert's gate / up stacked into gate_up_proj)."""
    key = key.replace(".attention.", ".self_attn.")
    for w in ("gate_proj", "up_proj"):
        key = key.replace(f"shared_experts.{w}", "shared_experts.gate_up_proj")
    return key


# ---- transformers' own MtpModel where it covers the block ---------------------------------------------------------
def glm4_moe_lite_mtp_model(path: Path, nxt, hidden, pos):
    """transformers 5.24 has no MTP model for glm4_moe_lite (its config has no num_mtp_layers), but
    Glm4MoeLiteDecoderLayer is DeepSeek-V3's decoder layer (same MLA with rope_interleave, same sigmoid router with
    e_score_correction_bias, same shared expert) under the same config field names, so DeepSeek-V3's MtpModel loaded
    on the GLM-4.7-Flash checkpoint computes the layer (the premise: `glm4_moe_lite_trunk_is_deepseek_v3s`)."""
    from transformers.modeling_layers import MtpModel

    config = config_of(path)
    glm_cfg = transformers.AutoConfig.for_model(
        "glm4_moe_lite", **{k: v for k, v in config.items() if k != "model_type"}
    )
    with pytest.raises(ValueError, match="num_mtp_layers"):  # if this fails, transformers covers the family itself
        glm_cfg.get_mtp_config()
    v3 = deepseek_v3_on(path)
    oracle = MtpModel.from_pretrained(v3).float().eval()
    chained = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
    return oracle._project_to_logits(chained), chained  # post-final-norm hand-over, as MtpModel chains


def deepseek_v3_on(path: Path):
    """DeepSeek-V3's causal LM loaded on a checkpoint of its layout (the MTP layer's keys ignored), fp32."""
    config = config_of(path)
    v3_cfg = transformers.DeepseekV3Config(**{k: v for k, v in config.items() if k != "model_type"})
    cls = transformers.DeepseekV3ForCausalLM
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cls, "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{config['num_hidden_layers']}.*"])
        return cls.from_pretrained(str(path), config=v3_cfg, dtype=torch.float32).eval()


def bailing_hybrid_mtp_model(path: Path, nxt, hidden, pos):
    """Ling 3's MTP layer as transformers' own MtpModel computes it (`bailing_hybrid_oracle`)."""
    oracle = bailing_hybrid_oracle(path)
    chained = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
    return oracle._project_to_logits(chained), chained


def bailing_hybrid_oracle(path: Path):
    """transformers' own MtpModel (modeling_layers.py), loaded by transformers' own loader from the fixture's
    checkpoint (its conversion_mapping "bailing_hybrid" renames the hub names; MtpModel adds the mtp_block prefix and
    builds the block as the trunk's last-layer class). Two gaps of transformers 5.24 are bridged here, not in the
    oracle's computation: its get_mtp_config needs mtp_layer_types and mtp_mlp_layer_types, which the release's
    config lacks (set to what both engines build: MLA + MoE), and its MtpModel mapping names the final norm only as
    DeepSeek's shared_head.norm (Ling's final_layernorm is renamed onto post_norm)."""
    from transformers.core_model_loading import WeightRenaming
    from transformers.modeling_layers import MtpModel

    config = config_of(path)
    n = config["num_hidden_layers"]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.BailingHybridConfig(**fields, mtp_layer_types=["full_attention"], mtp_mlp_layer_types=["sparse"])
    cfg._attn_implementation = "eager"
    conversions = MtpModel.get_weight_conversions

    def with_final_layernorm(self, main_model):
        rename = WeightRenaming(source_patterns=".mtp_block.final_layernorm.", target_patterns=".post_norm.")
        first, *rest = conversions(self, main_model)  # first: layers.{N}. -> layers.0.mtp_block.
        return [first, rename, *rest]

    with pytest.MonkeyPatch.context() as m:
        # transformers finds MTP keys through this attribute (BailingHybridModel sets it on the inner model only)
        m.setattr(transformers.BailingHybridForCausalLM, "_keys_to_ignore_on_load_unexpected", [rf"layers\.{n}\."])
        target = transformers.BailingHybridForCausalLM.from_pretrained(str(path), config=cfg, dtype=torch.float32)
        m.setattr(MtpModel, "get_weight_conversions", with_final_layernorm)
        return MtpModel.from_pretrained(target.eval()).float().eval()


# ---- vLLM 0.33's computation, the block from transformers' own classes ---------------------------------------------
def hy_v3_vllm(path: Path, nxt, hidden, pos, *, block_layer: int = 2):
    """vLLM's Hy3 MTP (hy_v3_mtp.py, HYV3MultiTokenPredictorLayer): RMSNorm(embed) | RMSNorm(hidden) -> eh_proj ->
    the decoder block -> final_layernorm -> the target's lm_head, the normed hidden handed on. The block: transformers'
    HYV3ForCausalLM one layer deeper reads model.layers.2.* (the MTP layer's block) by its hub names through
    conversion_mapping "hy_v3". block_layer=1: the trunk's block instead."""
    mtp, config, w = "model.layers.2.", config_of(path), tensors(path)
    eps = config["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k not in ("model_type",)}
    fields["num_hidden_layers"] = 3
    fields["mlp_layer_types"] = ["dense", "sparse", "sparse"]
    cfg = transformers.HYV3Config(**fields)
    cfg._attn_implementation = "eager"
    deeper = transformers.HYV3ForCausalLM.from_pretrained(str(path), config=cfg, dtype=torch.float32).eval()
    assert torch.equal(deeper.model.layers[2].mlp.gate.weight, w[mtp + "mlp.router.gate.weight"])
    norms = (mtp + "enorm.weight", mtp + "hnorm.weight")
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, norms, mtp + "eh_proj.weight", eps)
    out = deeper.model.layers[block_layer](
        x, attention_mask=causal(x.shape[1]), position_embeddings=deeper.model.rotary_emb(x, pos), position_ids=pos
    )
    normed = rms(out, w[mtp + "final_layernorm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def glm_ocr_vllm(path: Path, nxt, hidden, pos, *, block_layer: int = 2, engine: str = "vllm"):
    """vLLM's GLM-OCR MTP (glm_ocr_mtp.py, GlmOcrMultiTokenPredictorLayer): RMSNorm(embed) | RMSNorm(hidden) ->
    eh_proj -> the decoder block -> residual + output, handed on as it is (pre-norm) by vLLM, normed by SGLang 0.5.23
    (`engine`); shared_head.norm -> lm_head for the logits. The block: a GlmOcrForConditionalGeneration one text
    layer deeper reads the MTP layer's block tensors under their hub names."""
    mtp, config, w = "model.language_model.layers.2.", config_of(path), tensors(path)
    eps = config["text_config"]["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    fields["text_config"] = {**config["text_config"], "num_hidden_layers": 3}
    cfg = transformers.GlmOcrConfig(**fields)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    deeper = transformers.GlmOcrForConditionalGeneration.from_pretrained(str(path), config=cfg, dtype=torch.float32)
    text = deeper.eval().model.language_model
    assert torch.equal(text.layers[2].mlp.gate_up_proj.weight, w[mtp + "mlp.gate_up_proj.weight"])
    norms = (mtp + "enorm.weight", mtp + "hnorm.weight")
    x = _glue(w, "model.language_model.embed_tokens.weight", hidden, nxt, norms, mtp + "eh_proj.weight", eps)
    out = text.layers[block_layer](x, attention_mask=causal(x.shape[1]), position_embeddings=text.rotary_emb(x, pos))
    normed = rms(out, w[mtp + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, out if engine == "vllm" else normed


def exaone4_5_vllm(path: Path, nxt, hidden, pos, *, window: int | None = 4):
    """vLLM's EXAONE-4.5 MTP (exaone4_5_mtp.py, Exaone4_5MultiTokenPredictor): pre_fc_norm_embedding(embed) |
    pre_fc_norm_hidden(hidden) -> fc -> Exaone4DecoderLayer built at layer index 0 (a sliding-window layer with RoPE,
    window w: keys q - w < k <= q, FlashAttention's (w - 1, 0)) -> mtp.norm -> the target's lm_head, the normed hidden
    handed on. The block is transformers' Exaone4DecoderLayer loaded by hub names, which equal its parameter names.
    window=None: no window."""
    config, w = config_of(path), tensors(path)
    text = {k: v for k, v in config["text_config"].items() if k not in ("model_type", "architectures")}
    eps = text["rms_norm_eps"]
    cfg = transformers.Exaone4Config(**text)
    cfg._attn_implementation = "eager"
    block = transformers.models.exaone4.modeling_exaone4.Exaone4DecoderLayer(cfg, 0)
    block.load_state_dict({name: w["mtp.layers.0." + name] for name in block.state_dict()})
    rotary = transformers.models.exaone4.modeling_exaone4.Exaone4RotaryEmbedding(cfg)
    norms = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight")
    x = _glue(w, "model.language_model.embed_tokens.weight", hidden, nxt, norms, "mtp.fc.weight", eps)
    out = block(x, attention_mask=_windowed(x.shape[1], window), position_embeddings=rotary(x, pos), position_ids=pos)
    normed = rms(out, w["mtp.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def _neox_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """neox-style rotary over the whole head (vLLM get_rope, is_neox_style=True): x [B, T, heads, d]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[..., None].float() * inv  # [B, T, d/2]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def exaone_moe_vllm(path: Path, nxt, hidden, pos, *, rope: bool = True, window: int | None = None):
    """vLLM 0.33's K-EXAONE MTP, written out from its source (exaone_moe_mtp.py and exaone_moe.py with is_mtp=True):
    pre_fc_norm_embedding(embed) | pre_fc_norm_hidden(hidden) -> fc -> input_layernorm -> attention (q/k/v, per-head
    q_norm / k_norm, neox RoPE over the whole head although the layer is full attention, causal without a window) ->
    o_proj -> residual -> post_attention_layernorm -> dense SwiGLU (no clamp: the config has no swiglu_limits) ->
    residual -> mtp.norm -> the target's lm_head, the normed hidden handed on. Nothing from transformers' classes or
    the spec enters it. rope=False: the NoPE full layer transformers builds by default; window: SGLang's
    trunk-layer-0 variant."""
    layer, config, w = "mtp.layers.0.", config_of(path), tensors(path)
    eps, heads, kv, d = (config[k] for k in ("rms_norm_eps", "num_attention_heads", "num_key_value_heads", "head_dim"))
    theta = config["rope_parameters"]["rope_theta"]
    norms = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight")
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, norms, "mtp.fc.weight", eps)
    b, t, _ = x.shape
    a = rms(x, w[layer + "input_layernorm.weight"], eps)
    q = rms(
        (a @ w[layer + "self_attn.q_proj.weight"].T).view(b, t, heads, d), w[layer + "self_attn.q_norm.weight"], eps
    )
    k = rms((a @ w[layer + "self_attn.k_proj.weight"].T).view(b, t, kv, d), w[layer + "self_attn.k_norm.weight"], eps)
    v = (a @ w[layer + "self_attn.v_proj.weight"].T).view(b, t, kv, d)
    if rope:
        q, k = _neox_rope(q, pos, theta), _neox_rope(k, pos, theta)
    k, v = (z.repeat_interleave(heads // kv, dim=2) for z in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * d**-0.5 + _windowed(t, window)
    attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, heads * d)
    x = x + attn @ w[layer + "self_attn.o_proj.weight"].T
    m = rms(x, w[layer + "post_attention_layernorm.weight"], eps)
    gate, up = m @ w[layer + "mlp.gate_proj.weight"].T, m @ w[layer + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ w[layer + "mlp.down_proj.weight"].T
    normed = rms(x, w["mtp.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def glm_moe_dsa_vllm(path: Path, nxt, hidden, pos, *, index_topk: int | None = None, decoder: str = "glm"):
    """vLLM's GLM-5 MTP (deepseek_v32/nvidia/mtp.py, DeepseekV32MultiTokenPredictorLayer): RMSNorm(embed) |
    RMSNorm(hidden) -> eh_proj -> the decoder block (transformers' GlmMoeDsaDecoderLayer built from the checkpoint
    tensors by their hub names, own indexer, causal mask) -> shared_head.norm -> lm_head, the post-norm hidden
    recycled. transformers' generic MtpLayer cannot run a decoder layer that returns (hidden, top-k indices).
    index_topk=T: the indexer keeps every token; decoder="v32": DeepSeek-V3.2's block (half-split indexer RoPE)."""
    from transformers import DeepseekV32Config, GlmMoeDsaConfig
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as glm

    config, w = config_of(path), tensors(path)
    p, eps = "model.layers.4.", config["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "index_topk")}
    topk = index_topk or config["index_topk"]
    if decoder == "glm":
        cfg = GlmMoeDsaConfig(**fields, index_topk=topk)
        cfg.mlp_layer_types, cfg.indexer_types = ["sparse"], ["full"]
        block_cls, rotary = glm.GlmMoeDsaDecoderLayer, glm.GlmMoeDsaRotaryEmbedding
    else:
        cfg = DeepseekV32Config(**fields, index_topk=topk)
        cfg.mlp_layer_types, cfg.first_k_dense_replace = ["sparse"], 0
        block_cls, rotary = v32.DeepseekV32DecoderLayer, v32.DeepseekV32RotaryEmbedding
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    block = block_cls(cfg, 0)
    experts = range(config["n_routed_experts"])
    state = {}
    for name in block.state_dict():
        if name == "mlp.experts.gate_up_proj":
            state[name] = torch.stack(
                [torch.cat([w[f"{p}mlp.experts.{e}.{g}_proj.weight"] for g in ("gate", "up")]) for e in experts]
            )
        elif name == "mlp.experts.down_proj":
            state[name] = torch.stack([w[f"{p}mlp.experts.{e}.down_proj.weight"] for e in experts])
        else:
            state[name] = w[p + name]
    block.load_state_dict(state)
    x = _glue(
        w, "model.embed_tokens.weight", hidden, nxt, (p + "enorm.weight", p + "hnorm.weight"), p + "eh_proj.weight", eps
    )
    out = block(x, attention_mask=causal(x.shape[1]), position_embeddings=rotary(cfg)(x, pos), position_ids=pos)
    normed = rms(out[0] if isinstance(out, tuple) else out, w[p + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def nemotron_h_vllm(path: Path, nxt, hidden, pos, *, sublayers: tuple[str, str] | None = None):
    """vLLM 0.33's Nemotron-H MTP (nemotron_h_mtp.py): enorm(embed) | hnorm(hidden) -> eh_proj -> sublayer 0
    (x + attention(norm(x))) -> sublayer 1 (x + MoE(norm(x))) -> final_layernorm -> the target's lm_head, the normed
    hidden handed on; NoPE: no position embeddings at all. Each sublayer is transformers' own NemotronHBlock (built as
    a trunk block of that type) loaded from the checkpoint's tensors by their hub names. The three Nemotron-H layouts
    keep the text model under "" (text release) or language_model. (omni exports, config under llm_config) and the
    MTP layer under mtp. or language_model.mtp.; `sublayers`: the two blocks' key prefixes, default the MTP layer's
    own (trunk layers show a check can fail)."""
    from transformers.models.nemotron_h import modeling_nemotron_h as nh

    config, w = config_of(path), tensors(path)
    text, lm = config.get("llm_config", config), "language_model." if "llm_config" in config else ""
    mtp = lm + "mtp." if any(k.startswith(lm + "mtp.") for k in w) else "mtp."
    eps = text["layer_norm_epsilon"]
    fields = {
        k: v
        for k, v in text.items()
        if k not in ("architectures", "model_type", "layers_block_type", "mtp_layers_block_type")
    }
    fields.update(num_hidden_layers=2, hybrid_override_pattern="*E")
    cfg = transformers.NemotronHConfig(**fields)
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    blocks = [nh.NemotronHBlock(cfg, 0), nh.NemotronHBlock(cfg, 1)]
    m0, m1 = mtp + "layers.0.", mtp + "layers.1."
    for block, prefix in zip(blocks, sublayers or (m0, m1), strict=True):
        state = {}
        for name in block.state_dict():
            if name in ("mixer.experts.up_proj", "mixer.experts.down_proj"):
                which = name.rsplit(".", 1)[1]
                experts = range(text["n_routed_experts"])
                state[name] = torch.stack([w[f"{prefix}mixer.experts.{e}.{which}.weight"] for e in experts])
            else:
                state[name] = w[prefix + name]
        block.load_state_dict(state)
    norms = (m0 + "enorm.weight", m0 + "hnorm.weight")
    x = _glue(w, lm + "backbone.embeddings.weight", hidden, nxt, norms, m0 + "eh_proj.weight", eps)
    x = blocks[1](blocks[0](x, attention_mask=causal(x.shape[1])))
    normed = rms(x, w[m1 + "final_layernorm.weight"], eps)
    return normed @ w[lm + "lm_head.weight"].T, normed


# vLLM 0.33 qwen3_5_mtp.py (Qwen3_5MTP.load_weights: mtp. -> model.) with qwen3_next.py's stacking: q/k/v into
# qkv_proj, the shared expert's gate/up into gate_up_proj
_QWEN_STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj",
                 "shared_expert.gate_proj": "shared_expert.gate_up_proj",
                 "shared_expert.up_proj": "shared_expert.gate_up_proj"}  # fmt: skip


def qwen3_5_vllm_loads(key: str) -> str:
    for old, new in _QWEN_STACKED.items():
        key = key.replace(old, new)
    return "model." + key.removeprefix("mtp.")


def qwen3_5_mtp(path: Path, nxt, hidden, pos, *, norm: str = "zero_centered", order: str = "embed_hidden"):
    """vLLM's Qwen3.5 MTP (qwen3_5_mtp.py, Qwen3_5MultiTokenPredictor), flat text config: zero-centred RMSNorm(embed)
    | RMSNorm(hidden) -> mtp.fc -> transformers' Qwen3_5MoeDecoderLayer built as a full-attention layer (eager, the
    fused 3-D experts as the hub stores them, strict load of every mtp.layers.0.* tensor; text-only positions make the
    interleaved M-RoPE a plain partial RoPE, written by hand) -> mtp.norm, handed on -> the target's lm_head.
    norm="standard": x * w norms; order="hidden_embed": the projection's inputs swapped."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    config, w = config_of(path), tensors(path)
    eps = config["rms_norm_eps"]

    def norm_(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms(x, 1 + weight if norm == "zero_centered" else weight, eps)

    e = norm_(torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"]), w["mtp.pre_fc_norm_embedding.weight"])
    h = norm_(hidden, w["mtp.pre_fc_norm_hidden.weight"])
    x = torch.cat([e, h] if order == "embed_hidden" else [h, e], -1) @ w["mtp.fc.weight"].T
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    cfg = transformers.AutoConfig.for_model("qwen3_5_moe_text", **fields)
    cfg.layer_types, cfg._attn_implementation, cfg._experts_implementation = ["full_attention"], "eager", "eager"
    block = Qwen3_5MoeDecoderLayer(cfg, 0)
    block.load_state_dict({k[len("mtp.layers.0.") :]: v for k, v in w.items() if k.startswith("mtp.layers.0.")})
    rd = int(config["head_dim"] * config["partial_rotary_factor"])
    theta = float(config["rope_parameters"]["rope_theta"])
    freqs = pos[..., None].float() / theta ** (torch.arange(0, rd, 2).float() / rd)
    emb = torch.cat([freqs, freqs], -1)
    out = block(x, position_embeddings=(emb.cos(), emb.sin()), attention_mask=causal(x.shape[1]), position_ids=pos)
    normed = norm_(out, w["mtp.norm.weight"])
    return normed @ w["lm_head.weight"].T, normed
