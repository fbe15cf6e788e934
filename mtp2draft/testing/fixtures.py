"""Tiny checkpoints in the exact hub layout of each family, for tests, benchmarks and the quick start.

Each fixture is a row of data in `FIXTURES`: the family's config.json with its real field names (tiny values), the
transformers model class whose trunk weights it saves (transformers writes them in the hub layout: per-expert MoE
keys and all), and options (FP8, stored embed/head copies, number of MTP layers). The MTP tensors, which transformers
drops on save, are generated through the native module and written under the family's real key names via the spec's
inverse mapping. Shards: at least two, with `model.safetensors.index.json`.

Adding a family whose block kind exists: one spec file and one row here.

What this module does not do: train anything (see scripts/train_target.py) or write tokenizers.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..draft import NativeMtpDraft
from ..fp8 import quantize_fp8
from ..io import save_tensors, write_json
from ..layout import native_to_checkpoint
from ..spec import get_spec

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "kv_lora_rank": 32,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "moe_layer_freq": 1,
    "n_group": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 16,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 256,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 256,
}

FP8_QUANTIZATION = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

GLM4_MOE = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "pad_token_id": 0,
    "eos_token_id": [1, 2],
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "partial_rotary_factor": 0.5,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "n_group": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 256,
}

MIMO = {
    "architectures": ["MiMoForCausalLM"],
    "model_type": "mimo",
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 640000,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 256,
}

# DeepSeek-V3.2(-Exp): V3's fields plus the DSA indexer's. index_topk is tiny so a short test sequence is sparse.
DEEPSEEK_V32 = {
    **DEEPSEEK_V3,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "index_head_dim": 16,
    "index_n_heads": 4,
    "index_topk": 4,
}

# LongCat-Flash-Chat's config.json fields (tiny values). The release has no MTP count field and no head_dim:
# transformers' rotary reads head_dim (default 64), which is why qk_rope_head_dim keeps the release's 64.
# zero_expert_num is 0 here: transformers' save_pretrained writes gate/up weights for identity (zero) experts,
# which the hub layout does not have.
LONGCAT_FLASH = {
    "architectures": ["LongcatFlashForCausalLM"],
    "model_type": "longcat_flash",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_method": "MLA",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "expert_ffn_hidden_size": 32,
    "ffn_hidden_size": 128,
    "hidden_size": 64,
    "kv_lora_rank": 32,
    "max_position_embeddings": 4096,
    "mla_scale_kv_lora": True,
    "mla_scale_q_lora": True,
    "moe_topk": 2,
    "n_routed_experts": 4,
    "num_attention_heads": 4,
    "num_layers": 2,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000000.0,
    "routed_scaling_factor": 6.0,
    "torch_dtype": "bfloat16",
    "v_head_dim": 16,
    "vocab_size": 256,
    "zero_expert_num": 0,
    "zero_expert_type": "identity",
}

# Qwen3-Next-80B-A3B's config.json fields (tiny values): no MTP count field (engines assume 1), the hybrid layout
# from full_attention_interval (every 4th layer is full attention), rope_theta / partial_rotary_factor top level.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "decoder_sparse_step": 1,
    "eos_token_id": 1,
    "full_attention_interval": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
    "max_position_embeddings": 4096,
    "mlp_only_layers": [],
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 16,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 256,
}

# Qwen3.5's config.json (Qwen3_5ForConditionalGeneration): the text model nested under text_config with the MTP
# count, rope_parameters with the interleaved M-RoPE sections (sum = rotary dims / 2), and a (tiny) vision tower.
_QWEN3_5_TEXT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "bos_token_id": None,
    "dtype": "bfloat16",
    "eos_token_id": 1,
    "full_attention_interval": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 4096,
    "mlp_only_layers": [],
    "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": None,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [2, 1, 1],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 256,
}
_QWEN3_5_VISION = {
    "deepstack_visual_indexes": [],
    "depth": 1,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "model_type": "qwen3_5",
    "num_heads": 2,
    "num_position_embeddings": 16,
    "out_hidden_size": 64,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
QWEN3_5 = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 250,
    "text_config": _QWEN3_5_TEXT,
    "tie_word_embeddings": False,
    "video_token_id": 251,
    "vision_config": _QWEN3_5_VISION,
    "vision_end_token_id": 253,
    "vision_start_token_id": 252,
}
# Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration): no dense intermediate_size / mlp_only_layers; experts fused on
# the hub (see the `fused_experts` fixture option). 2 * moe_intermediate_size != hidden_size keeps the fused
# gate_up_proj [E, 2I, H] distinguishable from its transpose.
QWEN3_5_MOE = {
    **QWEN3_5,
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        **{k: v for k, v in _QWEN3_5_TEXT.items() if k not in ("intermediate_size", "mlp_only_layers")},
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 16,
    },
    "vision_config": {**_QWEN3_5_VISION, "model_type": "qwen3_5_moe"},
}


def _tied(config: dict[str, Any]) -> dict[str, Any]:
    """The small Qwen3.5 releases: lm_head tied to the embedding (both flags set), no lm_head.weight stored."""
    return _with(config, tie_word_embeddings=True, text_config={**config["text_config"], "tie_word_embeddings": True})


# MiMo-V2-Flash's config.json fields (tiny values, the release's relations kept: swa heads = heads, swa kv heads =
# 2 x kv heads, shared head dims, rope thetas 5e6 / 1e4, partial factor 0.334, which transformers assumes). No MTP
# count field, as on the release (three layers). sliding_window_size < a test sequence so the window matters.
MIMO_V2_FLASH = {
    "architectures": ["MiMoV2FlashForCausalLM"],
    "model_type": "mimo_v2_flash",
    "add_full_attention_sink_bias": False,
    "add_swa_attention_sink_bias": True,
    "attention_bias": False,
    "attention_chunk_size": 128,
    "attention_dropout": 0.0,
    "attention_value_scale": 0.707,
    "bos_token_id": None,
    "eos_token_id": 1,
    "head_dim": 24,
    "hidden_act": "silu",
    "hidden_size": 64,
    "hybrid_layer_pattern": [0, 1, 1, 1],
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "layernorm_epsilon": 1e-05,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "moe_layer_freq": [0, 1, 1, 1],
    "n_group": 1,
    "n_routed_experts": 4,
    "n_shared_experts": None,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "partial_rotary_factor": 0.334,
    "quantization_config": FP8_QUANTIZATION,
    "rope_theta": 5000000,
    "routed_scaling_factor": None,
    "scoring_func": "sigmoid",
    "sliding_window": 4,
    "sliding_window_size": 4,
    "swa_head_dim": 24,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_rope_theta": 10000,
    "swa_v_head_dim": 16,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 256,
}

# ERNIE-4.5-21B-A3B-PT's config.json fields (tiny values): layer 0 dense, MoE from moe_layer_start_index, shared
# experts, tied embeddings (the 21B/0.3B releases; 300B unties them), one MTP layer.
ERNIE4_5_MOE = {
    "architectures": ["Ernie4_5_MoeForCausalLM"],
    "model_type": "ernie4_5_moe",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "moe_capacity": [4, 4, 4],
    "moe_gate": "topk",
    "moe_intermediate_size": 32,
    "moe_k": 2,
    "moe_layer_interval": 1,
    "moe_layer_start_index": 1,
    "moe_num_experts": 4,
    "moe_num_shared_experts": 1,
    "moe_use_aux_free": True,
    "multi_token_pred_lambda": 0.3,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_cache": False,
    "vocab_size": 256,
}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


# name -> fixture row. `trunk`: (transformers model_type, class name) whose save_pretrained writes the trunk.
FIXTURES: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        "spec": "deepseek_v3",
        "config": DEEPSEEK_V3,
        "trunk": ("deepseek_v3", "DeepseekV3ForCausalLM"),
        "store_embed_head": True,
    },
    "deepseek_v3_fp8": {
        "spec": "deepseek_v3",
        "config": _with(DEEPSEEK_V3, quantization_config=FP8_QUANTIZATION),
        "trunk": ("deepseek_v3", "DeepseekV3ForCausalLM"),
        "store_embed_head": True,
        "fp8": True,
    },
    "kimi_k2": {
        "spec": "deepseek_v3",
        "config": _with(DEEPSEEK_V3, num_nextn_predict_layers=0),
        "trunk": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    },
    "glm4_moe": {
        "spec": "glm4_moe",
        "config": GLM4_MOE,
        "trunk": ("glm4_moe", "Glm4MoeForCausalLM"),
        "store_embed_head": True,
    },
    "glm4_6": {
        "spec": "glm4_moe",
        "config": _with(GLM4_MOE, use_qk_norm=False),
        "trunk": ("glm4_moe", "Glm4MoeForCausalLM"),
        "store_embed_head": False,
    },
    "mimo": {"spec": "mimo", "config": MIMO, "trunk": ("qwen2", "Qwen2ForCausalLM")},
    "mimo_v2_flash": {
        "spec": "mimo_v2_flash",
        "config": MIMO_V2_FLASH,
        "trunk": ("mimo_v2_flash", "MiMoV2FlashForCausalLM"),
        "fp8": True,
    },
    "ernie4_5_moe": {
        "spec": "ernie4_5_moe",
        "config": ERNIE4_5_MOE,
        "trunk": ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM"),
    },
    "qwen3_next": {"spec": "qwen3_next", "config": QWEN3_NEXT, "trunk": ("qwen3_next", "Qwen3NextForCausalLM")},
    "qwen3_5": {"spec": "qwen3_5_text", "config": QWEN3_5, "trunk": ("qwen3_5", "Qwen3_5ForConditionalGeneration")},
    "qwen3_5_tied": {
        "spec": "qwen3_5_text",
        "config": _tied(QWEN3_5),
        "trunk": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    },
    # fused_experts: the trunk's experts as the hub stores them (save_pretrained writes per-expert keys)
    "qwen3_5_moe": {
        "spec": "qwen3_5_moe_text",
        "config": QWEN3_5_MOE,
        "trunk": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
        "fused_experts": True,
    },
    "deepseek_v32": {
        "spec": "deepseek_v32",
        "config": DEEPSEEK_V32,
        "trunk": ("deepseek_v32", "DeepseekV32ForCausalLM"),
        "store_embed_head": True,
    },
    "deepseek_v32_fp8": {
        "spec": "deepseek_v32",
        "config": _with(DEEPSEEK_V32, quantization_config=FP8_QUANTIZATION),
        "trunk": ("deepseek_v32", "DeepseekV32ForCausalLM"),
        "store_embed_head": True,
        "fp8": True,
    },
    "longcat_flash": {
        "spec": "longcat_flash",
        "config": LONGCAT_FLASH,
        "trunk": ("longcat_flash", "LongcatFlashForCausalLM"),
        "store_embed_head": True,
    },
}

# Weights that stay bf16 in DeepSeek's FP8 release: embeddings, heads, norms, the router, the MTP projection and
# V3.2's indexer weights_proj (engines load it unquantised).
_NOT_FP8 = re.compile(
    r"(embed_tokens|lm_head|shared_head\.head|norm|mlp\.gate\.|eh_proj|e_score_correction_bias|indexer\.weights_proj)"
)


def _natural(key: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def trunk_tensors(config: dict[str, Any], trunk: tuple[str, str], seed: int) -> dict[str, torch.Tensor]:
    """Trunk weights in the hub layout, as transformers' save_pretrained writes them (bf16)."""
    import transformers
    from transformers import AutoConfig

    cfg_dict = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "quantization_config")}
    cfg = AutoConfig.for_model(trunk[0], **cfg_dict)
    torch.manual_seed(seed)
    model = getattr(transformers, trunk[1])(cfg).to(torch.bfloat16)
    return hub_tensors(model)


