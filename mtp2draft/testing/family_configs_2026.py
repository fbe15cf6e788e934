"""config.json of each 2026-generation family as its hub release writes it (real field names, tiny values), for the
fixtures in `fixtures.py`; the 2025 generation is in `family_configs.py`, whose docstring says how these are kept.

What this module does not do: write checkpoints (`fixtures.py`).
"""

from __future__ import annotations

from mtp2draft.testing.family_configs import TINY_ROUTING

# GLM-4.7-Flash's config.json fields in the release's order (tiny values; the release keeps qk_nope + qk_rope =
# v_head_dim, rope_interleave defaulted, first_k_dense_replace 1 and mlp_layer_types absent), one MTP layer.
GLM4_MOE_LITE = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "pad_token_id": 0,
    "eos_token_id": [1, 2],
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "model_type": "glm4_moe_lite",
    "moe_intermediate_size": 32,
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 1.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 24,
    "vocab_size": 256,
}


# DeepSeek-V4-Flash-0731's config.json fields (tiny values): the V4 trunk (MQA head_dim, q/o LoRA, grouped output,
# sliding window, hyper-connections, FP8 with FP4 experts) plus the DSpark fields. The release says
# num_nextn_predict_layers 1 although mtp.0-2 hold three DSpark stages; dspark_target_layer_ids are the last three
# trunk layers (40, 41, 42 of 43 on the release). Here: no compressed or hash-routed layers, so the trunk's layers
# carry no compressor / indexer / tid2eid tensors.
DEEPSEEK_V4_0731 = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "compress_ratios": [0, 0, 0],
    "dspark_block_size": 5,
    "dspark_markov_rank": 8,
    "dspark_noise_token_id": 255,
    "dspark_target_layer_ids": [0, 1, 2],
    "expert_dtype": "fp4",
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 32,
    "hidden_size": 64,
    "index_head_dim": 16,
    "index_n_heads": 4,
    "index_topk": 4,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hash_layers": 0,
    "num_hidden_layers": 3,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 2,
    "o_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },  # fmt: skip
    "rms_norm_eps": 1e-06,
    "sliding_window": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 256,
}


# GLM-5.2's config.json fields (tiny values; names from stored copies of the release's config): MLA + DSA indexer with
# cross-layer top-k sharing (layer i runs its own indexer iff max(i - offset + 1, 0) % freq == 0: full, shared, full,
# shared here), first_k_dense_replace dense layers, index_share_for_mtp_iteration, no stored MTP embed / head.
# index_topk 4 < a test sequence, so the indexer's selection matters.
GLM_MOE_DSA = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "attention_bias": False,
    "dtype": "bfloat16",
    "eos_token_id": [1, 2],
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "index_head_dim": 16,
    "index_n_heads": 4,
    "index_share_for_mtp_iteration": True,
    "index_skip_topk_offset": 1,
    "index_topk": 4,
    "index_topk_freq": 2,
    "indexer_rope_interleave": True,
    "intermediate_size": 128,
    "kv_lora_rank": 32,
    "max_position_embeddings": 4096,
    "model_type": "glm_moe_dsa",
    "moe_intermediate_size": 32,
    "moe_router_dtype": "float32",
    "n_group": 1,
    **TINY_ROUTING,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "q_lora_rank": 48,
    "qk_head_dim": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-05,
    "rope_interleave": True,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "v_head_dim": 24,
    "vocab_size": 256,
}


# Hy3 / HY-V3's config.json fields in the release's order (https://huggingface.co/tencent/Hy3 config.json, stored
# copies cited in tests/data/hub_keys/hy_v3.json; tiny values): GQA with per-head QK-norm, first_k_dense_replace dense
# layers (transformers derives mlp_layer_types itself and does not read the field), sigmoid routing with a
# selection-only expert bias, renormalised (route_norm) and scaled top-k weights, one shared expert.
HY_V3 = {
    "architectures": ["HYV3ForCausalLM"],
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "enable_attention_fp32_softmax": False,
    "enable_lm_head_fp32": True,
    "enable_moe_fp32_combine": False,
    "eod_token_id": 2,
    "eos_token_id": 2,
    "expert_hidden_dim": 32,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.006,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "model_type": "hy_v3",
    "moe_router_enable_expert_bias": True,
    "moe_router_use_sigmoid": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_shared_experts": 1,
    "output_router_logits": True,
    "pad_token_id": 0,
    "qk_norm": True,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 11158840.0, "rope_type": "default"},
    "route_norm": True,
    "router_scaling_factor": 2.826,
    "sep_token_id": 3,
    "tie_word_embeddings": False,
    "transformers_version": "5.6.0",
    "use_cache": True,
    "use_grouped_mm": False,
    "vocab_size": 256,
    "num_nextn_predict_layers": 1,
}


