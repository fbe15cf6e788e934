"""The cost model: what one decode forward of a target or a draft reads and computes, from its config.json, and how
long it takes on an accelerator.

A forward of `batch` sequences, each feeding `tokens` new tokens at `context` tokens of history, on `tp` devices:
- weight bytes read per device: every dense weight (attention, dense MLPs, shared experts, router, the projection of
  an MTP layer, lm_head) once, plus, per MoE layer, the routed experts the forward touches: with N routed experts,
  top-k routing and n = batch x tokens tokens, the expected number of distinct experts is N (1 - (1 - k/N)^n)
  (uniform, independent routing: real routers are skewed, so this is an upper estimate of the bytes);
- KV bytes read per device: per full-attention layer and sequence, context x (MLA: kv_lora_rank + qk_rope_head_dim
  latent elements, replicated on every TP rank; GQA: 2 x kv heads x head_dim, split over min(tp, kv heads) ranks;
  DeepSeek-V4's one key=value head: head_dim, over the whole context, an upper estimate for its windowed layers);
  a linear-attention (Gated DeltaNet) layer reads and writes its recurrent state instead (fp32, independent of
  context);
- FLOPs per device: 2 x the parameters each token uses (its top-k experts, not all of them) plus attention over the
  context, divided by tp.

Time of a forward = max(bytes / HBM bandwidth, FLOPs / tensor peak) + LAYER_LATENCY_S x its decoder layers.
LAYER_LATENCY_S is the model's only fitted constant, fit once (`fit_layer_latency`) from published
*non-speculative* decode figures (`published.py`) and never changed per case. It stands for everything a roofline
does not see: kernel launch gaps and floors, small-GEMM inefficiency, TP all-reduce latency, engine work between
kernels. It is charged per decoder layer, not per forward, because published speedups rule a per-forward constant
out: SGLang's 1.76x for DeepSeek-V3 runs two one-layer draft forwards per step, and if each paid the fixed cost of a
61-layer target forward (about 95 % of its 23 ms), a step would cost about 2.9 target forwards for 1.9 tokens.

What this module does not do: read acceptance (`model.py`), model interconnect bandwidth, expert parallelism,
prefill, quantised KV caches (pass `kv_bytes`), or any kernel's real efficiency beyond the one constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtp2draft.dtypes import CONFIG_DTYPE_BYTES
from mtp2draft.errors import DataError, OptionError
from mtp2draft.speed.accelerators import Accelerator

# Fitted once by `fit_layer_latency()` from the non-speculative figures in published.PUBLISHED_CASES (seconds per
# decoder layer per forward). tests/test_speed.py re-runs the fit and fails if this value is not what it gives.
LAYER_LATENCY_S = 3.30e-4

STATE_BYTES = 4  # Gated DeltaNet recurrent state is kept in fp32 (Qwen3-Next / Qwen3.5 `mamba_ssm_dtype`)
KV_BYTES = 2  # bf16 KV cache


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: a multimodal config's `text_config` over its top level (Qwen3.5 nests them)."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, Mapping) else dict(config)


@dataclass(frozen=True)
class LayerCost:
    """One decoder layer. Bytes are whole-model (before TP), per forward; per-token and per-context quantities are
    per sequence."""

    kind: str  # "mla", "gqa" or "linear" attention, with "+moe" when its MLP is routed
    dense_bytes: float  # weights every forward reads whatever the routing
    expert_bytes: float = 0.0  # one routed expert
    n_routed: int = 0
    top_k: int = 0
    kv_bytes_per_context_token: float = 0.0
    kv_heads: int = 0  # KV heads TP splits the cache over; 0: one latent every rank holds whole (MLA)
    state_bytes: float = 0.0  # recurrent state read + written per sequence per forward
    flops_per_token: float = 0.0  # 2 x parameters each token uses
    attention_flops_per_context_token: float = 0.0


@dataclass(frozen=True)
class ModelCost:
    """What a forward of a model reads and computes: its decoder layers plus the lm_head (and an MTP projection,
    counted in the layer)."""

    name: str
    layers: tuple[LayerCost, ...]
    head_bytes: float
    head_flops_per_token: float
    weight_bytes_per_param: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def weight_bytes(self) -> float:
        """All weights (every expert): what the model occupies, for a memory check."""
        return self.head_bytes + sum(layer.dense_bytes + layer.expert_bytes * layer.n_routed for layer in self.layers)


@dataclass(frozen=True)
class ForwardTime:
    """One forward's time and what it is made of (per device)."""

    seconds: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_seconds: float
    compute_seconds: float
    fixed_seconds: float


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of `keys` the config has, a whole number (>= 1 for a required size, >= 0 for a count with a
    default): a size given as "256", 256.5, true or -1 is refused, not predicted from."""
    least = 1 if default is None else 0
    for key in keys:
        if key not in cfg or cfg[key] is None:
            continue
        value = cfg[key]
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole or value < least:
            raise DataError(f"{key} must be a whole number >= {least}, got {value!r}: cannot build its cost model")
        return int(value)
    if default is None:
        raise DataError(f"has none of {', '.join(keys)}: cannot build its cost model")
    return default


def _dtype_bytes(cfg: Mapping[str, Any]) -> float:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return CONFIG_DTYPE_BYTES.get(name, 2)


def _weight_bytes(cfg: Mapping[str, Any]) -> float:
    """Bytes per parameter of the decoder layers' linear weights: 1 for FP8 checkpoints, else the config's dtype."""
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method") or "").lower()
    if method == "fp8" or str(quant.get("fmt", "")).startswith("e4m3"):
        return 1.0
    return _dtype_bytes(cfg)


def _layer_kinds(cfg: Mapping[str, Any], n: int) -> list[str]:
    """'linear' or 'full' per layer: `layer_types`, else every `full_attention_interval`-th layer, else all full."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return ["linear" if t == "linear_attention" else "full" for t in types]
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 1 and "linear_num_value_heads" in cfg:
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n)]
    return ["full"] * n


