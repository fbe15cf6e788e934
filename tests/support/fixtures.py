"""Tiny checkpoints in the exact hub layout of each family, for tests, benchmarks and the quick start.

Each fixture is one data file, `tests/data/families/<name>.json`: the family's config.json with its real field names
(tiny values; its `about` says which release it follows and which relations between fields it keeps), the
transformers model class whose trunk weights it saves (`trunk`: transformers writes them in the hub layout, per-expert
MoE keys and all), the spec, and options (FP8, stored embed/head copies). A variant of a family (`base`: another
file's name) takes that row and merges its `changes` into the config. The MTP tensors, which transformers drops on
save, are generated through the native module and written under the family's real key names via the spec's inverse
mapping. Shards: at least two, with `model.safetensors.index.json`.

Adding a family whose block kind exists: one spec file and one data file here (and its row in the family tests'
table, tests/family_table.py).

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
from safetensors.torch import load_file, save_file

from mtp2draft.checkpoint.fp8 import quantize_fp8
from mtp2draft.draft.build import native_draft
from mtp2draft.draft.layout import native_to_checkpoint
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.family.spec import get_spec
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

FAMILIES_DIR = Path(__file__).resolve().parents[1] / "data" / "families"


def with_fields(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of config `base` with `changes` applied (top-level fields replaced whole)."""
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `base` with `changes` merged in, nested sections key by key (a variant that ties the head sets
    tie_word_embeddings in text_config without restating the section); field order stays the base's."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        both_dicts = isinstance(out.get(key), dict) and isinstance(value, dict)
        out[key] = _merged(out[key], value) if both_dicts else copy.deepcopy(value)
    return out


def _load_rows(folder: Path) -> dict[str, dict[str, Any]]:
    """name -> fixture row, from every data file in `folder`. Row keys: `spec` (None: no spec builds it), `config`,
    `trunk` ((transformers model_type, class name) whose save_pretrained writes the trunk), options
    `store_embed_head` (copies inside the MTP layer), `fp8` (quantised as DeepSeek's release), `quantise` (a named
    release quantisation of a `tensors` layout, tests/support/quantised.py), `fused_experts` (the
    trunk's experts as the hub stores them, fused 3-D; save_pretrained writes per-expert keys), `tensors` (a named
    writer of the whole layout, for a checkpoint no spec builds; `listed` writes the row's `keys`: name -> shape),
    `mtp_file` (the MTP tensors go into this file, which the index does not list, as some releases ship them),
    `mtp_fused_experts` (the MTP layer's routed experts fused 3-D, the value the suffix of their keys: "" or
    ".weight", as Hy4-preview releases store them)."""
    files = {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))}
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        if name not in rows:
            data = {k: v for k, v in files[name].items() if k != "about"}
            if "base" in data:
                base, changes = row(data.pop("base")), data.pop("changes", {})
                data = {**base, **data, "config": _merged(base["config"], changes)}
            if "trunk" in data:
                data["trunk"] = tuple(data["trunk"])
            rows[name] = data
        return rows[name]

    for name in files:
        row(name)
    return rows


FIXTURES: dict[str, dict[str, Any]] = _load_rows(FAMILIES_DIR)


def fixture_config(name: str) -> dict[str, Any]:
    """A copy of fixture `name`'s config.json (benchmarks and the targets' training script start from one)."""
    return copy.deepcopy(FIXTURES[name]["config"])


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

    # a deep copy: transformers rewrites the RoPE dict it is given in place, which would reach config.json
    cfg_dict = {
        k: copy.deepcopy(v)
        for k, v in config.items()
        if k not in ("architectures", "model_type", "quantization_config")
    }
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
            elif tensor.dim() == 1 and name.endswith("scale"):  # hyper-connection mixing scales: as trained, near 1
                value = 1.0 + 0.1 * noise
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
        module = native_draft(spec, config, layer)
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


def quantize_checkpoint(
    tensors: dict[str, torch.Tensor], block: tuple[int, int], not_fp8: str = ""
) -> dict[str, torch.Tensor]:
    """FP8-quantise every 2-D weight DeepSeek ships in FP8, adding `<name>_scale_inv` siblings; `not_fp8`: a pattern
    of further keys the release keeps unquantised (GLM-5.3-Flash's kv_b_proj and indexer)."""
    out = {}
    keep = re.compile(not_fp8) if not_fp8 else None
    for key, tensor in tensors.items():
        kept = _NOT_FP8.search(key) or (keep is not None and keep.search(key))
        if tensor.dim() == 2 and key.endswith(".weight") and not kept:
            q, scale = quantize_fp8(tensor, block)
            out[key], out[key + "_scale_inv"] = q, scale
        else:
            out[key] = tensor
    return out


