"""DeepSeek-V3.2 (MLA + DSA indexer + MoE) and LongCat-Flash (MLA with LoRA norm scaling + dense MLP).

For each fixture: both conversions, the exact MTP keys read, FP8 dequantisation; then the MTP computation against a
reference written here from the checkpoint tensors by their hub names, with one assertion per detail in which these
families differ from the DeepSeek-V3 row (transformers' MtpModel does not cover either family: see below).
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.fixtures import eagle3_depth
from support.references import rms, tensors

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import CheckpointError
from mtp2draft.family.spec import find_spec, get_spec

T = 10  # sequence length of the forward checks: longer than the V3.2 fixture's index_topk (4)


def _index(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def _causal(t: int) -> torch.Tensor:
    return torch.full((t, t), float("-inf")).triu(1)[None, None]  # [1, 1, T, T] additive


def _inputs(seed: int, t: int = T, hidden: int = 64):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    h = torch.randn(2, t, hidden, generator=gen) * 3
    return nxt, h, torch.arange(t).expand(2, -1)


# ---- both families: conversion, keys, FP8 ----------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["deepseek_v32", "deepseek_v32_fp8", "longcat_flash"])
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_both_kinds(build, tmp_path: Path, fixture: str, kind: str) -> None:
    result = convert(str(build(fixture, **eagle3_depth(fixture, kind))), tmp_path / "out", to=kind)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".mtp2draft",
        "config.json",
        "model.safetensors",
        "provenance.json",
    ]
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == fixture.removesuffix("_fp8") and prov["spec_verified"]
    assert bool(prov["dequantised_fp8"]) == fixture.endswith("_fp8")


LONGCAT_MTP_KEYS = [  # vLLM longcat_flash_mtp.py and SGLang longcat_flash_nextn.py map exactly these names
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
]


def test_longcat_checkpoint_has_the_hub_names_and_the_plan_reads_the_mtp_layer(build) -> None:
    path = build("longcat_flash")
    index = _index(path)
    assert sorted(k for k in index if k.startswith("model.mtp.")) == LONGCAT_MTP_KEYS
    ckpt = open_checkpoint(str(path))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    # everything of the MTP layer except the stored embedding copy (the target's is shared, as SGLang does)
    assert sorted(plan.checkpoint_keys) == [k for k in LONGCAT_MTP_KEYS if k != "model.mtp.embed_tokens.weight"]
    assert plan.stored_embed == "model.mtp.embed_tokens.weight" and plan.stored_head is None
    groups = {g.module_key: g.ckpt_keys for g in plan.groups}
    assert groups["enorm.weight"] == ("model.mtp.layers.0.enorm.m.weight",)
    assert groups["block.mlp.gate_proj.weight"] == ("model.mtp.layers.0.transformer_layer.mlp.gate_proj.weight",)
    # the trunk, as transformers' save_pretrained writes it, uses the release's names (dual sublayers, ScMoE)
    trunk = {".".join("#" if p.isdigit() else p for p in k.split(".")) for k in index if not k.startswith("model.mtp.")}
    assert trunk == {
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.#.input_layernorm.#.weight",
        "model.layers.#.post_attention_layernorm.#.weight",
        "model.layers.#.mlp.router.classifier.weight",
        "model.layers.#.mlp.router.e_score_correction_bias",
        *(f"model.layers.#.mlp.experts.#.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"model.layers.#.mlps.#.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(
            f"model.layers.#.self_attn.#.{n}.weight"
            for n in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")
        ),
        "model.layers.#.self_attn.#.o_proj.weight",
    }


def test_longcat_count_and_layer_fields() -> None:
    """The release config.json has neither an MTP count (engines hard-code 1) nor num_hidden_layers (num_layers)."""
    from support.fixtures import FIXTURES

    LONGCAT_FLASH = FIXTURES["longcat_flash"]["config"]
    spec = get_spec("longcat_flash")
    assert "num_hidden_layers" not in LONGCAT_FLASH and "num_nextn_layers" not in LONGCAT_FLASH
    assert spec.num_mtp_layers(LONGCAT_FLASH) == 1 and spec.num_layers(LONGCAT_FLASH) == 2
    assert spec.num_mtp_layers({**LONGCAT_FLASH, "num_nextn_layers": 0}) == 0


V32_INDEXER_KEYS = [
    "model.layers.2.self_attn.indexer.k_norm.bias",
    "model.layers.2.self_attn.indexer.k_norm.weight",
    "model.layers.2.self_attn.indexer.weights_proj.weight",
    "model.layers.2.self_attn.indexer.wk.weight",
    "model.layers.2.self_attn.indexer.wq_b.weight",
]


@pytest.mark.parametrize("fixture", ["deepseek_v32", "deepseek_v32_fp8"])
def test_v32_plan_reads_exactly_the_mtp_layer(build, fixture: str) -> None:
    ckpt = open_checkpoint(str(build(fixture)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    layer = [k for k in ckpt.weight_map if k.startswith("model.layers.2.") and not k.endswith("_scale_inv")]
    stored = {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"}
    assert stored <= set(layer)
    assert sorted(plan.checkpoint_keys) == sorted(set(layer) - stored)
    assert [k for k in sorted(plan.checkpoint_keys) if ".indexer." in k] == V32_INDEXER_KEYS
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.mlp).__name__ == "DeepseekV32MoE"  # block_overrides: index 0 is the sparse MoE block


def test_v32_fp8_dequantises_like_the_release(build) -> None:
    """FP8 release: the indexer's wq_b / wk are FP8 blocks, weights_proj and k_norm are not; all dequantise."""
    fp8 = open_checkpoint(str(build("deepseek_v32_fp8")))
    p = "model.layers.2.self_attn.indexer."
    assert [fp8.info(p + n).dtype for n in ("wq_b.weight", "wk.weight")] == ["F8_E4M3", "F8_E4M3"]
    assert fp8.scale_key(p + "weights_proj.weight") is None and fp8.scale_key(p + "k_norm.weight") is None
    ours, ref = load_native(fp8, attach_target=False), load_native(str(build("deepseek_v32")), attach_target=False)
    quantised = 0
    for (key, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items(), strict=True):
        if torch.equal(a, b):
            continue
        quantised += 1
        assert (a - b).abs().max() <= 0.07 * b.abs().max(), key  # e4m3: 3 mantissa bits
    assert quantised > 10


