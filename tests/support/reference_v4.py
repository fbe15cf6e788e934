"""DeepSeek-V4's MTP layer computed in plain torch, written from vLLM 0.34's forward (not from transformers, not
from our module), reading the fixture checkpoint's tensors by their hub names (`mtp.0.*`, `embed.weight`,
`head.weight`): the computation tests/test_families.py (its DeepSeek-V4 section) holds the native layer to, one step and a chain.

Sources, vLLM 0.34 unless said otherwise:
- the glue: `vllm/models/deepseek_v4/nvidia/mtp.py` DeepSeekV4MultiTokenPredictorLayer.forward (the previous hidden
  viewed [T, hc_mult, H]; enorm(embed) and hnorm per stream, fused in common/ops/fused_mtp_input_rmsnorm.py;
  h_proj(h) + e_proj(e).unsqueeze(-2); mtp_block; mhc_post; the flat streams returned for the next step) and
  compute_logits (hc_head -> shared_head.norm -> head);
- the block: nvidia/model.py DeepseekV4DecoderLayer.forward (mhc_pre with attn_norm -> attn -> mhc post/pre with
  ffn_norm -> ffn -> the caller's mhc_post), whose mHC math is the eager reference model_executor/kernels/mhc/torch.py
  (mhc_pre_torch, mhc_post_torch);
- hc_head: SGLang 0.5.23 deepseek_v4_nextn.py DeepseekV4ModelNextN.hc_head (vLLM's is a fused tilelang kernel with
  the same arguments);
- attention: attention.py DeepseekV4Attention (fused wq_a | wkv, q_norm / kv_norm, wq_b, an unweighted RMSNorm per
  query head, GPT-J-style RoPE on the trailing qk_rope_head_dim channels of q and kv (common/rope.py: plain rope at
  rope_theta for compress ratio 1, is_neox_style False), sliding-window attention with one sink logit per head, the
  inverse RoPE on the output, the grouped wo_a (common/grouped_wo_a.py) and wo_b);
- MoE: nvidia/model.py DeepseekV4MoE (sqrtsoftplus scores, the gate bias for the choice only, top-k weights
  renormalised and scaled by routed_scaling_factor; SwiGLU experts clamped at swiglu_limit; the shared expert).
vLLM zeroes the embedding at position 0; `zero_first` does that, off by default as in our module and SGLang.

What this module does not do: assert anything (the tests do), or read quantised tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from support.references import config_of, rms, tensors

P = "mtp.0."


def mhc_pre(residual, fn, scale, base, norm_w, c: dict):
    """mhc_pre_torch + the fused norm: residual [B, T, S, H] -> (post [B, T, S, 1], comb [B, T, S, S], the block
    input rms(sum_i pre_i residual_i) * norm_w [B, T, H])."""
    s = residual.shape[-2]
    x = residual.flatten(-2)
    mixes = (x @ fn.T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + c["rms_norm_eps"])
    pre = torch.sigmoid(mixes[..., :s] * scale[0] + base[:s]) + c["hc_eps"]
    post = torch.sigmoid(mixes[..., s : 2 * s] * scale[1] + base[s : 2 * s]) * 2.0
    comb = mixes[..., 2 * s :].unflatten(-1, (s, s)) * scale[2] + base[2 * s :].view(s, s)
    comb = torch.softmax(comb, dim=-1) + c["hc_eps"]
    comb = comb / (comb.sum(-2, keepdim=True) + c["hc_eps"])
    for _ in range(c["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + c["hc_eps"])
        comb = comb / (comb.sum(-2, keepdim=True) + c["hc_eps"])
    layer_input = (pre.unsqueeze(-1) * residual).sum(-2)
    return post.unsqueeze(-1), comb, rms(layer_input, norm_w, c["rms_norm_eps"])


def mhc_post(x, residual, post, comb):
    """mhc_post_torch: out_j = sum_i comb[i, j] residual_i + post_j x."""
    return torch.einsum("...ij,...ih->...jh", comb, residual) + post * x.unsqueeze(-2)


def hc_head(x, fn, scale, base, c: dict):
    """SGLang's hc_head: [B, T, S, H] -> [B, T, H]."""
    flat = x.flatten(-2)
    mixes = (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + c["rms_norm_eps"])
    pre = torch.sigmoid(mixes * scale + base) + c["hc_eps"]
    return (pre.unsqueeze(-1) * x).sum(-2)


def gptj_rope(x, pos, rope_dim: int, theta: float, sign: float = 1.0):
    """Rotate the trailing `rope_dim` channels of x [B, T, heads, D] pairwise (2i, 2i+1) by pos * theta^(-2i/rd)."""
    inv = 1.0 / theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
    ang = pos[..., None].float() * inv  # [B, T, rd/2]
    cos, sin = ang.cos()[:, :, None], sign * ang.sin()[:, :, None]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([nope, rotated], dim=-1)


