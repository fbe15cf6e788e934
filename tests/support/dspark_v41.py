"""DeepSeek-V4.1's checkpoint layout, tiny, written tensor by tensor as vLLM 0.32's loaders read it (no release index
of V4.1 was readable, so every name below is the one a loader maps; paths are vLLM 0.32 (CPU build) `vllm/...`):

- config.json: `model_type: deepseek_v41`, the text model under `text_config` (`dspark_*` keys included) and the
  vision tower under `vision_config`; `quantization_config` at the top with `weight_block_size [32, 32]`,
  `scale_fmt: ue8m0`, `expert_dtype: fp4` (`transformers_utils/configs/deepseek_v41.py` flattens text_config and
  takes `expert_dtype` from quantization_config).
- Trunk, no `model.` prefix (`models/deepseek_v41/nvidia/model.py` `_make_deepseek_v4_weights_mapper`): `embed`,
  `layers.{i}`, `norm`, `head`; no `hc_head` ("v4.1 has no learned hc_head", `DeepseekV4Model`).
- A block: `attn.{wq_a,wkv,wq_b,wo_a,wo_b}` FP8 + `.scale`, `attn.{q_norm,kv_norm}`, `attn.attn_sink`
  (`models/deepseek_v41/attention.py`), `attn_norm`, `ffn_norm`, `hc_{attn,ffn}_{fn,base,scale}` (model.py
  `DeepseekV4DecoderLayer`), `ffn.gate.{weight,bias,bias_vl}` (`models/deepseek_v4/nvidia/model.py` `DeepseekV4MoE`:
  `bias_vl` on every MoE layer when a vision tower is configured), FP4 `ffn.experts.{e}.w{1,2,3}` and FP8
  `ffn.shared_experts.w{1,2,3}`.
- kv / index source layers (`kv_source_layer_ids`, `index_source_layer_ids`): `attn.compressor.{wkv,wgate,norm}`
  (bf16, `compressor.py`: no gate at compress ratio 1), `attn.indexer.{wk,k_norm}` on the kv source,
  `attn.indexer.{wq_b (FP8), weights_proj}` on the index source (`attention.py` `DeepseekV4Indexer`).
- Engram on `engram_layer_ids` (`models/deepseek_v41/common/engram.py`): `engram.embed.weight` F8_E4M3
  [num_embeddings, engram_head_dim] with `engram.embed.scale` e8m0 per row and 32 columns, `engram.wkv` FP8,
  `engram.{q_weight,k_weight}` [hc_mult, hidden]. The release's tables are hundreds of GB: never fetched.
- Vision (`models/deepseek_v4/common/vision.py`, `models/deepseek_v41/nvidia/vl_model.py`): `vision.patch_embed.proj`,
  `vision.blocks.{b}.{norm1,norm2,attn.wqkv,attn.wo,mlp.w1,mlp.w2}`, `vision.norm`, `aligner.w{1,2}`,
  `image_{start,end,newline}`.
- DSpark stages `mtp.{0,1,2}` (`models/deepseek_v41/nvidia/dspark.py`, `_remap_dspark_name` and `load_weights`): each
  a block as above with `dspark_n_routed_experts` routed experts; `mtp.0.main_proj` (FP8, 32 x 32 blocks) and
  `mtp.0.main_norm`; on the last stage `norm`, `markov_head.embed` / `markov_head.head` (the loader renames them
  `markov_w1` / `markov_w2`) and `confidence_head.proj`; no `hc_head`.

Values: FP8 e4m3 with an e8m0 scale per 32 x 32 block (`quant_config.py`: ModelOpt MXFP8 linear method with
`scale_block_size (32, 32)`, whose loader repeats each scale row over 32 weight rows), FP4 e2m1 pairs in int8
(element 2i low nibble) with an e8m0 scale per 32 inputs. Scales are random powers of two, so a reader that used
another block size would read other values. dtypes vLLM does not fix (gate, norms, the Markov and confidence heads)
are bf16, as V4-0731 ships them.

What this module does not do: run anything, or claim the release's shard layout (two shards, natural key order).
"""