# ---- DeepSeek-V3.2 -----------------------------------------------------------------------------------------------
def test_transformers_mtp_model_does_not_cover_v32(build) -> None:
    """No oracle from transformers: DeepseekV32Config has no num_mtp_layers, so MtpModel cannot build the layer.
    If this starts failing, transformers covers V3.2: switch the reference below to MtpModel."""
    from transformers import AutoConfig

    config = json.loads((build("deepseek_v32") / "config.json").read_text())
    cfg = AutoConfig.for_model("deepseek_v32", **{k: v for k, v in config.items() if k != "model_type"})
    assert not hasattr(cfg, "num_mtp_layers")
    with pytest.raises(ValueError, match="num_mtp_layers"):
        cfg.get_mtp_config()


def _v32_reference(w, config, nxt, hidden, pos, *, family="deepseek_v32", index_topk=None):
    """DeepSeek's MTP layer from checkpoint tensors by hub name: RMSNorm(embed) | RMSNorm(hidden) -> eh_proj ->
    the family's decoder layer (experts stacked here from per-expert tensors) with a causal mask ->
    shared_head.norm -> lm_head. `family="deepseek_v3"` runs the same weights through V3's block (no indexer)."""
    import transformers

    p, eps = "model.layers.2.", config["rms_norm_eps"]
    cls = "DeepseekV32" if family == "deepseek_v32" else "DeepseekV3"
    mod = getattr(transformers.models, family)
    modeling = getattr(mod, f"modeling_{family}")
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "index_topk")}
    cfg = getattr(transformers, f"{cls}Config")(**fields, index_topk=index_topk or config["index_topk"])
    cfg.mlp_layer_types, cfg.first_k_dense_replace = ["sparse"], 0  # MTP blocks are MoE
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    block = getattr(modeling, f"{cls}DecoderLayer")(cfg, 0)
    n_exp = config["n_routed_experts"]
    state = {}
    for name in block.state_dict():
        if name == "mlp.experts.gate_up_proj":
            ex = [
                torch.cat([w[f"{p}mlp.experts.{e}.gate_proj.weight"], w[f"{p}mlp.experts.{e}.up_proj.weight"]])
                for e in range(n_exp)
            ]
            state[name] = torch.stack(ex)
        elif name == "mlp.experts.down_proj":
            state[name] = torch.stack([w[f"{p}mlp.experts.{e}.down_proj.weight"] for e in range(n_exp)])
        else:
            state[name] = w[p + name]
    block.load_state_dict(state)
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat([rms(e, w[p + "enorm.weight"], eps), rms(hidden, w[p + "hnorm.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    rope = getattr(modeling, f"{cls}RotaryEmbedding")(cfg)(x, pos)
    y = block(x, attention_mask=_causal(x.shape[1]), position_embeddings=rope, position_ids=pos)
    normed = rms(y, w[p + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_v32_layer_follows_the_reference(build) -> None:
    path = build("deepseek_v32")
    config = json.loads((path / "config.json").read_text())
    w = tensors(path)
    ours = load_native(str(path)).eval()
    nxt, hidden, pos = _inputs(0)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)  # no mask given: the draft builds the causal one the indexer reads
        masked, _ = ours(nxt, hidden, pos, attention_mask=_causal(T))
        right, normed = _v32_reference(w, config, nxt, hidden, pos)
        dense, _ = _v32_reference(w, config, nxt, hidden, pos, index_topk=T)  # indexer keeps every token
    assert (mine - right).abs().max().item() <= 1e-4 and (masked - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # post-final-norm hidden handed to the next step
    # detail 1: the indexer's top-k sparse mask is applied (T > index_topk), so its weights matter
    assert (mine - dense).abs().max().item() > 1e-2


def test_v32_equals_dense_v3_mla_while_context_fits_index_topk(build) -> None:
    """Detail 2: up to index_topk tokens the indexer selects every key, so the block is V3's MLA + MoE exactly:
    what the EAGLE-3 conversion's 'same up to index_topk tokens' rests on."""
    path = build("deepseek_v32")
    config = json.loads((path / "config.json").read_text())
    w = {k: v for k, v in tensors(path).items() if ".indexer." not in k}
    ours = load_native(str(path)).eval()
    t = config["index_topk"]
    nxt, hidden, pos = _inputs(1, t)
    with torch.no_grad():
        mine, _ = ours(nxt, hidden, pos, attention_mask=_causal(t))
        v3, _ = _v32_reference(w, config, nxt, hidden, pos, family="deepseek_v3")
    assert (mine - v3).abs().max().item() <= 1e-4


def test_v32_indexer_uses_the_draft_cache(build) -> None:
    """Step by step with DraftCache (MLA latents + indexer keys, no mask given) equals the full causal forward."""
    from mtp2draft.draft.modules import DraftCache

    path = build("deepseek_v32")
    ours = load_native(str(path)).eval()
    nxt, hidden, pos = _inputs(2)
    cache = DraftCache()
    with torch.no_grad():
        full, _ = ours(nxt, hidden, pos, attention_mask=_causal(T))
        bounds = [0, 3, 4, 6, T]  # chunks of 3, 1, 2, 4 tokens: each attends to the cached past plus itself
        steps = [ours(nxt[:, a:b], hidden[:, a:b], pos[:, a:b], cache=cache)[0] for a, b in itertools.pairwise(bounds)]
    assert cache.indexer is not None and cache.indexer.shape[-2] == T
    assert (torch.cat(steps, 1) - full).abs().max().item() <= 1e-4


def test_v32_eagle3_provenance_says_the_indexer_is_dropped(build, tmp_path: Path) -> None:
    convert(str(build("deepseek_v32", num_hidden_layers=4)), tmp_path / "e", to="eagle3")
    prov = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]
    for p in "qkvo":
        entry = prov[f"midlayer.self_attn.{p}_proj.weight"]
        assert not entry["exact"] and "DSA indexer dropped" in entry["how"] and "same up to 4 tokens" in entry["how"]


# ---- LongCat-Flash -----------------------------------------------------------------------------------------------
def _longcat_reference(w, config, nxt, hidden, pos, *, lora_scaling: bool = True):
    """LongCat's MTP layer from checkpoint tensors by hub name, as the reference table spells it: RMSNorm(embed) |
    RMSNorm(hidden) -> eh_proj -> pre-norm block (transformers' LongcatFlashMLA with a causal mask, dense
    LongcatFlashMLP, plain RMSNorms, residuals) -> model.mtp.norm -> lm_head."""
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import (
        LongcatFlashMLA,
        LongcatFlashMLP,
        LongcatFlashRotaryEmbedding,
    )

    p, eps = "model.mtp.layers.0.", config["rms_norm_eps"]
    cfg = LongcatFlashConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    attn, mlp = LongcatFlashMLA(cfg, 0), LongcatFlashMLP(cfg)
    attn.load_state_dict({k: w[p + "self_attn." + k] for k in attn.state_dict()})
    mlp.load_state_dict({k: w[p + "transformer_layer.mlp." + k] for k in mlp.state_dict()})
    if not lora_scaling:
        attn.mla_scale_q_lora = attn.mla_scale_kv_lora = 1.0
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat([rms(e, w[p + "enorm.m.weight"], eps), rms(hidden, w[p + "hnorm.m.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    rope = LongcatFlashRotaryEmbedding(cfg)(x, pos)
    a, _ = attn(rms(x, w[p + "input_layernorm.weight"], eps), rope, _causal(x.shape[1]))
    x = x + a
    y = x + mlp(rms(x, w[p + "post_attention_layernorm.weight"], eps))
    normed = rms(y, w["model.mtp.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_longcat_layer_follows_the_reference(build) -> None:
    path = build("longcat_flash")
    config = json.loads((path / "config.json").read_text())
    w = tensors(path)
    ours = load_native(str(path)).eval()
    nxt, hidden, pos = _inputs(3)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)  # no mask: the block attends causally by itself
        masked, _ = ours(nxt, hidden, pos, attention_mask=_causal(T))
        right, normed = _longcat_reference(w, config, nxt, hidden, pos)
        unscaled, _ = _longcat_reference(w, config, nxt, hidden, pos, lora_scaling=False)
    assert (mine - right).abs().max().item() <= 1e-4 and (masked - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)
    # detail (b): the LoRA norm scaling (hidden / rank)^0.5 is applied, and it matters
    assert config["mla_scale_q_lora"] and config["mla_scale_kv_lora"]
    assert ours.block.self_attn.mla_scale_q_lora == pytest.approx((64 / config["q_lora_rank"]) ** 0.5)
    assert ours.block.self_attn.mla_scale_kv_lora == pytest.approx((64 / config["kv_lora_rank"]) ** 0.5)
    assert (mine - unscaled).abs().max().item() > 1e-2


def test_longcat_mtp_block_is_dense_not_the_trunk_moe(build) -> None:
    """Detail (a): the MTP block's MLP is one dense SwiGLU of ffn_hidden_size, not the trunk's ScMoE."""
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMLA, LongcatFlashMLP

    path = build("longcat_flash")
    mtp = [k for k in _index(path) if k.startswith("model.mtp.")]
    assert not [k for k in mtp if "router" in k or "experts" in k or "mlps" in k]
    block = load_native(str(path), attach_target=False).block
    assert type(block.mlp) is LongcatFlashMLP and type(block.self_attn) is LongcatFlashMLA
    config = json.loads((path / "config.json").read_text())
    assert config["ffn_hidden_size"] != config["expert_ffn_hidden_size"]
    assert block.mlp.gate_proj.weight.shape == (config["ffn_hidden_size"], 64)


def test_longcat_reads_the_dot_m_norm_names(build, tmp_path: Path) -> None:
    """Detail (c): enorm / hnorm are read from `.enorm.m.weight` / `.hnorm.m.weight`; a checkpoint with the
    DeepSeek-style `.enorm.weight` fails with a clear CheckpointError."""
    path = tmp_path / "ck"
    shutil.copytree(build("longcat_flash"), path)
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    renames = {f"model.mtp.layers.0.{n}.m.weight": f"model.mtp.layers.0.{n}.weight" for n in ("enorm", "hnorm")}
    for shard in {index["weight_map"][k] for k in renames}:
        tensors = load_file(str(path / shard))
        save_file({renames.get(k, k): v for k, v in tensors.items()}, str(path / shard), {"format": "pt"})
    index["weight_map"] = {renames.get(k, k): v for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing model\.mtp\.layers\.0\.enorm\.m\.weight"):
        load_native(str(path))


def test_longcat_eagle3_folds_the_lora_scaling(build, tmp_path: Path) -> None:
    """The EAGLE-3 init folds (hidden / rank)^0.5 into q and into k_nope / v (the shared k_rope is not scaled)."""
    on, off = (
        build("longcat_flash", num_layers=4),
        build("longcat_flash", num_layers=4, mla_scale_q_lora=False, mla_scale_kv_lora=False),
    )
    convert(str(on), tmp_path / "on", to="eagle3", dtype="float32")
    convert(str(off), tmp_path / "off", to="eagle3", dtype="float32")
    a, b = load_file(str(tmp_path / "on" / "model.safetensors")), load_file(str(tmp_path / "off" / "model.safetensors"))
    s_q, s_kv = (64 / 48) ** 0.5, (64 / 32) ** 0.5
    attn = "midlayer.self_attn."
    heads, d, dr = 4, 16 + 64, 64  # the MTP layer's heads come first; embedding pass-through heads follow
    a = {k: v[: heads * d] if k.startswith(attn) and k[len(attn) : len(attn) + 1] in "qkv" else v for k, v in a.items()}
    b = {k: v[: heads * d] if k.startswith(attn) and k[len(attn) : len(attn) + 1] in "qkv" else v for k, v in b.items()}
    assert torch.allclose(a[attn + "q_proj.weight"], b[attn + "q_proj.weight"] * s_q, rtol=1e-5, atol=1e-7)
    assert torch.allclose(a[attn + "v_proj.weight"], b[attn + "v_proj.weight"] * s_kv, rtol=1e-5, atol=1e-7)
    # k, row by row (rows are RoPE-permuted): k_nope rows scale by s_kv, the k_rope rows (shared latent) do not
    k_on, k_off = a[attn + "k_proj.weight"].view(heads, d, -1), b[attn + "k_proj.weight"].view(heads, d, -1)
    ratio = k_on.norm(dim=-1) / k_off.norm(dim=-1)  # [heads, d]: s_kv on the nope dims, 1 on the rope dims
    assert torch.allclose(ratio.sort(dim=-1).values[:, :dr], torch.ones(heads, dr), atol=1e-4)
    assert torch.allclose(ratio.sort(dim=-1).values[:, dr:], torch.full((heads, d - dr), s_kv), atol=1e-4)
    prov = json.loads((tmp_path / "on" / "provenance.json").read_text())["tensors"]
    assert "LoRA scaling of q folded in" in prov[attn + "q_proj.weight"]["how"]
    assert (
        "LoRA scaling"
        not in json.loads((tmp_path / "off" / "provenance.json").read_text())["tensors"][attn + "q_proj.weight"]["how"]
    )