FUSED_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


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


def dspark_tensors(config: dict[str, Any], seed: int, row: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
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


# transformers 5.24's save_pretrained of DeepseekV4ForCausalLM -> the V4 release's names: no `model.` prefix, the
# trunk's embedding / hc_head under their release names, and the attention's kv_norm (which the reverse of its
# conversion mapping writes as `attn.norm`).
_V4_TRUNK_NAMES = (
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.", ""),
    (r"\.attn\.norm\.weight$", ".attn.kv_norm.weight"),
)


def v4_release_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers-saved DeepseekV4ForCausalLM trunk under the release's names (`_V4_TRUNK_NAMES`)."""
    out = {}
    for key, tensor in tensors.items():
        for pattern, name in _V4_TRUNK_NAMES:
            key = re.sub(pattern, name, key)
        out[key] = tensor
    return out


def deepseek_v4_tensors(
    config: dict[str, Any], seed: int, row: dict[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """DeepSeek-V4's checkpoint in the release's names: the trunk as transformers saves it, renamed
    (`v4_release_names`), and the MTP layer through the spec's inverse mapping (bf16, no .scale siblings)."""
    out = v4_release_names(trunk_tensors(config, ("deepseek_v4", "DeepseekV4ForCausalLM"), seed))
    out.update(mtp_tensors("deepseek_v4", config, seed, False, out))
    return out


def listed_tensors(config: dict[str, Any], seed: int, row: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The row's `keys` (name -> shape), bf16 noise: the layout of a family no spec builds, written key by key."""
    gen = torch.Generator().manual_seed(seed)
    return {key: (torch.randn(shape, generator=gen) * 0.05).to(torch.bfloat16) for key, shape in row["keys"].items()}


def _fused_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks: int) -> torch.Tensor:
    """MiMo-V2.5's fused qkv_proj, written from its rule (vLLM 0.34 mimo_v2.py `_shard_fp8_qkv_proj`'s docstring):
    chunk c = [Q_c | K_c | V_c], the heads split evenly over `chunks`."""
    return torch.cat([torch.cat([t.chunk(chunks)[c] for t in (q, k, v)]) for c in range(chunks)])


def _fp8_per_chunk(weight: torch.Tensor, chunks: int, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block FP8 with the scale grid tiled per row chunk: each chunk quantised on its own grid, the grids stacked."""
    pairs = [quantize_fp8(part, block) for part in weight.chunk(chunks)]
    return torch.cat([q for q, _ in pairs]), torch.cat([s for _, s in pairs])


def mimo_v2_tensors(config: dict[str, Any], seed: int, row: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """MiMo-V2.5's checkpoint as released: the trunk as transformers' MiMoV2Flash saves it with each layer's q / k /
    v fused (`_fused_qkv`, chunks = num_key_value_heads), the MTP layers through the spec's inverse mapping (fused
    the same way); block FP8 (qkv scales tiled per chunk) except embeddings, head, norms, router, eh_proj and the MTP
    layers' o_proj, as MiMo-V2.5's MTP header stores them."""
    chunks, block = config["num_key_value_heads"], tuple(config["quantization_config"]["weight_block_size"])
    # RoPE shapes no weight; transformers' mimo_v2_flash config takes a release's legacy rope_scaling (MiMo-V2.5's
    # names the default RoPE) as its per-layer-type rope_parameters and fails (the product drops it: hf_config)
    trunk_config = {k: v for k, v in config.items() if k != "rope_scaling"}
    out = trunk_tensors(trunk_config, ("mimo_v2_flash", "MiMoV2FlashForCausalLM"), seed)
    for prefix in sorted({k[: -len("q_proj.weight")] for k in out if k.endswith("self_attn.q_proj.weight")}):
        q, k, v = (out.pop(f"{prefix}{p}_proj.weight") for p in "qkv")
        out[f"{prefix}qkv_proj.weight"] = _fused_qkv(q, k, v, chunks)
    out.update(mtp_tensors("mimo_v2", config, seed, False, out))
    stored = {}
    for key, tensor in out.items():
        bf16 = _NOT_FP8.search(key) or tensor.dim() != 2 or (key.startswith("model.mtp.") and "o_proj" in key)
        if bf16:
            stored[key] = tensor
        elif key.endswith("qkv_proj.weight"):
            stored[key], stored[key + "_scale_inv"] = _fp8_per_chunk(tensor.float(), chunks, block)  # type: ignore[arg-type]
        else:
            stored[key], stored[key + "_scale_inv"] = quantize_fp8(tensor.float(), block)  # type: ignore[arg-type]
    return stored


def _dspark_v41(config: dict[str, Any], seed: int, row: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    from support.dspark_v41 import dspark_v41_tensors  # its own module: DeepSeek-V4.1's layout, sources cited there

    return dspark_v41_tensors(config, seed, row)


_TENSOR_WRITERS = {
    "dspark": dspark_tensors,
    "dspark_v41": _dspark_v41,
    "deepseek_v4": deepseek_v4_tensors,
    "listed": listed_tensors,
    "mimo_v2": mimo_v2_tensors,
}


def build_fixture(
    name: str,
    out: str | Path,
    seed: int = 0,
    shards: int = 2,
    decoy: str | None = None,
    config: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """Write fixture `name` into `out` and return the directory. `overrides` change config.json fields; `config`
    replaces the row's config.json whole (a release's own, tests/support/releases.py), the row still choosing how
    the hub layout is written (trunk class, FP8, stored embed / head)."""
    row = FIXTURES[name]
    config = with_fields(row["config"] if config is None else config, **overrides)
    out = Path(out)
    if row.get("tensors"):
        tensors = _TENSOR_WRITERS[row["tensors"]](config, seed, row)
        if row.get("quantise"):  # a release's own quantisation, by its rule (tests/support/quantised.py)
            from support.quantised import RELEASE_QUANTISERS

            tensors = RELEASE_QUANTISERS[row["quantise"]](tensors)
        if row.get("unindexed"):  # (file, key prefix): tensors kept in a file the index does not list
            file, prefix = row["unindexed"]
            apart = {k: tensors.pop(k) for k in [k for k in tensors if k.startswith(prefix)]}
            write_checkpoint(out, config, tensors, shards=shards, decoy=decoy)
            save_tensors(out / file, apart, {"format": "pt"})
            return out
        return write_checkpoint(out, config, tensors, shards=shards, decoy=decoy)
    tensors = trunk_tensors(config, row["trunk"], seed)
    if row.get("fused_experts"):
        tensors = fuse_expert_tensors(tensors)
    mtp = mtp_tensors(row["spec"], config, seed, row.get("store_embed_head", False), tensors)
    if "mtp_fused_experts" in row:  # the same weights, the experts fused: [E, 2I, H] and [E, H, I]
        suffix = row["mtp_fused_experts"]
        mtp = {k + suffix if k.endswith(FUSED_EXPERTS) else k: v for k, v in fuse_expert_tensors(mtp).items()}
    if row.get("mtp_file"):  # outside the index: model_mtp.safetensors beside the indexed shards
        write_checkpoint(out, config, tensors, shards=shards, decoy=decoy)
        save_tensors(out / row["mtp_file"], {k: v.contiguous() for k, v in mtp.items()}, {"format": "pt"})
        return out
    tensors.update(mtp)
    if row.get("fp8"):
        block = tuple(config["quantization_config"]["weight_block_size"])
        tensors = quantize_checkpoint(tensors, block, row.get("not_fp8", ""))  # type: ignore[arg-type]
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


def perturb_draft(draft: Path, seed: int = 1) -> dict[str, torch.Tensor]:
    """Move every floating tensor of `draft`'s model.safetensors by a few % (x (1 + 0.05 N(0, 1)), in place): a
    stand-in for a fine-tuned layer. Returns the moved tensors."""
    gen = torch.Generator().manual_seed(seed)
    moved = {
        k: (v.float() * (1 + 0.05 * torch.randn(v.shape, generator=gen))).to(v.dtype) if v.is_floating_point() else v
        for k, v in load_file(str(draft / "model.safetensors")).items()
    }
    save_file(moved, str(draft / "model.safetensors"), {"format": "pt"})
    return moved