def hub_tensors(model: Any) -> dict[str, torch.Tensor]:
    """A transformers model's weights under the hub key names its save_pretrained writes (dtypes as in the model)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
    return tensors


def init_native(module: NativeMtpDraft, seed: int, std: float = 0.05) -> None:
    """Deterministic, non-trivial init: norm weights away from their identity value so norm handling is tested."""
    gen = torch.Generator().manual_seed(seed)
    zero_centered = module.spec.layer.norm == "zero_centered"
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if tensor.dim() == 1 and "norm" in name:
                value = (0.0 if zero_centered else 1.0) + 0.1 * noise
            elif tensor.dim() == 1:
                value = 0.02 * noise
            else:
                fan_in = tensor.shape[-1]
                value = noise * min(std, 1.0 / math.sqrt(fan_in))
            tensor.copy_(value)


def mtp_tensors(
    spec_name: str, config: dict[str, Any], seed: int, store_embed_head: bool, shared: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """MTP layers under the family's real key names (bf16; router bias fp32)."""
    spec = get_spec(spec_name)
    out: dict[str, torch.Tensor] = {}
    for layer in range(spec.num_mtp_layers(config)):
        module = NativeMtpDraft(spec, config, layer)
        init_native(module, seed + 1000 * (layer + 1))
        buffers = {k for k, _ in module.named_buffers()}
        state = {k: v if k in buffers else v.to(torch.bfloat16) for k, v in module.state_dict().items()}
        out.update(native_to_checkpoint(spec, config, layer, state))
        comp = spec.component_keys(config, layer)
        if store_embed_head and "embed" in comp:
            out[comp["embed"]] = shared[spec.key(spec.keys.target_embed, config, layer)].clone()
            head_key = spec.key(spec.keys.target_head, config, layer)
            if "head" in comp:  # LongCat stores only the embedding
                head = shared.get(head_key, shared[spec.key(spec.keys.target_embed, config, layer)])
                out[comp["head"]] = head.clone()
    return out


