"""EAGLE-3 attention transfers: a family's attention block (GQA with partial or interleaved RoPE, QK-norm, biases,
sinks, value scale; gated GQA; MLA with its low-rank norms and LoRA scaling) -> Llama GQA acting on u = x / rms(x),
stored for `absorb_projection` (`eagle3/transfer.py`) to fold the MTP input projection in.

What this module does not do: read checkpoints or write files, or touch the MLP, norms and lm_head (`eagle3/transfer.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mtp2draft.eagle3.transfer import Eagle3Build, fro_rms
from mtp2draft.errors import CheckpointError


def rope_permutation(head_dim: int, rope_dim: int, rope_offset: int, interleaved: bool) -> tuple[list[int], int]:
    """Permutation of one head's dims so Llama's full RoPE (pairs (i, i + d/2), freq theta'^(-2i/d)) acts like the
    source's partial RoPE on `rope_dim` dims starting at `rope_offset` (pairs (2j, 2j+1) when interleaved, else
    (j, j + rope_dim/2), freq theta^(-2j/rope_dim)).

    Rope pair j goes to Llama slot j; pass-through dims fill the remaining slots. With theta' = theta^(d/rope_dim)
    slot j has exactly the source frequency, and pass-through slots (j >= rope_dim/2) rotate at theta^(-1) or slower:
    nearly unrotated over draft-length distances. Returns (perm, exponent) with llama_dim[k] = src_dim[perm[k]] and
    theta' = theta ** exponent.
    """
    d, half, rhalf = head_dim, head_dim // 2, rope_dim // 2
    if interleaved:
        pairs = [(rope_offset + 2 * j, rope_offset + 2 * j + 1) for j in range(rhalf)]
    else:
        pairs = [(rope_offset + j, rope_offset + j + rhalf) for j in range(rhalf)]
    rope_dims = {i for p in pairs for i in p}
    passthrough = [i for i in range(d) if i not in rope_dims]
    perm = [0] * d
    for j, (a, b) in enumerate(pairs):
        perm[j], perm[j + half] = a, b
    n_pass_half = len(passthrough) // 2
    for k, src in enumerate(passthrough[:n_pass_half]):
        perm[rhalf + k] = src
    for k, src in enumerate(passthrough[n_pass_half:]):
        perm[half + rhalf + k] = src
    return perm, d / rope_dim


def _permute_heads(w: torch.Tensor, heads: int, perm: list[int]) -> torch.Tensor:
    """Permute the per-head output rows of a projection [heads * d, in]."""
    d = len(perm)
    return w.view(heads, d, -1)[:, perm, :].reshape(heads * d, -1)


def _rope_parameters(cfg: Any) -> dict[str, Any]:
    """The block's RoPE parameters. Per-layer-type entries (MiMo-V2-Flash: {"full_attention": {...},
    "sliding_attention": {...}}) resolve to the block's own layer type, `layer_types[0]`."""
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    layer_types = getattr(cfg, "layer_types", None) or []
    if layer_types and isinstance(rope.get(layer_types[0]), dict):
        rope = dict(rope[layer_types[0]])
    return rope


@dataclass(frozen=True)
class LlamaAttention:
    """A family's attention block as the Llama GQA the EAGLE-3 layer runs: x-space q/k/v projections (acting on
    u = x / rms(x)), o_proj, the head counts and head dim, and the exponent of RoPE's theta (`rope_permutation`)."""

    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    rope_exponent: float