def attention(w, x, pos, c: dict, window: int | None):
    """DeepseekV4Attention at compress ratio 1: x [B, T, H] -> [B, T, H]."""
    b, t, _ = x.shape
    heads, d, eps, rd = c["num_attention_heads"], c["head_dim"], c["rms_norm_eps"], c["qk_rope_head_dim"]
    qr = rms(x @ w[P + "attn.wq_a.weight"].T, w[P + "attn.q_norm.weight"], eps)
    kv = rms(x @ w[P + "attn.wkv.weight"].T, w[P + "attn.kv_norm.weight"], eps)  # [B, T, D]: one shared K = V head
    q = (qr @ w[P + "attn.wq_b.weight"].T).view(b, t, heads, d)
    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)
    q = gptj_rope(q, pos, rd, c["rope_theta"])
    kv = gptj_rope(kv[:, :, None], pos, rd, c["rope_theta"])[:, :, 0]
    scores = torch.einsum("bqhd,bkd->bhqk", q, kv) * d**-0.5
    qi, ki = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (ki <= qi) & (ki > qi - window) if window else ki <= qi
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = w[P + "attn.attn_sink"].view(1, heads, 1, 1).expand(b, heads, t, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    o = torch.einsum("bhqk,bkd->bqhd", probs, kv)
    o = gptj_rope(o, pos, rd, c["rope_theta"], sign=-1.0)  # the inverse rotation at the query's position
    g, rank = c["o_groups"], c["o_lora_rank"]
    wo_a = w[P + "attn.wo_a.weight"].view(g, rank, -1)  # [G, rank, heads * D / G]
    o = torch.einsum("btgi,gri->btgr", o.reshape(b, t, g, -1), wo_a).flatten(2)
    return o @ w[P + "attn.wo_b.weight"].T


def moe(w, x, c: dict):
    """DeepseekV4MoE without hash routing: x [B, T, H] -> [B, T, H]."""
    limit = c["swiglu_limit"]

    def swiglu(v, w1, w3, w2):
        gate, up = (v @ w1.T).clamp(max=limit), (v @ w3.T).clamp(min=-limit, max=limit)
        return (F.silu(gate) * up) @ w2.T

    scores = F.softplus(x @ w[P + "ffn.gate.weight"].T).sqrt()  # [B, T, E]
    chosen = (scores + w[P + "ffn.gate.bias"]).topk(c["num_experts_per_tok"], dim=-1).indices
    weights = scores.gather(-1, chosen)
    weights = weights / weights.sum(-1, keepdim=True) * c["routed_scaling_factor"]
    out = swiglu(x, *(w[f"{P}ffn.shared_experts.{n}.weight"] for n in ("w1", "w3", "w2")))
    for e in range(c["n_routed_experts"]):
        hit = (chosen == e).float() * weights  # [B, T, k]: the expert's weight where chosen
        factor = hit.sum(-1, keepdim=True)
        if factor.any():
            out = out + factor * swiglu(x, *(w[f"{P}ffn.experts.{e}.{n}.weight"] for n in ("w1", "w3", "w2")))
    return out


def step(w, c, nxt, hidden, pos, *, window: int | None, zero_first: bool = False, hc_reduce: bool = True):
    """One MTP step: nxt [B, T], hidden [B, T, S, H] -> (logits [B, T, V], the streams handed on [B, T, S, H])."""
    eps = c["rms_norm_eps"]
    e = F.embedding(nxt, w["embed.weight"])
    if zero_first:
        e = torch.where(pos[..., None] == 0, torch.zeros_like(e), e)
    x = rms(hidden, w[P + "hnorm.weight"], eps) @ w[P + "h_proj.weight"].T
    x = x + (rms(e, w[P + "enorm.weight"], eps) @ w[P + "e_proj.weight"].T).unsqueeze(-2)  # [B, T, S, H]
    post, comb, a_in = mhc_pre(
        x, *(w[P + f"hc_attn_{n}"] for n in ("fn", "scale", "base")), w[P + "attn_norm.weight"], c
    )
    x = mhc_post(attention(w, a_in, pos, c, window), x, post, comb)
    post, comb, f_in = mhc_pre(x, *(w[P + f"hc_ffn_{n}"] for n in ("fn", "scale", "base")), w[P + "ffn_norm.weight"], c)
    out = mhc_post(moe(w, f_in, c), x, post, comb)
    reduced = (
        hc_head(out, *(w[P + f"hc_head_{n}"] for n in ("fn", "scale", "base")), c) if hc_reduce else out[..., 0, :]
    )
    return rms(reduced, w[P + "norm.weight"], eps) @ w["head.weight"].T, out


def deepseek_v4_vllm(path: Path, nxt, hidden, pos, *, window: int | None = -1, zero_first: bool = False,
                     hc_reduce: bool = True):  # fmt: skip
    """(logits, hand-over) of one step; window -1: the config's sliding window, None: none (a variant that must
    differ); hc_reduce False: stream 0 instead of hc_head (another)."""
    c, w = config_of(path), tensors(path)
    window = c["sliding_window"] if window == -1 else window
    return step(w, c, nxt, hidden, pos, window=window, zero_first=zero_first, hc_reduce=hc_reduce)


def deepseek_v4_chain(path: Path, tokens, hidden, k: int):
    """vLLM's chain of k draft steps from one origin per row, the streams recycled (`previous_hidden_states`):
    tokens [B, T + k - 1] (the context's next tokens, then the drafts' inputs), hidden [B, T, S, H] the target's
    streams at positions 0..T-1. Step s runs over positions 0..T-1+s: the target's streams up to T-1, then the
    previous steps' own output streams at the last position; the window and RoPE as in serving. Returns each step's
    logits at its last position [B, V]."""
    c, w = config_of(path), tensors(path)
    t = hidden.shape[1]
    seq, outs = hidden, []
    for s in range(k):
        n = t + s
        pos = torch.arange(n).expand(tokens.shape[0], -1)
        logits, streams = step(w, c, tokens[:, :n], seq, pos, window=c["sliding_window"])
        outs.append(logits[:, -1])
        seq = torch.cat([seq, streams[:, -1:]], dim=1)
    return outs
