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

from ..checkpoint import quantize_fp8
from ..convert import native_to_checkpoint
from ..draft import NativeMtpDraft
from ..io import save_tensors, write_json
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
}

# Weights that stay bf16 in DeepSeek's FP8 release: embeddings, heads, norms, the router and the MTP projection.
_NOT_FP8 = re.compile(r"(embed_tokens|lm_head|shared_head\.head|norm|mlp\.gate\.|eh_proj|e_score_correction_bias)")


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
            out[comp["head"]] = shared.get(head_key, shared[spec.key(spec.keys.target_embed, config, layer)]).clone()
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


def build_fixture(
    name: str, out: str | Path, seed: int = 0, shards: int = 2, decoy: str | None = None, **overrides: Any
) -> Path:
    """Write fixture `name` into `out` and return the directory. `overrides` change config.json fields."""
    row = FIXTURES[name]
    config = _with(row["config"], **overrides)
    out = Path(out)
    tensors = trunk_tensors(config, row["trunk"], seed)
    tensors.update(mtp_tensors(row["spec"], config, seed, row.get("store_embed_head", False), tensors))
    if row.get("fp8"):
        block = tuple(config["quantization_config"]["weight_block_size"])
        tensors = quantize_checkpoint(tensors, block)  # type: ignore[arg-type]
    return write_checkpoint(out, config, tensors, shards=shards, decoy=decoy)
