"""config.json of each 2025-generation family (the 2026 one: `family_configs_2026.py`) as its hub release writes it (real field names, tiny values), for the fixtures in
`fixtures.py`, the benchmarks and the training script of the bundled targets. Each dict says, where it matters, which
release it follows and which relations between fields it keeps.

What this module does not do: write checkpoints (`fixtures.py`).
"""

from __future__ import annotations

import copy
from typing import Any

# The routed-MoE fields the DeepSeek-style families (DeepSeek-V3, GLM-4.5, GLM-5) keep in one alphabetical run, at
# the same tiny sizes: splatted where they sort, so config.json keeps its order.
TINY_ROUTING = {
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
}

# The last fields of DeepSeek-V3's config.json (alphabetical), which MiMo-V2-Flash's config (built on DeepSeek-V3's
# MoE) shares value for value at these tiny sizes.
_DEEPSEEK_TAIL = {
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 256,
}

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
    **TINY_ROUTING,
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
    **_DEEPSEEK_TAIL,
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
    **TINY_ROUTING,
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

# Fields Qwen3.5 keeps from Qwen3-Next (the same hybrid layout: every 4th layer full attention, the others Gated
# DeltaNet linear attention), at the same tiny sizes; splatted where they sort, so config.json keeps its order.
_QWEN_HYBRID_SIZES = {
    "full_attention_interval": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
}
_QWEN_LINEAR_ATTENTION = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 16,
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
    **_QWEN_HYBRID_SIZES,
    **_QWEN_LINEAR_ATTENTION,
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
    **_QWEN_HYBRID_SIZES,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    **_QWEN_LINEAR_ATTENTION,
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


def tied(config: dict[str, Any]) -> dict[str, Any]:
    """The small Qwen3.5 releases: lm_head tied to the embedding (both flags set), no lm_head.weight stored."""
    return with_fields(
        config, tie_word_embeddings=True, text_config={**config["text_config"], "tie_word_embeddings": True}
    )


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
    **_DEEPSEEK_TAIL,
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


def with_fields(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of config `base` with `changes` applied."""
    out = copy.deepcopy(base)
    out.update(changes)
    return out