def _set_attention(b: Eagle3Build, attn: LlamaAttention, exact: bool, how: str, sources: list[str]) -> None:
    """Store x-space q/k/v (acting on u = x / rms(x)) for `absorb_projection`, and o_proj + config; `exact`, `how`
    and `sources` are the transfer's provenance."""
    wq, wk, wv, wo = attn.wq, attn.wk, attn.wv, attn.wo
    cfg = b.block_config
    rope = _rope_parameters(cfg)
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 1e4)))
    scaled = rope.get("rope_type", "default") not in ("default", None)
    b.scratch["attention"] = {"q": wq, "k": wk, "v": wv, "exact": exact and not scaled, "how": how, "from": sources}
    b.put("midlayer.self_attn.o_proj.weight", wo, exact and not scaled, sources, how)
    b.config.update(
        num_attention_heads=attn.heads,
        num_key_value_heads=attn.kv_heads,
        head_dim=attn.head_dim,
        rope_theta=theta**attn.rope_exponent,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
    )
    if scaled:
        rope.pop("rope_theta", None)
        b.config["rope_scaling"] = rope
        b.scratch["attention"]["how"] += f"; {rope.get('rope_type')} RoPE scaling copied as-is (approximate)"


def attention_gqa(b: Eagle3Build) -> None:
    """GQA block -> Llama GQA. Exact with full RoPE and no bias/QK-norm; partial RoPE is remapped by
    `rope_permutation`; q/k/v biases are dropped and QK-norm is linearised (both approximate).

    Also exact: interleaved RoPE pairs (`rope_interleave` on the block config, ERNIE-4.5) permuted onto Llama's
    half-split pairs, a value scale (`attention_value_scale`, MiMo-V2-Flash) folded into v_proj, and v heads narrower
    than q/k heads zero-padded with matching zero o_proj columns. Dropped (approximate): attention-sink bias, and a
    sliding window (the EAGLE-3 layer attends to the whole context; the same while it fits in the window)."""
    cfg = b.block_config
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // int(cfg.num_attention_heads))
    d_in = b.norm_weight("block.input_layernorm.weight")
    names = {p: f"block.self_attn.{p}_proj.weight" for p in "qkvo"}
    wq, wk, wv, wo = (b.tensor(names[p]) for p in "qkvo")
    # head counts from the tensors: MiMo-V2-Flash's sliding-window attention has twice the config's kv heads
    heads, kv_heads = wq.shape[0] // d, wk.shape[0] // d
    wq, wk, wv = wq * d_in, wk * d_in, wv * d_in  # act on u = x / rms(x)
    notes, exact = [], True
    v_scale = getattr(cfg, "attention_value_scale", None)
    if v_scale is not None and float(v_scale) != 1.0:
        wv = wv * float(v_scale)
        notes.append(f"value scale {float(v_scale):g} folded into v_proj")
    dv = wv.shape[0] // kv_heads
    if dv > d:
        raise CheckpointError(f"attention_gqa: v head dim {dv} exceeds q/k head dim {d}; the EAGLE-3 layer has one")
    if dv < d:
        wv = torch.cat([wv.view(kv_heads, dv, -1), wv.new_zeros(kv_heads, d - dv, wv.shape[-1])], 1)
        wv = wv.reshape(kv_heads * d, -1)
        wo = torch.cat([wo.view(wo.shape[0], heads, dv), wo.new_zeros(wo.shape[0], heads, d - dv)], 2)
        wo = wo.reshape(wo.shape[0], heads * d)
        notes.append(f"v zero-padded {dv}->{d} with zero o_proj columns")
    if b.has("block.self_attn.sinks"):
        notes.append("attention-sink bias dropped (the EAGLE-3 layer has none)")
        exact = False
    layer_types = getattr(cfg, "layer_types", None) or []
    window = getattr(cfg, "sliding_window", None) if layer_types[:1] == ["sliding_attention"] else None
    if window:
        notes.append(f"sliding window ({window} tokens) dropped: attends to the whole context")
        exact = False
    if any(b.has(f"block.self_attn.{p}_proj.bias") for p in "qkv"):
        notes.append("q/k/v bias dropped (the EAGLE-3 layer has none)")
        exact = False
    for p, w, n in (("q", wq, heads), ("k", wk, kv_heads)):
        norm_key = f"block.self_attn.{p}_norm.weight"
        if b.has(norm_key):
            scale = b.norm_weight(norm_key)
            hw = w.view(n, d, -1)
            c = torch.stack([torch.tensor(fro_rms(hw[i])) for i in range(n)])  # per-head rms estimate
            hw = hw * scale[None, :, None] / c[:, None, None]
            if p == "q":
                wq = hw.reshape(n * d, -1)
            else:
                wk = hw.reshape(n * d, -1)
            notes.append(f"{p}_norm linearised with a weight-based rms estimate")
            exact = False
    # transformers 5 keeps the factor only inside rope_parameters (GLM-4.5, Qwen3-Next, Qwen3.5)
    rope_params = _rope_parameters(cfg)
    prf = float(getattr(cfg, "partial_rotary_factor", None) or rope_params.get("partial_rotary_factor") or 1.0)
    rope_dim = int(d * prf)
    interleaved = bool(getattr(cfg, "rope_interleave", False))
    perm, exponent = rope_permutation(d, rope_dim, 0, interleaved=interleaved)
    if interleaved:
        notes.append("interleaved RoPE pairs permuted onto Llama's half-split pairs")
    if rope_dim != d:
        notes.append(f"partial RoPE ({rope_dim}/{d} dims) remapped onto full RoPE with theta^{exponent:g}")
        exact = False
    wq, wk = _permute_heads(wq, heads, perm), _permute_heads(wk, kv_heads, perm)
    how = "GQA copied" + ("; " + "; ".join(notes) if notes else "")
    _set_attention(b, LlamaAttention(wq, wk, wv, wo, heads, kv_heads, d, exponent), exact, how, list(names.values()))


