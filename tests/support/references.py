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

import functools
import importlib
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
    """Key -> file: the index's, plus the tensors of top-level `*mtp*.safetensors` files it does not list (where some
    releases keep the MTP layer, as the reader finds them)."""
    from safetensors import safe_open

    out = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    for file in _unindexed(path, set(out.values())):
        with safe_open(str(file), "pt") as f:
            out.update(dict.fromkeys(f.keys(), file.name))
    return out


def _unindexed(path: Path, indexed: set[str]) -> list[Path]:
    return [f for f in sorted(path.glob("*mtp*.safetensors")) if f.name not in indexed]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (bf16) fixture checkpoint by its hub name, in fp32 (a fresh dict; the tensors are read once
    per checkpoint as it is on disk: references share them and must not write to them)."""
    return dict(_read(_files(path), False))


def dequantised(path: Path, dequant: bool = True) -> dict[str, torch.Tensor]:
    """fp32 tensors by hub name, FP8 weights dequantised with their `weight_scale_inv` as the reference table writes
    it, W[i, j] * scale_inv[i // 128, j // 128]; dequant=False: taken at face value, as a reader ignoring the scales
    would. The scales themselves are left out."""
    return {k: v for k, v in _read(_files(path), dequant).items() if not k.endswith("_scale_inv")}


def _files(path: Path) -> tuple[tuple[str, int, int], ...]:
    """The checkpoint's shards as they are on disk (name, mtime, size): what the cache of `_read` is keyed by."""
    shards = sorted(path.glob("model-0*.safetensors"))
    shards += _unindexed(path, {f.name for f in shards})  # MTP tensors outside the index (model_mtp.safetensors)
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in shards)


@functools.lru_cache(maxsize=8)
def _read(files: tuple[tuple[str, int, int], ...], dequant: bool) -> dict[str, torch.Tensor]:
    raw: dict[str, torch.Tensor] = {}
    for name, _, _ in files:
        raw.update(load_file(name))
    out = {}
    for key, tensor in raw.items():
        scale = raw.get(key + "_scale_inv") if dequant else None
        if scale is not None and not key.endswith("_scale_inv"):
            m, n = tensor.shape
            full = scale.float().repeat_interleave(128, 0)[:m].repeat_interleave(128, 1)[:, :n]
            out[key] = tensor.float() * full
        else:
            out[key] = tensor.float()
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


# ---- the MTP keys of releases with no stored key list, as the engines' loaders name them ----------------------------
# vLLM 0.33 longcat_flash_mtp.py and SGLang 0.5.23 longcat_flash_nextn.py map exactly these names
LONGCAT_FLASH_MTP_KEYS = (
    "model.mtp.embed_tokens.weight",
    "model.mtp.layers.0.eh_proj.weight",
    "model.mtp.layers.0.enorm.m.weight",
    "model.mtp.layers.0.hnorm.m.weight",
    "model.mtp.layers.0.input_layernorm.weight",
    "model.mtp.layers.0.post_attention_layernorm.weight",
    "model.mtp.layers.0.self_attn.kv_a_layernorm.weight",
    "model.mtp.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    "model.mtp.layers.0.self_attn.kv_b_proj.weight",
    "model.mtp.layers.0.self_attn.o_proj.weight",
    "model.mtp.layers.0.self_attn.q_a_layernorm.weight",
    "model.mtp.layers.0.self_attn.q_a_proj.weight",
    "model.mtp.layers.0.self_attn.q_b_proj.weight",
    "model.mtp.layers.0.transformer_layer.mlp.down_proj.weight",
    "model.mtp.layers.0.transformer_layer.mlp.gate_proj.weight",
    "model.mtp.layers.0.transformer_layer.mlp.up_proj.weight",
    "model.mtp.norm.weight",
)
# vLLM 0.33 ernie_mtp.py and SGLang 0.5.23 ernie4_eagle.py (the trunk's model.norm is read besides)
ERNIE4_5_MOE_MTP_KEYS = (
    "model.mtp_emb_norm.0.weight",
    "model.mtp_hidden_norm.0.weight",
    "model.mtp_linear_proj.0.weight",
    *(f"model.mtp_block.0.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")),
    *(f"model.mtp_block.0.self_attn.{n}_proj.weight" for n in "qkvo"),
    *(f"model.mtp_block.0.mlp.{n}_proj.weight" for n in ("gate", "up", "down")),
)


