"""DeepSeek-V4's DSpark drafter in plain torch, one block at a time with explicit loops, written from vLLM 0.32 (CPU
build) source (not from transformers, not from our module), reading a dspark directory's tensors by their release
names (`mtp.{i}.*`): the computation tests/test_draft_dspark_v4.py holds `DSparkV4Draft` to.

Sources, vLLM 0.32 (CPU build):
- pooling: `vllm/models/deepseek_v4/nvidia/model.py` (the aux state of a target layer is `mhc_post(...)` of its
  output, `.mean(dim=1)` over the hc_mult streams; `v1/worker/gpu/spec_decode/eagle/eagle3_utils.py` captures
  DeepSeek-V4's `dspark_target_layer_ids` i after layer i, the ids + 1 in capture-after terms);
- the context: `vllm/models/deepseek_v4/nvidia/dspark.py` `combine_hidden_states` (main_norm(main_proj(...))) and
  `precompute_and_store_context_kv` (each stage's own wkv, then its kv_norm, then RoPE at the context positions,
  `_insert_context_kv`);
- the block: `DSparkDeepseekV4Model.forward` (the embedding repeated over hc_mult, the stages, `mhc_post`, then
  `hc_head` from the last stage's `hc_head_*`: the pre-norm head hidden);
- which keys a slot sees: `vllm/v1/attention/backends/mla/sparse_swa.py` `ComputeDSparkNoncausalSWAIndicesKernel`
  (positions max(prefix_len - window, 0) .. seq_len - 1: the window of context before the block, and the whole
  block, future slots included); positions: `v1/worker/gpu/spec_decode/dflash/speculator.py`
  `_prepare_dflash_inputs_kernel` (context at the target's positions, slot k at last_valid_pos + 1 + k);
- the heads: `DSparkDeepseekV4ForCausalLM.compute_logits` (lm_head(norm(h))), `qwen3_dspark.py` `DSparkMarkovHead`
  and `DSparkConfidenceHead` (cat(h, markov_w1(prev)) in fp32, no bias), and `spec_decode/dspark/speculator.py`
  `_sample_sequential` (prev starts at the anchor's token, then each greedy draft; the confidence reads the
  pre-norm head hidden).
The V4 block internals (mHC, attention pieces, MoE) are those of `reference_v4.py`, written from vLLM's V4 code.

`variant` plants one mistake, so a test can show that the comparison would see it: "stream0" (a layer's first
stream instead of the mean), "future_context" (context keys at and past the anchor visible), "no_window",
"context_positions" (context keys rotated one position late), "prev_off_by_one" (the Markov prev one token
late), "confidence_normed" (the confidence head reads the normed hidden).

What this module does not do: assert anything (the tests do), or read quantised tensors.
"""

from __future__ import annotations

import torch

from support.reference_v4 import P, gptj_rope, hc_head, mhc_post, mhc_pre, moe
from support.references import rms


def pool(layer_streams: list[torch.Tensor], variant: str | None = None) -> torch.Tensor:
    """Per target layer [B, S, hc, H] -> [B, S, n*H]: each layer's streams averaged, the layers concatenated."""
    return torch.cat([s[..., 0, :] if variant == "stream0" else s.mean(dim=-2) for s in layer_streams], dim=-1)


def _stages(w: dict) -> int:
    return 1 + max(int(k.split(".")[1]) for k in w if k.startswith("mtp."))


def _stage(w: dict, i: int) -> dict:
    """Stage i's tensors under `mtp.0.` (the names reference_v4's functions read)."""
    prefix = f"mtp.{i}."
    return {P + k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}


def _attention(ws: dict, x, pos, ctx, ctx_pos, c: dict):
    """One stage's attention for one block: x [Q, H] the slots' attention input at positions pos [Q]; ctx [K, H] the
    main_x rows the block sees, at ctx_pos [K]. Every slot sees all K context keys and all Q block keys."""
    heads, d, eps, rd, theta = (c[k] for k in ("num_attention_heads", "head_dim", "rms_norm_eps", "qk_rope_head_dim",
                                               "rope_theta"))  # fmt: skip
    q_len = x.shape[0]
    qr = rms(x @ ws[P + "attn.wq_a.weight"].T, ws[P + "attn.q_norm.weight"], eps)
    q = (qr @ ws[P + "attn.wq_b.weight"].T).view(1, q_len, heads, d)
    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + eps)
    q = gptj_rope(q, pos[None], rd, theta)[0]  # [Q, heads, D]
    keys = []
    for rows, at in ((ctx, ctx_pos), (x, pos)):  # the context's keys, then the block's: wkv, kv_norm, RoPE
        kv = rms(rows @ ws[P + "attn.wkv.weight"].T, ws[P + "attn.kv_norm.weight"], eps)
        keys.append(gptj_rope(kv[None, :, None], at[None], rd, theta)[0, :, 0])
    kv = torch.cat(keys)  # [K + Q, D]: K = V
    out = torch.zeros(q_len, heads, d)
    for t in range(q_len):
        for hd in range(heads):
            scores = (kv @ q[t, hd]) * d**-0.5
            probs = torch.softmax(torch.cat([scores, ws[P + "attn.attn_sink"][hd : hd + 1]]), dim=0)[:-1]
            out[t, hd] = probs @ kv
    out = gptj_rope(out[None], pos[None], rd, theta, sign=-1.0)[0]
    g, rank = c["o_groups"], c["o_lora_rank"]
    wo_a = ws[P + "attn.wo_a.weight"].view(g, rank, -1)
    out = torch.einsum("tgi,gri->tgr", out.reshape(q_len, g, -1), wo_a).flatten(1)
    return out @ ws[P + "attn.wo_b.weight"].T