def attention_gated(b: Eagle3Build) -> None:
    """Gated GQA (Qwen3-Next/3.5: q_proj emits [q, gate] per head, output *= sigmoid(gate)) -> Llama GQA: the
    gate rows are dropped and sigmoid(gate) is replaced by its value at 0, 0.5, folded into o_proj (approximate)."""
    cfg = b.block_config
    heads = int(cfg.num_attention_heads)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    q_key, o_key = "block.self_attn.q_proj.weight", "block.self_attn.o_proj.weight"
    wq = b.tensor(q_key)
    q_only = wq.view(heads, 2 * d, -1)[:, :d, :].reshape(heads * d, -1)
    original = b.tensor

    def tensor(name: str) -> torch.Tensor:
        # sigmoid(gate) ~ 0.5 folded into o_proj before attention_gqa stores it (in fp32, before the output cast)
        return q_only if name == q_key else original(name) * 0.5 if name == o_key else original(name)

    b.tensor = tensor  # type: ignore[method-assign]
    try:
        attention_gqa(b)
    finally:
        b.tensor = original  # type: ignore[method-assign]
    b.scratch["attention"]["exact"] = False
    b.scratch["attention"]["how"] = (
        "gate rows dropped, sigmoid(gate) ~ 0.5 folded into o_proj; " + b.scratch["attention"]["how"]
    )
    b.provenance["midlayer.self_attn.o_proj.weight"].update(exact=False, how=b.scratch["attention"]["how"])


