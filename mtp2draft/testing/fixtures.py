"""Tiny checkpoints in the exact hub layout of each family, for tests, benchmarks and the quick start.

Each fixture is a row of data in `FIXTURES`: the family's config.json with its real field names (tiny values, from
`family_configs.py`), the transformers model class whose trunk weights it saves (transformers writes them in the hub
layout: per-expert MoE keys and all), and options (FP8, stored embed/head copies, number of MTP layers). The MTP tensors, which transformers
drops on save, are generated through the native module and written under the family's real key names via the spec's
inverse mapping. Shards: at least two, with `model.safetensors.index.json`.

Adding a family whose block kind exists: one spec file and one row here.

What this module does not do: train anything (see scripts/train_target.py) or write tokenizers.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mtp2draft.checkpoint.fp8 import quantize_fp8
from mtp2draft.draft.layout import native_to_checkpoint
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.family.spec import get_spec
from mtp2draft.io import save_tensors, write_json
from mtp2draft.testing.family_configs import (
    DEEPSEEK_V3,
    DEEPSEEK_V32,
    ERNIE4_5_MOE,
    FP8_QUANTIZATION,
    GLM4_MOE,
    LONGCAT_FLASH,
    MIMO,
    MIMO_V2_FLASH,
    QWEN3_5,
    QWEN3_5_MOE,
    QWEN3_NEXT,
    tied,
    with_fields,
)
from mtp2draft.testing.family_configs_2026 import (
    BAILING_HYBRID,
    DEEPSEEK_V4_0731,
    EXAONE4_5,
    EXAONE_MOE,
    GLM4_MOE_LITE,
    GLM_MOE_DSA,
    GLM_OCR,
    HY_V3,
    NEMOTRON_H,
    NEMOTRON_H_OMNI,
    NEMOTRON_H_SUPER_OMNI,
)


def _row(spec: str, config: dict[str, Any], trunk: tuple[str, str], **options: Any) -> dict[str, Any]:
    return {"spec": spec, "config": config, "trunk": trunk, **options}


def _fp8(row: dict[str, Any]) -> dict[str, Any]:
    """The FP8 block release of a fixture (DeepSeek's layout: `quantization_config`, `_scale_inv` siblings)."""
    return {**row, "config": with_fields(row["config"], quantization_config=FP8_QUANTIZATION), "fp8": True}


_V3 = ("deepseek_v3", "DeepseekV3ForCausalLM")
_V32 = ("deepseek_v32", "DeepseekV32ForCausalLM")
_GLM = ("glm4_moe", "Glm4MoeForCausalLM")
_QWEN3_5 = ("qwen3_5", "Qwen3_5ForConditionalGeneration")

# name -> fixture row. `trunk`: (transformers model_type, class name) whose save_pretrained writes the trunk.
# Options: `store_embed_head` (copies inside the MTP layer), `fp8` (quantised as DeepSeek's release), `fused_experts`
# (the trunk's experts as the hub stores them, fused 3-D; save_pretrained writes per-expert keys).
FIXTURES: dict[str, dict[str, Any]] = {
    "deepseek_v3": _row("deepseek_v3", DEEPSEEK_V3, _V3, store_embed_head=True),
    "kimi_k2": _row("deepseek_v3", with_fields(DEEPSEEK_V3, num_nextn_predict_layers=0), _V3),
    "glm4_moe": _row("glm4_moe", GLM4_MOE, _GLM, store_embed_head=True),
    "glm4_6": _row("glm4_moe", with_fields(GLM4_MOE, use_qk_norm=False), _GLM, store_embed_head=False),
    "mimo": _row("mimo", MIMO, ("qwen2", "Qwen2ForCausalLM")),
    "mimo_v2_flash": _row("mimo_v2_flash", MIMO_V2_FLASH, ("mimo_v2_flash", "MiMoV2FlashForCausalLM"), fp8=True),
    "ernie4_5_moe": _row("ernie4_5_moe", ERNIE4_5_MOE, ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM")),
    "qwen3_next": _row("qwen3_next", QWEN3_NEXT, ("qwen3_next", "Qwen3NextForCausalLM")),
    "qwen3_5": _row("qwen3_5_text", QWEN3_5, _QWEN3_5),
    "qwen3_5_tied": _row("qwen3_5_text", tied(QWEN3_5), _QWEN3_5),
    "qwen3_5_moe": _row(
        "qwen3_5_moe_text", QWEN3_5_MOE, ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"), fused_experts=True
    ),
    "deepseek_v32": _row("deepseek_v32", DEEPSEEK_V32, _V32, store_embed_head=True),
    "longcat_flash": _row(
        "longcat_flash", LONGCAT_FLASH, ("longcat_flash", "LongcatFlashForCausalLM"), store_embed_head=True
    ),
    "glm4_moe_lite": _row(
        "glm4_moe_lite", GLM4_MOE_LITE, ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"), store_embed_head=True
    ),
    "glm_moe_dsa": _row("glm_moe_dsa", GLM_MOE_DSA, ("glm_moe_dsa", "GlmMoeDsaForCausalLM")),
    "hy_v3": _row("hy_v3", HY_V3, ("hy_v3", "HYV3ForCausalLM")),
    "glm_ocr": _row("glm_ocr", GLM_OCR, ("glm_ocr", "GlmOcrForConditionalGeneration"), store_embed_head=True),
    "exaone4_5": _row("exaone4_5", EXAONE4_5, ("exaone4_5", "Exaone4_5_ForConditionalGeneration")),
    "nemotron_h": _row("nemotron_h", NEMOTRON_H, ("nemotron_h", "NemotronHForCausalLM")),
    "exaone_moe": _row("exaone_moe", EXAONE_MOE, ("exaone_moe", "ExaoneMoeForCausalLM")),
    "bailing_hybrid": _row("bailing_hybrid", BAILING_HYBRID, ("bailing_hybrid", "BailingHybridForCausalLM")),
    "nemotron_h_omni": _row("nemotron_h_omni", NEMOTRON_H_OMNI, ("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3")),
    # the trunk as transformers' nemotron_h_omni class writes it (language_model.*, vision_model.*, mlp1.*)
    "nemotron_h_super_omni": _row(
        "nemotron_h_super_omni", NEMOTRON_H_SUPER_OMNI, ("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3")
    ),
}
FIXTURES["deepseek_v3_fp8"] = _fp8(FIXTURES["deepseek_v3"])
# Not an MTP checkpoint: DeepSeek-V4-0731's DSpark block drafter under mtp.*, written from its key list (no spec
# builds it; every command refuses it). `tensors` rows write their own layout.
FIXTURES["deepseek_v4_0731_dspark"] = {"spec": None, "config": DEEPSEEK_V4_0731, "tensors": "dspark"}
FIXTURES["deepseek_v32_fp8"] = _fp8(FIXTURES["deepseek_v32"])
FIXTURES["glm_moe_dsa_fp8"] = _fp8(FIXTURES["glm_moe_dsa"])

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
    from mtp2draft.family.transforms import FuseExperts

    fuse = FuseExperts()
    groups, rest = fuse.group(list(tensors))
    out = {k: tensors[k] for k in rest}
    for g in groups:
        out[g.module_key] = fuse.combine(g, [tensors[k] for k in g.ckpt_keys]).contiguous()
    return out


def _v4_block(prefix: str, config: dict[str, Any], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One DeepSeek-V4 decoder block under `prefix` in the release's names (vLLM 0.33 deepseek_v4 loaders): MQA with
    q / o LoRA and grouped output, sink logits, hyper-connection mixes (fp32), router with bias, FP4 experts (int8
    pairs + E8M0 scales per 32) and an FP8 shared expert (E8M0 block scales). Shapes follow the roles."""
    h, hc, i = config["hidden_size"], config["hc_mult"], config["moe_intermediate_size"]
    heads, d, q, o, g = (
        config[k] for k in ("num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups")
    )
    e8m0, fp8 = torch.float8_e8m0fnu, torch.float8_e4m3fn

    def rnd(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * 0.05).to(dtype)

    def quant(name: str, rows: int, cols: int) -> dict[str, torch.Tensor]:
        scale = torch.ones(-(-rows // 128), -(-cols // 128)).to(e8m0)
        return {f"{prefix}{name}.weight": rnd(rows, cols, dtype=torch.float32).to(fp8), f"{prefix}{name}.scale": scale}

    out = {f"{prefix}{n}.weight": torch.ones(h, dtype=torch.bfloat16) for n in ("attn_norm", "ffn_norm")}
    out.update(quant("attn.wq_a", q, h) | quant("attn.wq_b", heads * d, q) | quant("attn.wkv", d, h))
    out.update(quant("attn.wo_a", g * o, heads * d // g) | quant("attn.wo_b", h, g * o))
    out[f"{prefix}attn.q_norm.weight"] = torch.ones(q, dtype=torch.bfloat16)
    out[f"{prefix}attn.kv_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
    out[f"{prefix}attn.attn_sink"] = rnd(heads, dtype=torch.float32)
    for mix in ("attn", "ffn"):
        out[f"{prefix}hc_{mix}_fn"] = rnd((2 + hc) * hc, hc * h, dtype=torch.float32)
        out[f"{prefix}hc_{mix}_base"] = rnd((2 + hc) * hc, dtype=torch.float32)
        out[f"{prefix}hc_{mix}_scale"] = torch.ones(3)
    out[f"{prefix}ffn.gate.weight"] = rnd(config["n_routed_experts"], h)
    out[f"{prefix}ffn.gate.bias"] = torch.zeros(config["n_routed_experts"])
    for e in range(config["n_routed_experts"]):
        for w, (rows, cols) in (("w1", (i, h)), ("w2", (h, i)), ("w3", (i, h))):
            key = f"{prefix}ffn.experts.{e}.{w}"
            out[key + ".weight"] = torch.randint(-128, 128, (rows, cols // 2), generator=gen, dtype=torch.int8)
            out[key + ".scale"] = torch.ones(rows, cols // 32).to(e8m0)
    for w, (rows, cols) in (("w1", (i, h)), ("w2", (h, i)), ("w3", (i, h))):
        out.update(quant(f"ffn.shared_experts.{w}", rows, cols))
    return out


def dspark_tensors(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """DeepSeek-V4-0731's checkpoint: the trunk (no `model.` prefix: embed, layers.{i}, norm, hc_head_*, head) and
    three DSpark stages mtp.{0,1,2}: decoder blocks as the trunk's, mtp.0.main_proj / main_norm (fusing the three
    target layers), and on the last stage the head stack: norm, hc_head_*, markov_head.markov_w{1,2},
    confidence_head.proj (vLLM 0.33 deepseek_v4/nvidia/dspark.py, _remap_dspark_name). No enorm / hnorm / e_proj /
    h_proj anywhere."""
    gen = torch.Generator().manual_seed(seed)
    h, hc, v, rank = (config[k] for k in ("hidden_size", "hc_mult", "vocab_size", "dspark_markov_rank"))
    out: dict[str, torch.Tensor] = {
        "embed.weight": torch.randn(v, h, generator=gen).to(torch.bfloat16),
        "head.weight": torch.randn(v, h, generator=gen).to(torch.bfloat16),
        "norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    for owner in ("", "mtp.2."):
        out[f"{owner}hc_head_fn"] = torch.randn(hc, hc * h, generator=gen)
        out[f"{owner}hc_head_base"] = torch.zeros(hc)
        out[f"{owner}hc_head_scale"] = torch.ones(1)
    for layer in range(config["num_hidden_layers"]):
        out.update(_v4_block(f"layers.{layer}.", config, gen))
    stages = 3  # DSpark stages on the release, whatever num_nextn_predict_layers says
    for stage in range(stages):
        out.update(_v4_block(f"mtp.{stage}.", config, gen))
    fused = len(config["dspark_target_layer_ids"]) * h
    out["mtp.0.main_proj.weight"] = torch.randn(h, fused, generator=gen).to(torch.float8_e4m3fn)
    out["mtp.0.main_proj.scale"] = torch.ones(1, -(-fused // 128)).to(torch.float8_e8m0fnu)
    out["mtp.0.main_norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out["mtp.2.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    for w in ("markov_w1", "markov_w2"):
        out[f"mtp.2.markov_head.{w}.weight"] = torch.randn(v, rank, generator=gen).to(torch.bfloat16)
    out["mtp.2.confidence_head.proj.weight"] = torch.randn(1, h + rank, generator=gen).to(torch.bfloat16)
    return out


_TENSOR_WRITERS = {"dspark": dspark_tensors}


def build_fixture(
    name: str, out: str | Path, seed: int = 0, shards: int = 2, decoy: str | None = None, **overrides: Any
) -> Path:
    """Write fixture `name` into `out` and return the directory. `overrides` change config.json fields."""
    row = FIXTURES[name]
    config = with_fields(row["config"], **overrides)
    out = Path(out)
    if row.get("tensors"):
        return write_checkpoint(out, config, _TENSOR_WRITERS[row["tensors"]](config, seed), shards=shards, decoy=decoy)
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
    spec = get_spec(FIXTURES[name]["spec"])
    field = spec.config.num_layers
    config = FIXTURES[name]["config"]
    layers = spec.text_config(config).get(field, 0)
    if kind != "eagle3" or layers >= 4:
        return {}
    if spec.config.text_config:  # nested text config: override the whole section
        return {spec.config.text_config: {**config[spec.config.text_config], field: 4}}  # type: ignore[dict-item]
    return {field: 4}