def _is_moe_layer(cfg: Mapping[str, Any], i: int) -> bool:
    if _int(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) == 0:
        return False
    if i < _int(cfg, "first_k_dense_replace", default=0) or i in (cfg.get("mlp_only_layers") or []):
        return False
    step = _int(cfg, "moe_layer_freq", "decoder_sparse_step", default=1) or 1
    return i % step == 0


def _attention(cfg: Mapping[str, Any], kind: str) -> tuple[str, float, float, int, float, float]:
    """(name, params, KV bytes per context token, KV heads, state bytes, attention FLOPs per context token)."""
    h = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    if kind == "linear":
        nk, nv = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
        dk, dv = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
        conv = _int(cfg, "linear_conv_kernel_dim", default=4)
        params = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + (2 * nk * dk + nv * dv) * conv + nv * dv * h
        return "linear", params, 0.0, 0, 2.0 * nv * dk * dv * STATE_BYTES, 0.0
    if cfg.get("kv_lora_rank"):
        rank, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
        nope, v = _int(cfg, "qk_nope_head_dim"), _int(cfg, "v_head_dim")
        q_rank = _int(cfg, "q_lora_rank", default=0)
        q = h * q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
        params = q + h * (rank + rope) + rank * heads * (nope + v) + heads * v * h
        # absorbed MLA decode: scores against the latent (rank + rope) and values from it (rank), per head
        return "mla", params, (rank + rope) * KV_BYTES, 0, 0.0, 2.0 * heads * (2 * rank + rope)
    kv = _int(cfg, "num_key_value_heads", default=heads)
    hd = _int(cfg, "head_dim", default=h // heads)
    if cfg.get("o_lora_rank"):
        # low-rank q (h -> q_lora_rank -> heads x hd), one shared key=value projection per kv head, and a grouped
        # low-rank output (o_groups groups of heads x hd / g -> o_lora_rank, then g x o_lora_rank -> h): DeepSeek-V4.
        # Its KV (one head, key = value) is counted over the whole context: an upper estimate for its sliding-window
        # and compressed layers.
        q_rank, o_rank, groups = _int(cfg, "q_lora_rank"), _int(cfg, "o_lora_rank"), _int(cfg, "o_groups", default=1)
        params = h * q_rank + q_rank * heads * hd + h * kv * hd + heads * hd * o_rank + groups * o_rank * h
        return "gqa", params, 1.0 * kv * hd * KV_BYTES, kv, 0.0, 4.0 * heads * hd
    gate = 2 if cfg.get("attn_output_gate") else 1
    params = h * heads * hd * gate + 2 * h * kv * hd + heads * hd * h
    return "gqa", params, 2.0 * kv * hd * KV_BYTES, kv, 0.0, 4.0 * heads * hd


def _layer(cfg: Mapping[str, Any], kind: str, moe: bool, extra_params: float = 0.0) -> LayerCost:
    """One decoder layer of `cfg` (`extra_params`: an MTP layer's input projection, read as a dense weight)."""
    h = _int(cfg, "hidden_size")
    wb = _weight_bytes(cfg)
    name, attn, kv, kv_heads, state, attn_flops = _attention(cfg, kind)
    if moe:
        n = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts")
        k = _int(cfg, "num_experts_per_tok")
        inter = _int(cfg, "moe_intermediate_size", "intermediate_size")
        expert = 3.0 * h * inter
        shared = 3.0 * h * inter * _int(cfg, "n_shared_experts", default=0)
        shared += 3.0 * h * _int(cfg, "shared_expert_intermediate_size", default=0)
        dense = attn + shared + h * n + extra_params  # the router reads n x h
        return LayerCost(
            kind=name + "+moe",
            dense_bytes=dense * wb,
            expert_bytes=expert * wb,
            n_routed=n,
            top_k=k,
            kv_bytes_per_context_token=kv,
            kv_heads=kv_heads,
            state_bytes=state,
            flops_per_token=2.0 * (dense + k * expert),
            attention_flops_per_context_token=attn_flops,
        )
    dense = attn + 3.0 * h * _int(cfg, "intermediate_size") + extra_params
    return LayerCost(
        kind=name,
        dense_bytes=dense * wb,
        kv_bytes_per_context_token=kv,
        kv_heads=kv_heads,
        state_bytes=state,
        flops_per_token=2.0 * dense,
        attention_flops_per_context_token=attn_flops,
    )


def _head(cfg: Mapping[str, Any], vocab: int | None = None) -> tuple[float, float]:
    h = _int(cfg, "hidden_size")
    v = vocab or _int(cfg, "vocab_size")
    return h * v * _dtype_bytes(cfg), 2.0 * h * v


def target_cost(config: Mapping[str, Any], name: str = "target") -> ModelCost:
    """The target's decode forward: its `num_hidden_layers` decoder layers and lm_head (the MTP layer not run)."""
    cfg = text_config(config)
    n = _int(cfg, "num_hidden_layers")
    layers = tuple(_layer(cfg, kind, _is_moe_layer(cfg, i)) for i, kind in enumerate(_layer_kinds(cfg, n)))
    head_bytes, head_flops = _head(cfg)
    return ModelCost(name, layers, head_bytes, head_flops, _weight_bytes(cfg))


def mtp_layers(config: Mapping[str, Any]) -> int:
    """How many MTP layers config.json declares (0 when none)."""
    cfg = text_config(config)
    return _int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", default=0)


def mtp_draft_cost(config: Mapping[str, Any], name: str = "MTP layer") -> ModelCost:
    """One draft step of the target's own MTP layer: a decoder layer of the target's kind (MoE where the target's
    last layer is; full attention for hybrids, as Qwen3-Next / Qwen3.5 MTP layers are), its 2H -> H input
    projection, and the shared lm_head."""
    cfg = text_config(config)
    if mtp_layers(cfg) < 1:
        raise OptionError("the target's config.json declares no MTP layer: pass the draft's own config with --draft")
    h = _int(cfg, "hidden_size")
    n = _int(cfg, "num_hidden_layers")
    layer = _layer(cfg, "full", _is_moe_layer(cfg, n), extra_params=2.0 * h * h)
    head_bytes, head_flops = _head(cfg)
    return ModelCost(name, (layer,), head_bytes, head_flops, _weight_bytes(cfg))


def draft_cost(draft_config: Mapping[str, Any], name: str = "draft") -> ModelCost:
    """A draft from its own config.json: an mtp2draft native draft (its `target_config`) or a native MTP export
    (the target's config, MTP layer kept) costs the MTP layer; anything else (an EAGLE-3 layer, a small model) costs its `num_hidden_layers` dense layers, an EAGLE-3
    `fc` (3H -> H) when it has one, and an lm_head over its `draft_vocab_size`."""
    if isinstance(draft_config.get("target_config"), Mapping):  # mtp2draft's native draft directory
        return mtp_draft_cost(draft_config["target_config"], name)
    cfg = text_config(draft_config)
    archs = " ".join(cfg.get("architectures") or [])
    if mtp_layers(cfg) and "Eagle" not in archs and "speculators_model_type" not in cfg:
        return mtp_draft_cost(cfg, name)
    layer_cfg = cfg.get("transformer_layer_config") or cfg  # speculators nests the layer's config
    h = _int(layer_cfg, "hidden_size")
    n = _int(layer_cfg, "num_hidden_layers", default=1)
    fc = 3.0 * h * h if ("Eagle3" in archs or "eagle" in str(cfg.get("speculators_model_type", ""))) else 0.0
    layers = tuple(_layer(layer_cfg, "full", False, extra_params=fc if i == 0 else 0.0) for i in range(n))
    head_bytes, head_flops = _head(layer_cfg, _int(cfg, "draft_vocab_size", default=0) or None)
    return ModelCost(name, layers, head_bytes, head_flops, _weight_bytes(layer_cfg))


def distinct_experts(n_routed: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts `tokens` tokens touch with uniform independent top-k routing over n_routed."""
    if n_routed <= 0 or tokens <= 0:
        return 0.0
    return n_routed * (1.0 - (1.0 - top_k / n_routed) ** tokens)


def forward_time(
    cost: ModelCost,
    accelerator: Accelerator,
    tp: int = 1,
    batch: int = 1,
    tokens: int = 1,
    context: int = 4096,
    layer_latency_s: float | None = None,
) -> ForwardTime:
    """One forward of `batch` sequences feeding `tokens` tokens each at `context` tokens of history, on `tp` devices.

    layer_latency_s: the fixed latency per decoder layer; None is the module's fitted LAYER_LATENCY_S (only the fit
    itself passes another value)."""
    if tp < 1 or batch < 1 or tokens < 1 or context < 0:
        raise OptionError(
            f"tp, batch and tokens must be at least 1 and context at least 0 (got {tp}, {batch}, {tokens}, {context})"
        )
    latency = LAYER_LATENCY_S if layer_latency_s is None else layer_latency_s
    n = batch * tokens
    weights = cost.head_bytes
    kv = 0.0
    flops = cost.head_flops_per_token * n
    for layer in cost.layers:
        weights += layer.dense_bytes + layer.expert_bytes * distinct_experts(layer.n_routed, layer.top_k, n)
        split = min(tp, layer.kv_heads) if layer.kv_heads else 1  # MLA's latent: every rank reads it whole
        kv += batch * (layer.kv_bytes_per_context_token * context * tp / split + layer.state_bytes)
        flops += n * (layer.flops_per_token + layer.attention_flops_per_context_token * (context + tokens))
    weights, kv, flops = weights / tp, kv / tp, flops / tp
    memory = (weights + kv) / accelerator.hbm_bytes_per_s
    compute = flops / accelerator.peak_flops(cost.weight_bytes_per_param)
    fixed = latency * cost.num_layers
    return ForwardTime(max(memory, compute) + fixed, weights, kv, flops, memory, compute, fixed)


def _golden_min(f, lo: float, hi: float, iterations: int = 200) -> float:
    """The minimiser of a unimodal f on [lo, hi] (golden-section search)."""
    r = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    for _ in range(iterations):
        if f(c) < f(d):
            b = d
        else:
            a = c
        c, d = b - r * (b - a), a + r * (b - a)
    return (a + b) / 2


def fit_layer_latency(baselines: list[tuple[ModelCost, Accelerator, int, int, int, float]]) -> float:
    """The LAYER_LATENCY_S that best fits measured non-speculative times per output token, each given as
    (target cost, accelerator, tp, batch, context, seconds per token): least squares on log(predicted / measured),
    so each case weighs by its relative error, not by its size."""
    if not baselines:
        raise ValueError("fit_layer_latency needs at least one non-speculative figure")

    def loss(latency: float) -> float:
        return sum(
            math.log(forward_time(cost, acc, tp, batch, 1, ctx, latency).seconds / measured) ** 2
            for cost, acc, tp, batch, ctx, measured in baselines
        )

    return _golden_min(loss, 0.0, 0.01)


__all__ = [
    "LAYER_LATENCY_S",
    "ForwardTime",
    "LayerCost",
    "ModelCost",
    "distinct_experts",
    "draft_cost",
    "fit_layer_latency",
    "forward_time",
    "mtp_draft_cost",
    "mtp_layers",
    "target_cost",
    "text_config",
]