# GLM-OCR's config.json (zai-org/GLM-OCR, stored copies cited in tests/data/hub_keys/glm_ocr.json) with tiny values:
# a vision tower and a GLM-0.5B-style text decoder under text_config (head_dim 128 != hidden / heads on the release,
# sandwich norms, fused gate_up_proj, interleaved M-RoPE), num_nextn_predict_layers in text_config.
GLM_OCR = {
    "architectures": ["GlmOcrForConditionalGeneration"],
    "dtype": "bfloat16",
    "image_end_token_id": 251,
    "image_start_token_id": 250,
    "image_token_id": 254,
    "model_type": "glm_ocr",
    "text_config": {
        "model_type": "glm_ocr_text",
        "pad_token_id": 0,
        "vocab_size": 256,
        "eos_token_id": [0, 2],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 24,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_nextn_predict_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "dtype": "bfloat16",
        "rope_parameters": {
            "rope_type": "default",
            "mrope_section": [4, 4, 4],
            "partial_rotary_factor": 1.0,
            "rope_theta": 10000,
        },
        "tie_word_embeddings": False,
        "use_cache": True,
    },
    "tie_word_embeddings": False,
    "transformers_version": "5.9.0",
    "video_end_token_id": 253,
    "video_start_token_id": 252,
    "video_token_id": 255,
    "vision_config": {
        "model_type": "glm_ocr_vision",
        "hidden_size": 32,
        "depth": 1,
        "num_heads": 2,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "image_size": 16,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "patch_size": 4,
        "rms_norm_eps": 1e-05,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


# EXAONE 4.5's config.json layout (LGAI-EXAONE/EXAONE-4.5-33B: architectures, top-level vocab_size and
# tie_word_embeddings, text_config with the release's model_type exaone4_5_text, sliding_window,
# sliding_window_pattern "LLLG", layer_types and rope_theta, as stored config excerpts show; no stored copy of the
# whole file was found), tiny values. num_nextn_predict_layers sits in text_config, where Megatron-Bridge's
# Exaone45Bridge reads it. Layer 0 is a sliding-window layer, as on the release; sliding_window 4 < a test sequence.
EXAONE4_5 = {
    "architectures": ["Exaone4_5_ForConditionalGeneration"],
    "model_type": "exaone4_5",
    "tie_word_embeddings": False,
    "vocab_size": 256,
    "image_token_id": 254,
    "video_token_id": 255,
    "text_config": {
        "architectures": ["Exaone4ForCausalLM"],
        "model_type": "exaone4_5_text",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "sliding_window": 4,
        "sliding_window_pattern": "LLLG",
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "rope_theta": 1000000,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
    },
    "vision_config": {
        "model_type": "exaone4_5_vision",
        "depth": 1,
        "hidden_size": 32,
        "hidden_act": "silu",
        "intermediate_size": 64,
        "num_heads": 2,
        "num_key_value_heads": 2,
        "in_channels": 3,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 16,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [0],
    },
}


# Nemotron-3 Super's config.json fields (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B; names from stored contract checks
# of the release, cited in tests/data/hub_keys/nemotron_h.json), tiny values: a Mamba-2 / attention / MoE hybrid
# trunk (hybrid_override_pattern: M Mamba, * attention, E MoE), latent MoE (moe_latent_size) with non-gated
# squared-ReLU experts and a shared expert, one MTP layer of two sublayers (mtp_hybrid_override_pattern "*E":
# attention, then MoE).
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "attention_bias": False,
    "bos_token_id": 1,
    "conv_kernel": 4,
    "dtype": "bfloat16",
    "eos_token_id": [2, 11],
    "head_dim": 16,
    "hidden_size": 64,
    "hybrid_override_pattern": "ME*E",
    "intermediate_size": 128,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 16,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 4,
    "max_position_embeddings": 4096,
    "mlp_hidden_act": "relu2",
    "moe_intermediate_size": 32,
    "moe_latent_size": 32,
    "moe_shared_expert_intermediate_size": 64,
    "moe_shared_expert_overlap": False,
    "mtp_hybrid_override_pattern": "*E",
    "n_group": 1,
    "n_groups": 1,
    "n_routed_experts": 8,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "routed_scaling_factor": 5.0,
    "ssm_state_size": 8,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "use_bias": False,
    "use_conv_bias": True,
    "vocab_size": 256,
}


# K-EXAONE's config.json layout (LGAI-EXAONE/K-EXAONE-236B-A23B, fields as a stored architecture brief read them from
# the release's config.json: cited in tests/data/hub_keys/exaone_moe.json), tiny values: 3:1 sliding / full layers
# with per-layer sliding_windows (0 on full layers), layer 0 dense and the rest MoE (is_moe_layer says it again),
# head_dim * heads != hidden_size as on the release, the MTP fields num_nextn_predict_layers, mtp_layer_types and
# mtp_sliding_windows. sliding_window 4 < a test sequence (128 on the release).
EXAONE_MOE = {
    "architectures": ["ExaoneMoeForCausalLM"],
    "model_type": "exaone_moe",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
    "sliding_window": 4,
    "sliding_windows": [4, 4, 4, 0],
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "first_k_dense_replace": 1,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    "is_moe_layer": [False, True, True, True],
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
    "mtp_layer_types": ["full_attention"],
    "mtp_sliding_windows": [0],
}


# Ling-3.0-Flash's config.json layout (inclusionAI Ling 3 / Bailing V3: model_type bailing_hybrid, architectures
# BailingMoeV3ForCausalLM; field names and values from stored copies cited in tests/data/hub_keys/bailing_hybrid.json),
# tiny values: KDA layers with one gated MLA layer per layer_group_size (the last of each group), layer 0 dense
# (first_k_dense_replace), q_lora_rank null (q_proj) as on the release, rope_interleave, head-wise MLA gate.
BAILING_HYBRID = {
    "architectures": ["BailingMoeV3ForCausalLM"],
    "model_type": "bailing_hybrid",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "vocab_size": 256,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "first_k_dense_replace": 1,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "head_dim": 16,
    "gated_attention_proj_granularity_type": "head_wise",
    "rope_theta": 6000000,
    "rotary_dim": 8,
    "rope_interleave": True,
    "short_conv_kernel_size": 4,
    "no_kda_lora": True,
    "kda_safe_gate": True,
    "kda_lower_bound": -5.0,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "n_group": 2,
    "topk_group": 1,
    "layer_group_size": 4,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 0,
    "eos_token_id": 2,
}


# The (tiny) RADIO vision tower both Nemotron omni layouts carry.
RADIO_VISION = {
    "model_type": "radio",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "patch_size": 4,
    "image_size": 16,
    "max_img_size": 32,
    "video_temporal_patch_size": 2,
}


# Nemotron 3.5 Super VL's config.json layout (NemotronH_Omni_Reasoning_V3, model_type nemotron_h_omni; a stored
# Megatron-Bridge test's mock of the release's config, cited in tests/data/hub_keys/nemotron_h_omni.json): the
# released field names llm_config (Nemotron-H, with list-valued layers_block_type / mtp_layers_block_type),
# vision_config (RADIO), img_context_token_id, projector_hidden_size, vit_hidden_size; tiny values, the text model
# being NEMOTRON_H's.
NEMOTRON_H_OMNI = {
    "architectures": ["NemotronH_Omni_Reasoning_V3"],
    "model_type": "nemotron_h_omni",
    "llm_config": {
        "model_type": "nemotron_h",
        **{
            k: v
            for k, v in NEMOTRON_H.items()
            if k not in ("architectures", "model_type", "hybrid_override_pattern", "mtp_hybrid_override_pattern")
        },
        "layers_block_type": ["mamba", "moe", "attention", "moe"],
        "mtp_layers_block_type": ["attention", "moe"],
    },
    "vision_config": RADIO_VISION,
    "projector_hidden_size": 64,
    "vit_hidden_size": 32,
    "img_context_token_id": 250,
    "video_pruning_rate": 0.7,
    "video_temporal_patch_size": 2,
    "downsample_ratio": 0.5,
}


# Nemotron-3 Super Omni's config.json layout as Megatron-Bridge's NemotronOmniBridge reads it (a stored test's mock,
# cited in tests/data/hub_keys/nemotron_h_super_omni.json): architectures NemotronH_Super_Omni_Reasoning_V3, llm_config
# with hybrid_override_pattern / mtp_hybrid_override_pattern strings, vision_config, projector_hidden_size,
# img_context_token_id; tiny values, the text model being NEMOTRON_H's. The mock's sound tower (sound_config,
# parakeet) is left out: transformers 5.24 cannot build its "parakeet" sub-config, and nothing here reads it.
NEMOTRON_H_SUPER_OMNI = {
    "architectures": ["NemotronH_Super_Omni_Reasoning_V3"],
    "llm_config": {
        "model_type": "nemotron_h",
        **{k: v for k, v in NEMOTRON_H.items() if k not in ("architectures", "model_type")},
    },
    "vision_config": {**RADIO_VISION, "separate_video_embedder": True},
    "projector_hidden_size": 64,
    "vit_hidden_size": 32,
    "img_context_token_id": 250,
}