from __future__ import annotations

from typing import Any

import torch

E8M0, FP8 = torch.float8_e8m0fnu, torch.float8_e4m3fn
BLOCK = 32


class _Writer:
    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.out: dict[str, torch.Tensor] = {}

    def rnd(self, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(shape, generator=self.gen) * 0.05).to(dtype)

    def e8m0(self, *shape: int) -> torch.Tensor:
        """Powers of two 2^-4 .. 2^3 as e8m0 bytes (127 is 2^0)."""
        return torch.randint(123, 131, shape, generator=self.gen, dtype=torch.uint8).view(E8M0)

    def fp8(self, name: str, rows: int, cols: int) -> None:
        """`name.weight` e4m3 [rows, cols], `name.scale` e8m0 [ceil(rows/32), ceil(cols/32)]."""
        self.out[f"{name}.weight"] = (torch.randn(rows, cols, generator=self.gen) * 8).to(FP8)
        self.out[f"{name}.scale"] = self.e8m0(-(-rows // BLOCK), -(-cols // BLOCK))

    def fp4(self, name: str, rows: int, cols: int) -> None:
        """`name.weight` int8 [rows, cols/2] (two e2m1 codes a byte), `name.scale` e8m0 [rows, cols/32]."""
        self.out[f"{name}.weight"] = torch.randint(-128, 128, (rows, cols // 2), generator=self.gen, dtype=torch.int8)
        self.out[f"{name}.scale"] = self.e8m0(rows, cols // BLOCK)

    def plain(self, name: str, *shape: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.out[name] = self.rnd(*shape, dtype=dtype)


def _block(w: _Writer, p: str, c: dict[str, Any], experts: int) -> None:
    h, hc, inter = c["hidden_size"], c["hc_mult"], c["moe_intermediate_size"]
    heads, d, q, o, g = (c[k] for k in ("num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups"))
    w.fp8(p + "attn.wq_a", q, h)
    w.fp8(p + "attn.wkv", d, h)
    w.fp8(p + "attn.wq_b", heads * d, q)
    w.fp8(p + "attn.wo_a", g * o, heads * d // g)
    w.fp8(p + "attn.wo_b", h, g * o)
    w.plain(p + "attn.q_norm.weight", q)
    w.plain(p + "attn.kv_norm.weight", d)
    w.plain(p + "attn.attn_sink", heads, dtype=torch.float32)
    for norm in ("attn_norm", "ffn_norm"):
        w.plain(f"{p}{norm}.weight", h)
    for mix in ("attn", "ffn"):
        w.plain(f"{p}hc_{mix}_fn", (2 + hc) * hc, hc * h, dtype=torch.float32)
        w.plain(f"{p}hc_{mix}_base", (2 + hc) * hc, dtype=torch.float32)
        w.plain(f"{p}hc_{mix}_scale", 3, dtype=torch.float32)
    w.plain(p + "ffn.gate.weight", experts, h)
    for bias in ("bias", "bias_vl"):
        w.plain(f"{p}ffn.gate.{bias}", experts, dtype=torch.float32)
    for e in range(experts):
        for name, (rows, cols) in (("w1", (inter, h)), ("w2", (h, inter)), ("w3", (inter, h))):
            w.fp4(f"{p}ffn.experts.{e}.{name}", rows, cols)
    shared = inter * c["n_shared_experts"]
    for name, (rows, cols) in (("w1", (shared, h)), ("w2", (h, shared)), ("w3", (shared, h))):
        w.fp8(f"{p}ffn.shared_experts.{name}", rows, cols)


def _sources(w: _Writer, p: str, c: dict[str, Any], layer: int) -> None:
    """The compressor / indexer a kv-source or index-source trunk layer holds."""
    h, d = c["hidden_size"], c["head_dim"]
    if layer in c["kv_source_layer_ids"]:
        w.plain(p + "attn.compressor.wkv.weight", d, h)
        if c["compress_ratios"][layer] > 1:
            w.plain(p + "attn.compressor.wgate.weight", d, h)
        w.plain(p + "attn.compressor.norm.weight", d)
        w.plain(p + "attn.indexer.wk.weight", c["index_head_dim"], d)
        w.plain(p + "attn.indexer.k_norm.weight", c["index_head_dim"])
    if layer in c["index_source_layer_ids"]:
        w.fp8(p + "attn.indexer.wq_b", c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"])
        w.plain(p + "attn.indexer.weights_proj.weight", c["index_n_heads"], h)


def _engram(w: _Writer, p: str, c: dict[str, Any], layer: int) -> None:
    rows = c["engram_num_embeddings"][c["engram_layer_ids"].index(layer)]
    dim, h, hc = c["engram_head_dim"], c["hidden_size"], c["hc_mult"]
    w.out[p + "engram.embed.weight"] = (torch.randn(rows, dim, generator=w.gen) * 8).to(FP8)
    w.out[p + "engram.embed.scale"] = w.e8m0(rows, dim // BLOCK)
    w.fp8(p + "engram.wkv", (hc + 1) * h, (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"] * dim)
    w.plain(p + "engram.q_weight", hc, h)
    w.plain(p + "engram.k_weight", hc, h)


def _vision(w: _Writer, v: dict[str, Any], h: int) -> None:
    vh, vi, patch, down = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["downsample_ratio"]
    w.plain("vision.patch_embed.proj.weight", vh, 3 * patch * patch)
    w.plain("vision.patch_embed.proj.bias", vh)
    for b in range(v["num_hidden_layers"]):
        p = f"vision.blocks.{b}."
        w.plain(p + "norm1.weight", vh)
        w.plain(p + "norm2.weight", vh)
        w.plain(p + "attn.wqkv.weight", 3 * vh, vh)
        w.plain(p + "attn.wqkv.bias", 3 * vh)
        w.plain(p + "attn.wo.weight", vh, vh)
        w.plain(p + "attn.wo.bias", vh)
        w.plain(p + "mlp.w1.weight", 2 * vi, vh)
        w.plain(p + "mlp.w2.weight", vh, vi)
    w.plain("vision.norm.weight", vh)
    w.plain("aligner.w1.weight", h, vh * down * down)
    w.plain("aligner.w1.bias", h)
    w.plain("aligner.w2.weight", h, h)
    w.plain("aligner.w2.bias", h)
    for token in ("image_start", "image_end", "image_newline"):
        w.plain(token, h)


STAGES = 3  # mtp.0..2, as vLLM 0.32 builds them (n_mtp_layers or num_nextn_predict_layers or 3)


def dspark_v41_tensors(config: dict[str, Any], seed: int, row: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the tiny DeepSeek-V4.1 checkpoint of `config` (module docstring)."""
    c, w = config["text_config"], _Writer(seed)
    h, v, rank = c["hidden_size"], c["vocab_size"], c["dspark_markov_rank"]
    w.plain("embed.weight", v, h)
    w.plain("head.weight", v, h)
    w.plain("norm.weight", h)
    for layer in range(c["num_hidden_layers"]):
        p = f"layers.{layer}."
        _block(w, p, c, c["n_routed_experts"])
        _sources(w, p, c, layer)
        if layer in c["engram_layer_ids"]:
            _engram(w, p, c, layer)
    _vision(w, config["vision_config"], h)
    for stage in range(STAGES):
        _block(w, f"mtp.{stage}.", c, c["dspark_n_routed_experts"] or c["n_routed_experts"])
    w.fp8("mtp.0.main_proj", h, len(c["dspark_target_layer_ids"]) * h)
    w.plain("mtp.0.main_norm.weight", h)
    last = f"mtp.{STAGES - 1}."
    w.plain(last + "norm.weight", h)
    w.plain(last + "markov_head.embed.weight", v, rank)
    w.plain(last + "markov_head.head.weight", v, rank)
    w.plain(last + "confidence_head.proj.weight", 1, h + rank)
    return w.out