def write_checkpoint(
    out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], shards: int = 2, decoy: str | None = None
) -> Path:
    """Write config.json and `shards` safetensors shards with an index, keys in natural order.

    decoy: a key prefix whose tensors go into an extra shard filled with garbage bytes (never a valid file); a
    reader that opens it fails, which is how tests prove unneeded shards are never opened."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    keys = sorted(tensors, key=_natural)
    decoy_keys = [k for k in keys if decoy and k.startswith(decoy)]
    keys = [k for k in keys if k not in decoy_keys]
    total = sum(tensors[k].numel() * tensors[k].element_size() for k in keys)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map, buckets, acc = {}, [dict() for _ in range(shards)], 0
    for key in keys:
        size = tensors[key].numel() * tensors[key].element_size()
        idx = min(int(acc * shards / max(total, 1)), shards - 1)
        buckets[idx][key] = tensors[key].contiguous()
        weight_map[key] = names[idx]
        acc += size
    for name, bucket in zip(names, buckets, strict=True):
        save_tensors(out / name, bucket, {"format": "pt"})
    if decoy_keys:
        garbage = torch.Generator().manual_seed(7)
        (out / "model-decoy.safetensors").write_bytes(
            bytes(torch.randint(0, 256, (4096,), generator=garbage, dtype=torch.uint8).tolist())
        )
        weight_map.update({k: "model-decoy.safetensors" for k in decoy_keys})
    index = {
        "metadata": {"total_size": total},
        "weight_map": dict(sorted(weight_map.items(), key=lambda kv: _natural(kv[0]))),
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def quantize_checkpoint(tensors: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """FP8-quantise every 2-D weight DeepSeek ships in FP8, adding `<name>_scale_inv` siblings."""
    out = {}
    for key, tensor in tensors.items():
        if tensor.dim() == 2 and key.endswith(".weight") and not _NOT_FP8.search(key):
            q, scale = quantize_fp8(tensor, block)
            out[key], out[key + "_scale_inv"] = q, scale
        else:
            out[key] = tensor
    return out


def fuse_expert_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` -> the fused 3-D `experts.gate_up_proj` [E, 2I, H]
    (gate rows first) and `experts.down_proj` [E, H, I] that Qwen3.5-MoE's release stores (and transformers'
    save_pretrained splits)."""
    from ..transforms import FuseExperts

    fuse = FuseExperts()
    groups, rest = fuse.group(list(tensors))
    out = {k: tensors[k] for k in rest}
    for g in groups:
        out[g.module_key] = fuse.combine(g, [tensors[k] for k in g.ckpt_keys]).contiguous()
    return out