def attention_mla(b: Eagle3Build) -> None:
    """MLA -> Llama GQA with num_kv_heads = num_heads and head_dim = qk_nope + qk_rope.

    The low-rank norms (q_a_layernorm, kv_a_layernorm) are linearised with weight-based rms estimates; k_rope, shared
    by all heads in MLA, is copied into every head; v is zero-padded to head_dim with matching zero o_proj columns;
    the nope dims ride on near-zero RoPE frequencies (see `rope_permutation`); MLA's softmax scale is folded into q.
    LongCat-Flash's LoRA scaling (`mla_scale_q_lora` / `mla_scale_kv_lora`: q and the kv latent times
    (hidden / rank)^0.5) is folded in exactly. DeepSeek-V3.2's DSA indexer has no EAGLE-3 counterpart and is dropped:
    its top-`index_topk` sparse attention becomes dense attention (the same while the context is at most
    `index_topk` tokens, approximate beyond).
    """
    cfg = b.block_config
    heads = int(cfg.num_attention_heads)
    dn, dr, dv = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)
    r_kv = int(cfg.kv_lora_rank)
    d = dn + dr
    d_in = b.norm_weight("block.input_layernorm.weight")
    sources = []

    def t(name: str) -> torch.Tensor:
        sources.append(name)
        return b.tensor(name)

    if b.has("block.self_attn.q_a_proj.weight"):
        wqa = t("block.self_attn.q_a_proj.weight") * d_in  # [r_q, H] on u
        wq = t("block.self_attn.q_b_proj.weight") @ (
            b.norm_weight("block.self_attn.q_a_layernorm.weight")[:, None] * wqa
        )
        wq = wq / fro_rms(wqa)
    else:
        wq = t("block.self_attn.q_proj.weight") * d_in
    wkva = t("block.self_attn.kv_a_proj_with_mqa.weight") * d_in  # [r_kv + dr, H]
    c_kv = fro_rms(wkva[:r_kv])
    latent = b.norm_weight("block.self_attn.kv_a_layernorm.weight")[:, None] * wkva[:r_kv] / c_kv  # [r_kv, H]
    notes = []
    if getattr(cfg, "mla_scale_q_lora", False) and getattr(cfg, "q_lora_rank", None):
        wq = wq * (b.hidden_size / int(cfg.q_lora_rank)) ** 0.5
        notes.append("LoRA scaling of q folded in")
    if getattr(cfg, "mla_scale_kv_lora", False):
        latent = latent * (b.hidden_size / r_kv) ** 0.5  # scales k_nope and v, not the shared k_rope
        notes.append("LoRA scaling of the kv latent folded in")
    if b.has("block.self_attn.indexer.wq_b.weight"):
        topk = getattr(cfg, "index_topk", "index_topk")
        notes.append(f"DSA indexer dropped: top-{topk} sparse attention becomes dense (same up to {topk} tokens)")
    kvb = t("block.self_attn.kv_b_proj.weight").view(heads, dn + dv, r_kv)
    k_nope = kvb[:, :dn, :] @ latent  # [heads, dn, H]
    v = kvb[:, dn:, :] @ latent  # [heads, dv, H]
    k_rope = wkva[r_kv:].expand(heads, dr, -1)  # [heads, dr, H], shared by all heads
    wk = torch.cat([k_nope, k_rope], dim=1).reshape(heads * d, -1)
    wv = torch.zeros(heads, d, v.shape[-1])
    wv[:, :dv] = v
    wo_src = t("block.self_attn.o_proj.weight").view(-1, heads, dv)
    wo = torch.zeros(wo_src.shape[0], heads, d)
    wo[:, :, :dv] = wo_src
    # MLA's softmax scale (yarn mscale included) vs Llama's head_dim^-0.5 with head_dim = dn + dr.
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    mla_scale = yarn_apply_mscale(getattr(cfg, "rope_parameters", None) or {}, d**-0.5)
    wq = wq * (mla_scale / d**-0.5)
    perm, exponent = rope_permutation(d, dr, dn, interleaved=bool(getattr(cfg, "rope_interleave", True)))
    wq, wk = _permute_heads(wq, heads, perm), _permute_heads(wk, heads, perm)
    how = (
        "MLA expanded to per-head q/k/v: low-rank norms linearised (weight-based rms), shared k_rope copied per head, "
        f"v zero-padded {dv}->{d}, RoPE remapped with theta^{exponent:g}" + "".join(f"; {n}" for n in notes)
    )
    attn = LlamaAttention(wq, wk, wv.reshape(heads * d, -1), wo.reshape(wo.shape[0], -1), heads, heads, d, exponent)
    _set_attention(b, attn, False, how, sources)