def head_hidden(w: dict, c: dict, embed, slots, pos, main_x, variant: str | None = None):
    """One block: slots / pos [Q] -> the pre-norm head hidden [Q, H]. main_x [S, H] at positions 0..S-1."""
    a, stages = int(pos[0]), _stages(w)
    start = 0 if variant == "no_window" else max(a - c["sliding_window"], 0)
    end = main_x.shape[0] if variant == "future_context" else a
    ctx_pos = torch.arange(start, end)
    ctx, ctx_rope = main_x[start:end], ctx_pos + 1 if variant == "context_positions" else ctx_pos
    x = embed[slots][:, None].repeat(1, c["hc_mult"], 1)  # [Q, hc, H]
    for i in range(stages):
        ws = _stage(w, i)
        post, comb, a_in = mhc_pre(x[None], *(ws[P + f"hc_attn_{n}"] for n in ("fn", "scale", "base")),
                                   ws[P + "attn_norm.weight"], c)  # fmt: skip
        x = mhc_post(_attention(ws, a_in[0], pos, ctx, ctx_rope, c)[None], x[None], post, comb)[0]
        post, comb, f_in = mhc_pre(x[None], *(ws[P + f"hc_ffn_{n}"] for n in ("fn", "scale", "base")),
                                   ws[P + "ffn_norm.weight"], c)  # fmt: skip
        x = mhc_post(moe(ws, f_in, c), x[None], post, comb)[0]
    last = f"mtp.{stages - 1}."
    return hc_head(x[None], *(w[last + f"hc_head_{n}"] for n in ("fn", "scale", "base")), c)[0]


def _heads(w: dict, c: dict, head, hidden, prev, variant: str | None):
    """hidden [H] (pre-norm), prev token id -> (logits [V], confidence logit)."""
    last = f"mtp.{_stages(w) - 1}."
    normed = rms(hidden, w[last + "norm.weight"], c["rms_norm_eps"])
    e = w[last + "markov_head.markov_w1.weight"][prev]
    logits = normed @ head.T + w[last + "markov_head.markov_w2.weight"] @ e
    read = normed if variant == "confidence_normed" else hidden
    conf = torch.cat([read, e]) @ w[last + "confidence_head.proj.weight"][0]
    return logits, conf


def _main_x(w: dict, c: dict, targets):
    return rms(targets @ w["mtp.0.main_proj.weight"].T, w["mtp.0.main_norm.weight"], c["rms_norm_eps"])


def forward(w: dict, c: dict, embed, head, input_ids, targets, anchors, keep, variant: str | None = None):
    """Teacher-forced blocks: {(row, block): (logits [bs, V], confidence [bs])} for the kept blocks; slot k's Markov
    prev is the true token at anchor + k (clamped to the last position)."""
    bs, noise = c["dspark_block_size"], c["dspark_noise_token_id"]
    s, out = input_ids.shape[1], {}
    for b in range(input_ids.shape[0]):
        main_x = _main_x(w, c, targets[b])
        for j in range(anchors.shape[1]):
            if not keep[b, j]:
                continue
            a = int(anchors[b, j])
            slots = torch.tensor([int(input_ids[b, a])] + [noise] * (bs - 1))
            hidden = head_hidden(w, c, embed, slots, a + torch.arange(bs), main_x, variant)
            logits, conf = [], []
            for k in range(bs):
                at = min(a + k + (1 if variant == "prev_off_by_one" else 0), s - 1)
                lg, cf = _heads(w, c, head, hidden[k], int(input_ids[b, at]), variant)
                logits.append(lg)
                conf.append(cf)
            out[b, j] = torch.stack(logits), torch.stack(conf)
    return out


def draft_block(w: dict, c: dict, embed, head, targets, last_token, variant: str | None = None):
    """Serving: the block anchored at S = targets.shape[1], prev chained greedily. -> (tokens [B, bs], conf [B, bs])."""
    bs, noise, s = c["dspark_block_size"], c["dspark_noise_token_id"], targets.shape[1]
    tokens, confs = [], []
    for b in range(targets.shape[0]):
        slots = torch.tensor([int(last_token[b])] + [noise] * (bs - 1))
        hidden = head_hidden(w, c, embed, slots, s + torch.arange(bs), _main_x(w, c, targets[b]), variant)
        prev, row, conf = int(last_token[b]), [], []
        for k in range(bs):
            logits, cf = _heads(w, c, head, hidden[k], prev, variant)
            prev = int(logits.argmax())
            row.append(prev)
            conf.append(cf)
        tokens.append(torch.tensor(row))
        confs.append(torch.stack(conf))
    return torch.stack(tokens), torch.stack(confs)