def build_fixture(
    name: str, out: str | Path, seed: int = 0, shards: int = 2, decoy: str | None = None, **overrides: Any
) -> Path:
    """Write fixture `name` into `out` and return the directory. `overrides` change config.json fields."""
    row = FIXTURES[name]
    config = _with(row["config"], **overrides)
    out = Path(out)
    tensors = trunk_tensors(config, row["trunk"], seed)
    if row.get("fused_experts"):
        tensors = fuse_expert_tensors(tensors)
    tensors.update(mtp_tensors(row["spec"], config, seed, row.get("store_embed_head", False), tensors))
    if row.get("fp8"):
        block = tuple(config["quantization_config"]["weight_block_size"])
        tensors = quantize_checkpoint(tensors, block)  # type: ignore[arg-type]
    return write_checkpoint(out, config, tensors, shards=shards, decoy=decoy)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_char_tokenizer(out: str | Path, vocab_size: int = 256) -> Path:
    """A character-level tokenizer (ids 0-2 special, then printable ASCII) with a ChatML template, so tiny
    fixture targets can run the data, distill and evaluate stages."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {tok: i for i, tok in enumerate(specials + chars[: vocab_size - len(specials)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=" "))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(out))
    return Path(out)


def eagle3_depth(name: str, kind: str = "eagle3") -> dict[str, int]:
    """Overrides giving fixture `name` the 4 trunk layers an EAGLE-3 draft needs (three distinct capturable layers,
    `convert.MIN_EAGLE3_LAYERS`); {} for other kinds or fixtures deep enough already."""
    from ..spec import get_spec

    spec = get_spec(FIXTURES[name]["spec"])
    field = spec.config.num_layers
    config = FIXTURES[name]["config"]
    layers = spec.text_config(config).get(field, 0)
    if kind != "eagle3" or layers >= 4:
        return {}
    if spec.config.text_config:  # nested text config: override the whole section
        return {spec.config.text_config: {**config[spec.config.text_config], field: 4}}  # type: ignore[dict-item]
    return {field: 4}