def mimo_v2_flash_keys(i: int) -> tuple[str, ...]:
    """MTP layer i of MiMo-V2-Flash (vLLM 0.33 and SGLang 0.5.23 loaders): FP8 projections with their scales, bf16
    glue, norms and sink bias."""
    p = f"model.mtp.layers.{i}."
    plain = ["enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight", "input_layernorm.weight"]
    plain += ["self_attn.attention_sink_bias", "pre_mlp_layernorm.weight"]
    fp8 = [f"self_attn.{n}_proj.weight" for n in "qkvo"] + [f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return tuple(sorted(p + k for k in plain + fp8 + [f + "_scale_inv" for f in fp8]))


def mimo_v2_keys(i: int) -> tuple[str, ...]:
    """MTP layer i of MiMo-V2.5 (vLLM 0.34 mimo_v2_mtp.py and SGLang 0.5.23 mimo_v2_nextn.py loaders; 16 tensors a
    layer, 48 in V2.5-Pro's model_mtp.safetensors for three layers): the fused FP8 qkv_proj and the MLP's FP8
    projections with their scales; o_proj, glue, norms and sink bias bf16 (MiMo-V2.5's MTP header: o_proj BF16
    [4096, 8192], qkv_proj F8_E4M3 [14848, 4096] with F32 [116, 32] scales)."""
    p = f"model.mtp.layers.{i}."
    plain = ["enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight", "input_layernorm.weight"]
    plain += ["self_attn.attention_sink_bias", "pre_mlp_layernorm.weight", "self_attn.o_proj.weight"]
    fp8 = ["self_attn.qkv_proj.weight"] + [f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return tuple(sorted(p + k for k in plain + fp8 + [f + "_scale_inv" for f in fp8]))


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


def transformers_mtp_model(path: Path, nxt, hidden, pos):
    """transformers 5.24's own MtpModel (modeling_layers.py) on the causal LM the checkpoint's config names
    (DeepseekV3ForCausalLM, Glm4MoeForCausalLM), loaded from the fixture by transformers' own loader; the hand-over
    is the post-final-norm hidden MtpModel chains."""
    from transformers.modeling_layers import MtpModel

    config = config_of(path)
    cls = getattr(transformers, config["architectures"][0])
    # transformers finds MTP keys through this attribute, hard-coded to the release's layer (61 / 92 / 46)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cls, "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{config['num_hidden_layers']}.*"])
        target = cls.from_pretrained(str(path), dtype=torch.float32).eval()
    oracle = MtpModel.from_pretrained(target).float().eval()
    chained = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
    return oracle._project_to_logits(chained), chained


def mimo(path: Path, nxt, hidden, pos, *, order: str = "hidden_embed"):
    """MiMo's MTP layer as the reference table spells it, from checkpoint key names: token_layernorm(embed) |
    hidden_layernorm(hidden), concatenated [hidden, embed] -> input_proj -> a Qwen2 decoder block -> final_layernorm
    -> lm_head, the normed hidden handed on. order="embed_hidden": the other concatenation."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    config, w = config_of(path), tensors(path)
    p, eps = "model.mtp_layers.0.", config["rms_norm_eps"]
    e = rms(torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"]), w[p + "token_layernorm.weight"], eps)
    h = rms(hidden, w[p + "hidden_layernorm.weight"], eps)
    x = torch.cat([h, e] if order == "hidden_embed" else [e, h], -1) @ w[p + "input_proj.weight"].T
    cfg = transformers.Qwen2Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    block = Qwen2DecoderLayer(cfg, 0)
    block.load_state_dict(
        {k[len(p) :]: v for k, v in w.items() if k.startswith(p) and k[len(p) :] in block.state_dict()}
    )
    rope = Qwen2RotaryEmbedding(cfg)(x, pos)
    y = block(x, attention_mask=causal(x.shape[1]), position_embeddings=rope, position_ids=pos)
    normed = rms(y, w[p + "final_layernorm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


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


# decoder -> (transformers config class, model module, class prefix, fields that make the block index 0 the MTP block)
_MLA_MOE_BLOCKS = {
    "glm": ("GlmMoeDsaConfig", "glm_moe_dsa", "GlmMoeDsa", {"mlp_layer_types": ["sparse"], "indexer_types": ["full"]}),
    "v32": ("DeepseekV32Config", "deepseek_v32", "DeepseekV32", {"mlp_layer_types": ["sparse"], "first_k_dense_replace": 0}),
    "v3": ("DeepseekV3Config", "deepseek_v3", "DeepseekV3", {"mlp_layer_types": ["sparse"], "first_k_dense_replace": 0}),
}  # fmt: skip


def _state_from_experts(module: torch.nn.Module, w: dict, prefix: str, experts: int) -> dict[str, torch.Tensor]:
    """`module`'s state read from checkpoint tensors under `prefix`: `experts.gate_up_proj` [E, 2I, H] stacked from
    each expert's gate and up, `experts.down_proj` [E, H, I] from each one's down, everything else by its own name."""
    state = {}
    for name in module.state_dict():
        head, _, leaf = name.rpartition("experts.")
        if leaf in ("gate_up_proj", "down_proj") and (not head or head.endswith(".")):
            parts = ("gate", "up") if leaf == "gate_up_proj" else ("down",)
            per = [torch.cat([w[f"{prefix}{head}experts.{e}.{g}_proj.weight"] for g in parts]) for e in range(experts)]
            state[name] = torch.stack(per)
        else:
            state[name] = w[prefix + name]
    return state


def _mla_moe_mtp(path: Path, nxt, hidden, pos, *, decoder: str, index_topk: int | None = None):
    """DeepSeek's MTP layer from checkpoint tensors by hub name: RMSNorm(embed) | RMSNorm(hidden) -> eh_proj -> the
    decoder block (transformers' `decoder` layer class, experts stacked here from per-expert tensors, causal mask) ->
    shared_head.norm -> lm_head, the post-norm hidden handed on. The MTP layer sits at model.layers.{N}."""
    config, w = config_of(path), tensors(path)
    p, eps = f"model.layers.{config['num_hidden_layers']}.", config["rms_norm_eps"]
    cfg_class, family, cls, block_fields = _MLA_MOE_BLOCKS[decoder]
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "index_topk")}
    cfg = getattr(transformers, cfg_class)(**fields, index_topk=index_topk or config["index_topk"])
    for name, value in block_fields.items():
        setattr(cfg, name, value)
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    block = getattr(modeling, f"{cls}DecoderLayer")(cfg, 0)
    # V3's block has no indexer: the indexer's tensors are not read
    block.load_state_dict(_state_from_experts(block, w, p, config["n_routed_experts"]))
    x = _glue(
        w, "model.embed_tokens.weight", hidden, nxt, (p + "enorm.weight", p + "hnorm.weight"), p + "eh_proj.weight", eps
    )
    rotary = getattr(modeling, f"{cls}RotaryEmbedding")(cfg)
    out = block(x, attention_mask=causal(x.shape[1]), position_embeddings=rotary(x, pos), position_ids=pos)
    normed = rms(out[0] if isinstance(out, tuple) else out, w[p + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def glm_moe_dsa_vllm(path: Path, nxt, hidden, pos, *, index_topk: int | None = None, decoder: str = "glm"):
    """vLLM's GLM-5 MTP (deepseek_v32/nvidia/mtp.py, DeepseekV32MultiTokenPredictorLayer): the DeepSeek MTP layer
    around transformers' GlmMoeDsaDecoderLayer (own indexer). transformers' generic MtpLayer cannot run a decoder
    layer that returns (hidden, top-k indices). index_topk=T: the indexer keeps every token; decoder="v32":
    DeepSeek-V3.2's block (half-split indexer RoPE)."""
    return _mla_moe_mtp(path, nxt, hidden, pos, decoder=decoder, index_topk=index_topk)


def deepseek_v32(path: Path, nxt, hidden, pos, *, index_topk: int | None = None, decoder: str = "v32"):
    """DeepSeek-V3.2's MTP layer (vLLM 0.33 deepseek_v32 mtp.py, SGLang 0.5.23 DeepseekV3ForCausalLMNextN): the
    DeepSeek MTP layer around transformers' DeepseekV32DecoderLayer. transformers' MtpModel does not cover it
    (`test_deepseek_v32_has_no_transformers_mtp_model`). index_topk=T: the indexer keeps every token;
    decoder="v3": V3's block on the same tensors, no indexer."""
    return _mla_moe_mtp(path, nxt, hidden, pos, decoder=decoder, index_topk=index_topk)


def longcat_flash(path: Path, nxt, hidden, pos, *, lora_scaling: bool = True):
    """LongCat's MTP layer (vLLM 0.33 longcat_flash_mtp.py, SGLang 0.5.23 longcat_flash_nextn.py): RMSNorm(embed) |
    RMSNorm(hidden) (enorm.m / hnorm.m) -> eh_proj -> pre-norm block (transformers' LongcatFlashMLA with a causal
    mask, dense LongcatFlashMLP, plain RMSNorms, residuals) -> model.mtp.norm -> lm_head, the normed hidden handed on.
    lora_scaling=False: without the (hidden / rank)^0.5 scaling of the LoRA norms."""
    from transformers.models.longcat_flash import modeling_longcat_flash as lc

    config, w = config_of(path), tensors(path)
    p, eps = "model.mtp.layers.0.", config["rms_norm_eps"]
    cfg = transformers.LongcatFlashConfig(
        **{k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    )
    cfg._attn_implementation = "eager"
    attn, mlp = lc.LongcatFlashMLA(cfg, 0), lc.LongcatFlashMLP(cfg)
    attn.load_state_dict({k: w[p + "self_attn." + k] for k in attn.state_dict()})
    mlp.load_state_dict({k: w[p + "transformer_layer.mlp." + k] for k in mlp.state_dict()})
    if not lora_scaling:
        attn.mla_scale_q_lora = attn.mla_scale_kv_lora = 1.0
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, (p + "enorm.m.weight", p + "hnorm.m.weight"),
              p + "eh_proj.weight", eps)  # fmt: skip
    rope = lc.LongcatFlashRotaryEmbedding(cfg)(x, pos)
    x = x + attn(rms(x, w[p + "input_layernorm.weight"], eps), rope, causal(x.shape[1]))[0]
    y = x + mlp(rms(x, w[p + "post_attention_layernorm.weight"], eps))
    normed = rms(y, w["model.mtp.norm.weight"], eps)
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


# ---- MiMo-V2-Flash, ERNIE-4.5, the Qwen3 hybrids: the engines' computation, the block from transformers' classes --
def _loaded(module: torch.nn.Module, w: dict[str, torch.Tensor], names: dict[str, str]) -> torch.nn.Module:
    module.load_state_dict({k: w[v] for k, v in names.items()})
    return module.eval()


def _mimo_v2_block_config(config: dict):
    """transformers config of the MTP attention as the engines read the release's fields (swa_* heads and dims,
    swa_rope_theta, sliding_window_size tokens before the query, layernorm_epsilon)."""

    def rope(theta: float) -> dict:
        return {
            "rope_type": "default",
            "rope_theta": float(theta),
            "partial_rotary_factor": config["partial_rotary_factor"],
        }

    cfg = transformers.MiMoV2FlashConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        num_hidden_layers=1,
        layer_types=["sliding_attention"],
        mlp_layer_types=["dense"],
        num_attention_heads=config["swa_num_attention_heads"],
        num_key_value_heads=config["swa_num_key_value_heads"] // 2,  # transformers doubles kv heads on SWA layers
        head_dim=config["swa_head_dim"],
        v_head_dim=config["swa_v_head_dim"],
        attention_value_scale=config["attention_value_scale"],
        rope_parameters={
            "sliding_attention": rope(config["swa_rope_theta"]),
            "full_attention": rope(config["rope_theta"]),
        },
        rms_norm_eps=config["layernorm_epsilon"],
    )
    cfg._attn_implementation = "eager"
    return cfg


def mimo_v2_flash(path: Path, nxt, hidden, pos, *, layer: int = 0, window: bool = True, dequant: bool = True):
    """MiMo-V2-Flash's MTP layer `layer` (vLLM 0.33 mimo_v2_mtp.py, SGLang 0.5.23 mimo_v2_nextn.py): enorm(embed) |
    hnorm(hidden) -> eh_proj -> SWA attention with sink bias (window sliding_window_size + 1) + dense MLP ->
    final_layernorm -> lm_head, the normed hidden handed on. window=False: full causal attention; dequant=False: the
    FP8 weights without their scales; layer: another MTP layer's weights."""
    return _mimo_v2_mtp(config_of(path), dequantised(path, dequant), nxt, hidden, pos, layer=layer, window=window)


def _mimo_v2_mtp(config: dict, w: dict, nxt, hidden, pos, *, layer: int, window: bool, eps: float | None = None):
    """The MiMo-V2 MTP computation on fp32 tensors `w` by hub name, q / k / v separate (see `mimo_v2_flash`)."""
    from transformers.models.mimo_v2_flash import modeling_mimo_v2_flash as mimo

    eps, p = config["layernorm_epsilon"] if eps is None else eps, f"model.mtp.layers.{layer}."
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, (p + "enorm.weight", p + "hnorm.weight"),
              p + "eh_proj.weight", eps)  # fmt: skip
    cfg = _mimo_v2_block_config(config)
    attn_names = {f"{n}_proj.weight": f"{p}self_attn.{n}_proj.weight" for n in "qkvo"}
    attn = _loaded(mimo.MiMoV2FlashAttention(cfg, 0), w, {**attn_names, "sinks": p + "self_attn.attention_sink_bias"})
    mlp_names = {f"{n}_proj.weight": f"{p}mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    mlp = _loaded(mimo.MiMoV2FlashMLP(cfg), w, mlp_names)
    rope = mimo.MiMoV2FlashRotaryEmbedding(cfg)(x, pos, layer_type="sliding_attention")
    mask = _windowed(x.shape[1], config["sliding_window_size"] + 1 if window else None)
    h = x + attn(rms(x, w[p + "input_layernorm.weight"], eps), rope, mask)[0]
    y = h + mlp(rms(h, w[p + "pre_mlp_layernorm.weight"], eps))
    normed = rms(y, w[p + "final_layernorm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def mimo_v2_qkv_vllm(w_full: torch.Tensor, s_full: torch.Tensor, config: dict, *, per_chunk_scales: bool = True):
    """A fused MiMo-V2.5 qkv_proj read as vLLM 0.34 `mimo_v2.py` `_shard_fp8_qkv_proj` reads it at tp_size 1 (its
    general path: each query head's rows, then each key head's, then each value head's, gathered from the chunk that
    holds them, ckpt_tp = config.num_key_value_heads, dequantised with the scale rows of their own chunk, or of one
    continuous grid), stopping before its requantisation: fp32 (q, k, v). The MTP layer's geometry is the SWA one
    (vLLM 0.34 mimo_v2_mtp.py builds MiMoV2Attention from swa_* fields). per_chunk_scales=False: the scale rows read
    as one continuous grid whatever their count (a reader that ignores the tiling)."""
    block, ckpt_tp = 128, config["num_key_value_heads"]
    heads, kv_heads = config["swa_num_attention_heads"], config["swa_num_key_value_heads"]
    head_dim, v_head_dim = config["swa_head_dim"], config["swa_v_head_dim"]
    rows_per_chunk = w_full.shape[0] // ckpt_tp
    q_per_chunk, k_per_chunk = (heads // ckpt_tp) * head_dim, (kv_heads // ckpt_tp) * head_dim
    chunk_scale_rows = -(-rows_per_chunk // block)
    rows = torch.arange(w_full.shape[0])
    if per_chunk_scales and s_full.shape[0] == ckpt_tp * chunk_scale_rows:
        scale_index = (rows // rows_per_chunk) * chunk_scale_rows + (rows % rows_per_chunk) // block
    else:
        scale_index = (rows // block).clamp(max=s_full.shape[0] - 1)
    qh, kvh = heads // ckpt_tp, kv_heads // ckpt_tp
    index = [(h // qh) * rows_per_chunk + (h % qh) * head_dim + torch.arange(head_dim) for h in range(heads)]
    index += [
        (h // kvh) * rows_per_chunk + q_per_chunk + (h % kvh) * head_dim + torch.arange(head_dim)
        for h in range(kv_heads)
    ]
    index += [
        (h // kvh) * rows_per_chunk + q_per_chunk + k_per_chunk + (h % kvh) * v_head_dim + torch.arange(v_head_dim)
        for h in range(kv_heads)
    ]
    idx = torch.cat(index)
    n = w_full.shape[1]
    grouped = w_full[idx].float() * s_full[scale_index[idx]].float().repeat_interleave(block, dim=1)[:, :n]
    return grouped.split([heads * head_dim, kv_heads * head_dim, kv_heads * v_head_dim])


def mimo_v2_release_tensors(path: Path, *, interleaved: bool = True, per_chunk_scales: bool = True) -> dict:
    """fp32 tensors of a MiMo-V2.5 checkpoint by hub name from every safetensors file in `path` (model_mtp.safetensors
    too, which the index does not list), FP8 dequantised, each fused qkv_proj split into q / k / v by
    `mimo_v2_qkv_vllm`. interleaved=False: the fused rows read as one [Q | K | V] block (a reader that ignores the
    pre-sharding)."""
    raw: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        raw.update(load_file(str(file)))
    config, out = config_of(path), {}
    for key, tensor in raw.items():
        if key.endswith("_scale_inv") or (key.endswith("qkv_proj.weight") and not key.startswith("model.mtp.")):
            continue  # the trunk's attention (full-attention layers have another geometry) is not read
        scale = raw.get(key + "_scale_inv")
        if key.endswith("qkv_proj.weight") and interleaved:
            parts = mimo_v2_qkv_vllm(tensor, scale, config, per_chunk_scales=per_chunk_scales)
            out.update({key.replace("qkv_proj", f"{n}_proj"): t for n, t in zip("qkv", parts, strict=True)})
            continue
        if scale is not None:
            m, n = tensor.shape
            tensor = tensor.float() * scale.float().repeat_interleave(128, 0)[:m].repeat_interleave(128, 1)[:, :n]
        if key.endswith("qkv_proj.weight"):
            h, kv = config["swa_num_attention_heads"], config["swa_num_key_value_heads"]
            sizes = [h * config["swa_head_dim"], kv * config["swa_head_dim"], kv * config["swa_v_head_dim"]]
            out.update(
                {key.replace("qkv_proj", f"{n}_proj"): t for n, t in zip("qkv", tensor.split(sizes), strict=True)}
            )
            continue
        out[key] = tensor.float()
    return out


def mimo_v2(path: Path, nxt, hidden, pos, *, layer: int = 0, window: bool = True, interleaved: bool = True,
            per_chunk_scales: bool = True, eps: float | None = None):  # fmt: skip
    """MiMo-V2.5's MTP layer `layer` (vLLM 0.34 mimo_v2_mtp.py MiMoV2MTPLayer: MiMo-V2-Flash's computation, the
    attention's q / k / v from the fused, pre-sharded qkv_proj as `mimo_v2_qkv_vllm` reads it; SGLang 0.5.23
    mimo_v2_nextn.py the same). Variants: interleaved=False / per_chunk_scales=False read the fused tensor wrongly;
    eps: another RMSNorm epsilon than the release's layernorm_epsilon (transformers' default is 1e-5)."""
    w = mimo_v2_release_tensors(path, interleaved=interleaved, per_chunk_scales=per_chunk_scales)
    return _mimo_v2_mtp(config_of(path), w, nxt, hidden, pos, layer=layer, window=window, eps=eps)


def ernie4_5_moe(path: Path, nxt, hidden, pos, *, final_norm: str | None = "model.norm.weight", dense: bool = True):
    """ERNIE-4.5's MTP layer: mtp_emb_norm(embed) | mtp_hidden_norm(hidden) -> mtp_linear_proj -> GQA (interleaved
    RoPE) + dense MLP -> the trunk's model.norm (FastDeploy and the training code) -> the head (tied to the embedding
    here); the hand-over is the head's input. final_norm=None: vLLM 0.33 ernie_mtp.py / SGLang 0.5.23
    ernie4_eagle.py, no norm; dense=False: the block read as MoE (only moe_intermediate_size rows fit)."""
    from transformers.models.ernie4_5_moe import modeling_ernie4_5_moe as ernie

    config, w = config_of(path), tensors(path)
    eps, p = config["rms_norm_eps"], "model.mtp_block.0."
    norms = ("model.mtp_emb_norm.0.weight", "model.mtp_hidden_norm.0.weight")
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, norms, "model.mtp_linear_proj.0.weight", eps)
    cfg = transformers.Ernie4_5_MoeConfig(
        **{k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    )
    cfg._attn_implementation = "eager"
    attn_names = {f"{n}_proj.weight": f"{p}self_attn.{n}_proj.weight" for n in "qkvo"}
    attn = _loaded(ernie.Ernie4_5_MoeAttention(cfg, 0), w, attn_names)
    size = config["intermediate_size"] if dense else config["moe_intermediate_size"]
    mlp_names = {f"{n}_proj.weight": f"{p}mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    if not dense:  # a block read as MoE: only the first moe_intermediate_size rows of the dense weights would fit
        w = {**w, **{v: w[v][:size] if "down" not in v else w[v][:, :size] for v in mlp_names.values()}}
    mlp = _loaded(ernie.Ernie4_5_MoeMLP(cfg, size), w, mlp_names)
    rope = ernie.Ernie4_5_MoeRotaryEmbedding(cfg)(x, pos)
    h = x + attn(rms(x, w[p + "input_layernorm.weight"], eps), rope, causal(x.shape[1]))[0]
    y = h + mlp(rms(h, w[p + "post_attention_layernorm.weight"], eps))
    if final_norm:
        y = rms(y, w[final_norm], eps)
    return y @ w["model.embed_tokens.weight"].T, y


# the (text) config's model_type -> transformers' modeling module and decoder-layer class
_QWEN3_HYBRIDS = {
    "qwen3_next": ("qwen3_next.modeling_qwen3_next", "Qwen3NextDecoderLayer"),
    "qwen3_5_text": ("qwen3_5.modeling_qwen3_5", "Qwen3_5DecoderLayer"),
    "qwen3_5_moe_text": ("qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeDecoderLayer"),
}


def qwen3_hybrid(path: Path, nxt, hidden, pos, *, norm: str = "zero_centered", order: str = "embed_hidden",
                 gate: bool = True):  # fmt: skip
    """Qwen3-Next / Qwen3.5 MTP (vLLM 0.33 qwen3_next_mtp.py / qwen3_5_mtp.py): zero-centred RMSNorms, fc over
    [embed, hidden], a full-attention decoder block (transformers' class, eager, causal mask, hand-made partial
    RoPE), mtp.norm, then the target's lm_head (the embedding when tied), the normed hidden handed on.
    norm="standard": x * w norms; order="hidden_embed": the concatenation swapped; gate=False: the attention output
    gate disabled (sigmoid(gate) -> 1)."""
    config, w = config_of(path), tensors(path)
    text = config.get("text_config", config)
    eps = text["rms_norm_eps"]

    def norm_(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms(x, 1 + weight if norm == "zero_centered" else weight, eps)

    embed = w.get("model.embed_tokens.weight", w.get("model.language_model.embed_tokens.weight"))
    head = w.get("lm_head.weight", embed)
    e, h = (
        norm_(torch.nn.functional.embedding(nxt, embed), w["mtp.pre_fc_norm_embedding.weight"]),
        norm_(hidden, w["mtp.pre_fc_norm_hidden.weight"]),
    )
    x = torch.cat([e, h] if order == "embed_hidden" else [h, e], -1) @ w["mtp.fc.weight"].T
    fields = {k: v for k, v in text.items() if k not in ("model_type", "architectures")}
    cfg = transformers.AutoConfig.for_model(text["model_type"], **fields)
    cfg.layer_types = ["full_attention"]
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    module, cls = _QWEN3_HYBRIDS[text["model_type"]]
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
    with pytest.MonkeyPatch.context() as m:
        if not gate:
            m.setattr(torch, "sigmoid", torch.ones_like)
        y = block(x, position_embeddings=(emb.cos(), emb.sin()), attention_mask=causal(x.shape[1]), position_ids=pos)
    normed = norm_(y, w["mtp.norm.weight"])
    return normed @ head.T, normed


# ---- Step-3.5 / 3.7: transformers' own MtpModel, with the sliding head count and the heads the engines use --------
def _as_step3p7(path: Path) -> Path:
    """`path`, or for another model_type of the same model (Step-5-Preview's step3p5v) a sibling directory whose
    config.json says step3p7, its shards linked: transformers applies its "step3p7" key renames by model_type."""
    config = config_of(path)
    if config.get("model_type") == "step3p7":
        return path
    out = path.parent / (path.name + "-as-step3p7")
    if not out.exists():
        out.mkdir()
        for f in path.iterdir():
            if f.name != "config.json":
                (out / f.name).symlink_to(f.resolve())
        as_step3p7 = {**config, "model_type": "step3p7", "architectures": ["Step3p7ForConditionalGeneration"]}
        (out / "config.json").write_text(json.dumps(as_step3p7))
    return out


def _step3p7_oracle(path: Path):
    """transformers 5.24's MtpModel (modeling_layers.py) over the fixture's Step3p7ForConditionalGeneration trunk,
    MTP weights loaded by the renames of its conversion_mapping "MtpModel" and "step3p7" (layers.{n + i}. ->
    layers.{i}.mtp_block., enorm / hnorm / eh_proj at the layer, shared_head.norm -> post_norm; moe.gate_proj | up_proj
    concatenated on dim 1), the `.transformer.` sub-prefix of the head dropped as both engines drop it. One change to
    the config it reads: get_mtp_config() copies `mtp_per_layer_config`, which transformers never sets, so its
    sliding MTP layers get num_attention_heads; here it holds num_sliding_attention_heads for them, as vLLM 0.34's
    step3p5.py `_get_num_attention_heads` and SGLang 0.5.23 give every sliding layer (the fixture's sliding layers
    have twice the heads, so without it the weights do not load)."""
    from transformers.modeling_layers import MtpModel

    target = transformers.Step3p7ForConditionalGeneration.from_pretrained(str(_as_step3p7(path)), dtype=torch.float32)
    target = target.eval()
    text = target.config.text_config
    sliding = {i: {"num_attention_heads": text.num_sliding_attention_heads}
               for i, t in enumerate(text.mtp_layer_types) if t == "sliding_attention"}  # fmt: skip
    text.mtp_per_layer_config = sliding
    oracle = MtpModel(target, text.num_mtp_layers).float().eval()
    n, w, state = text.num_hidden_layers, tensors(path), {}
    for i in range(text.num_mtp_layers):
        p = f"model.layers.{n + i}."
        for key, t in w.items():
            if not key.startswith(p) or "shared_head.output" in key:
                continue
            rel = key[len(p) :].replace("transformer.shared_head.norm.", "post_norm.")
            rel = rel if rel.split(".")[0] in ("enorm", "hnorm", "eh_proj", "post_norm") else "mtp_block." + rel
            rel = rel.replace("moe.router_bias", "mlp.gate.e_score_correction_bias").replace("moe.gate.", "mlp.gate.")
            rel = rel.replace("share_expert.", "mlp.shared_experts.").replace(
                "moe.down_proj.weight", "mlp.experts.down_proj"
            )
            state[f"layers.{i}.{rel}"] = t.float()
        if p + "moe.gate_proj.weight" in w:
            stacked = [state.pop(f"layers.{i}.mtp_block.moe.{g}_proj.weight") for g in ("gate", "up")]
            state[f"layers.{i}.mtp_block.mlp.experts.gate_up_proj"] = torch.cat(stacked, dim=1)  # [E, 2I, H]
    missing, unexpected = oracle.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("embed_tokens", "shared_head")) for k in missing), (missing, unexpected)
    return oracle, w, n


def step3p7(path: Path, nxt, hidden, pos, *, layer: int = 0, handover: str = "pre_norm", head: str = "own"):
    """MTP layer `layer` of Step-3.7: transformers' MtpModel.forward_layer (`_step3p7_oracle`) for the block, then
    what the engines do after it (vLLM 0.34 step3p5_mtp.py, SGLang 0.5.23 step3p5_mtp.py): shared_head.norm and the
    layer's own shared_head.output for the logits, the block output before that norm handed on (MtpModel hands on
    the normed hidden: handover="post_norm"). head="target": the trunk's lm_head, as MtpModel computes logits."""
    oracle, w, n = _step3p7_oracle(path)
    mtp = oracle.layers[layer]
    mtp.use_post_norm = False  # the block output before shared_head.norm
    out = oracle.forward_layer(layer, hidden, pos, None, input_ids=nxt)
    normed = mtp.post_norm(out)
    own = w[f"model.layers.{n + layer}.transformer.shared_head.output.weight"].float()
    logits = normed @ (own if head == "own" else w["lm_head.weight"].float()).T
    return logits, (out if handover == "pre_norm" else normed)


def step3p7_keys(i: int) -> tuple[str, ...]:
    """A dense MTP layer of Step-3.5 / 3.7 as the release names it (every name one of vLLM 0.34's and SGLang 0.5.23's
    step3p5_mtp.py loaders maps; the head under the `.transformer.` sub-prefix both drop)."""
    p = f"model.layers.{i}."
    glue = [
        "eh_proj.weight",
        "enorm.weight",
        "hnorm.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    block = [f"mlp.{n}_proj.weight" for n in ("down", "gate", "up")] + [f"self_attn.{n}.weight" for n in (
        "g_proj", "k_norm", "k_proj", "o_proj", "q_norm", "q_proj", "v_proj")]  # fmt: skip
    head = ["transformer.shared_head.norm.weight", "transformer.shared_head.output.weight"]
    return tuple(sorted(p + k for k in glue + block + head))


def glm5_next_vllm(path: Path, nxt, hidden, pos, *, index_topk: int | None = None):
    """vLLM 0.34's GLM-5.3-Flash MTP (glm5next/common/mtp.py, Glm5NextMultiTokenPredictorLayer): enorm(embed) |
    hnorm(hidden) -> eh_proj -> Glm5NextDecoderLayer(is_mtp_layer=True), its non-mHC path: x + attention(
    input_layernorm(x)), + MoE(post_attention_layernorm(.)) -> shared_head.norm -> the target's lm_head, the normed
    hidden handed on. No RoPE anywhere (skip_rope=mla_use_nope). The attention and the MoE are transformers'
    Glm5NextTextAttention (its own k-pool indexer, all queries valid, causality from the indexer) and Glm5NextTextMoE,
    loaded by hub names; vLLM's indexer scores in FP8, this one in fp32. index_topk=T: the indexer keeps every token."""
    from transformers.models.glm5_next import modeling_glm5_next as g5

    config, w = config_of(path), tensors(path)
    text = config["text_config"]
    p, eps = f"model.language_model.layers.{text['num_hidden_layers']}.", text["rms_norm_eps"]
    fields = {k: v for k, v in text.items() if k not in ("architectures", "model_type", "index_topk")}
    cfg = transformers.Glm5NextTextConfig(**fields, index_topk=index_topk or text["index_topk"])
    cfg.indexer_types, cfg.mlp_layer_types, cfg.layer_types = ["full"], ["sparse"], ["indexed_attention"]
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    attn, moe = g5.Glm5NextTextAttention(cfg, 0), g5.Glm5NextTextMoE(cfg)
    attn.load_state_dict({k: w[p + "self_attn." + k] for k in attn.state_dict()})
    moe.load_state_dict(_state_from_experts(moe, w, p + "mlp.", text["n_routed_experts"]))
    x = _glue(w, "model.language_model.embed_tokens.weight", hidden, nxt, (p + "enorm.weight", p + "hnorm.weight"),
              p + "eh_proj.weight", eps)  # fmt: skip
    valid = torch.ones(x.shape[:2], dtype=torch.bool)  # every query valid: the indexer makes the causal selection
    x = x + attn(rms(x, w[p + "input_layernorm.weight"], eps), valid)[0]
    y = x + moe(rms(x, w[p + "post_attention_layernorm.weight"], eps))
    normed = rms(y, w[p + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def qwen3_5_dense_vllm_loads(key: str) -> str:
    """A dense Qwen3.5 MTP key as vLLM 0.34's Qwen3_5MTP loads it (models/qwen3_5/nvidia/mtp.py: mtp. -> model.;
    packed_modules_mapping stacks q/k/v into qkv_proj and the dense MLP's gate/up into gate_up_proj)."""
    return qwen3_5_vllm_loads(
        key.replace("mlp.gate_proj", "mlp.gate_up_proj").replace("mlp.up_proj", "mlp.gate_up_proj")
    )


def hy_v4_mtp_keys(experts: int = 8) -> tuple[str, ...]:
    """HY-V4's MTP layer 0 keys as vLLM 0.34 (models/hy_v4/nvidia/mtp.py load_weights: model.mtp_layers.{i}, enorm /
    hnorm / eh_proj / final_layernorm outside mtp_block, linear_gate, indexer wk / weights_proj, fused or per-expert
    mlp.experts, mlp.gate.e_score_correction_bias) and SGLang 0.5.23 (hunyuan_v4_nextn.py: final_layernorm ->
    shared_head.norm) map them, per-expert; no stored key list of a release was found."""
    p = "model.mtp_layers.0."
    attn = ("kv_a_layernorm", "kv_a_proj_with_mqa", "kv_b_proj", "linear_gate", "o_proj", "q_a_layernorm", "q_a_proj",
            "q_b_proj", "indexer.wq_b", "indexer.wk", "indexer.k_norm", "indexer.weights_proj")  # fmt: skip
    out = [p + n + ".weight" for n in ("eh_proj", "enorm", "hnorm", "final_layernorm", "input_layernorm",
                                       "post_attention_layernorm", "mlp.gate")]  # fmt: skip
    out += [f"{p}self_attn.{n}.weight" for n in attn]
    out += [
        p + "self_attn.indexer.k_norm.bias",
        p + "self_attn.learnable_sink_param",
        p + "mlp.gate.e_score_correction_bias",
    ]
    out += [f"{p}mlp.shared_experts.{g}_proj.weight" for g in ("gate", "up", "down")]
    out += [f"{p}mlp.experts.{e}.{g}_proj.weight" for e in range(experts) for g in ("gate", "up", "down")]
    return tuple(out)


def hy_v4_vllm(path: Path, nxt, hidden, pos, *, index_topk: int | None = None, sinks: bool = True):
    """vLLM 0.34's HY-V4 MTP (models/hy_v4/nvidia/mtp.py, HYV4MultiTokenPredictorLayer): enorm(embed) | hnorm(hidden)
    -> eh_proj -> HYV4DecoderLayer built with enable_ihc = False, its _forward_normal path: x + attention(
    input_layernorm(x)), + MoE(post_attention_layernorm(.)) -> final_layernorm -> the target's lm_head, the normed
    hidden handed on. The attention (MLA, interleaved RoPE, its own DSA indexer, sigmoid output gate, attention sinks)
    and the MoE are transformers' HYV4Attention and HYV4MoE loaded by hub names (linear_gate, learnable_sink_param);
    vLLM's indexer scores in FP8, this one in fp32; no position-0 zeroing (vLLM's; left to the engine).
    index_topk=T: the indexer keeps every token; sinks=False: the sink logits dropped."""
    from transformers.models.hy_v4 import modeling_hy_v4 as h4

    config, w = config_of(path), tensors(path)
    p, eps = "model.mtp_layers.0.", config["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "index_topk")}
    cfg = transformers.HYV4Config(**fields, index_topk=index_topk or config["index_topk"])
    cfg.indexer_types, cfg.mlp_layer_types, cfg.layer_types = ["full"], ["sparse"], ["indexed_attention"]
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    attn, moe = h4.HYV4Attention(cfg, 0), h4.HYV4MoE(cfg)
    hub = {"gate_proj.weight": "linear_gate.weight", "sinks": "learnable_sink_param"}
    attn.load_state_dict({k: w[p + "self_attn." + hub.get(k, k)] for k in attn.state_dict()})
    if not sinks:
        attn.sinks.data.fill_(float("-inf"))  # exp(-inf) = 0: the softmax without a sink column
    moe.load_state_dict(_state_from_experts(moe, w, p + "mlp.", config["n_routed_experts"]))
    x = _glue(w, "model.embed_tokens.weight", hidden, nxt, (p + "enorm.weight", p + "hnorm.weight"), p + "eh_proj.weight",
              eps)  # fmt: skip
    rope = h4.HYV4RotaryEmbedding(cfg)(x, pos)
    x = x + attn(rms(x, w[p + "input_layernorm.weight"], eps), rope, causal(x.shape[1]), position_ids=pos)[0]
    y = x + moe(rms(x, w[p + "post_attention_layernorm.weight"], eps))
    normed = rms(y, w[p + "final_layernorm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed
