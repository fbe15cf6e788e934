"""The DSpark block drafter (deepseek-ai/DeepSpec), built from its references' definitions
(docs/notes/2026-12-05-dspark-definition.md has each one's source):

    context = hidden_norm(fc(cat(target layers)))                    # [B, S, n*H] -> [B, S, H]
    x       = embed([last verified token, noise, ..., noise])        # one block of `block_size` slots
    per layer: q from x; k, v = cat(proj(context), proj(x))           # the layer's own k/v projections on the context
               a slot of the block anchored at a sees context < a and its whole block, both ways
    logits  = head(norm(x)) + markov_w2(markov_w1(prev))             # prev: the token before each slot
    conf    = proj(cat(norm(x), markov_w1(prev)))                    # one logit per slot: will this slot be accepted?

One pass of the layers drafts the whole block. At serving time the Markov head chains greedily inside the block
(prev_0 = the verified token, prev_k = argmax of slot k-1). In training it is teacher-forced. The layers are the
Qwen3-style ones of DeepSpec's reference model, with transformers' Qwen3 norm, MLP and rotary pieces. `dspark_loss`
is DeepSpec's objective: cross-entropy with optional decay, total variation to the target, and a confidence BCE.

What this module does not do: build DeepSeek-V4's DSpark stages (`draft.dspark_v4`: V4 attention with mHC streams,
MoE, sliding window, attention sink, with the same interface), read or write checkpoints, or run the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from mtp2draft.family.dspark import DSparkFields


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos / sin [B, T, D] for those T positions."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, nb] anchors -> [B, nb * block_size] positions: anchor + 0..block_size-1 for each block."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[..., None] + offsets).flatten(1)


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Which keys each block slot may attend to: bool [B, nb * bs, context_len + nb * bs].

    A slot of block j (anchor a_j) sees the context keys at positions < a_j and every slot of block j, both ways. It
    sees no other block. A block that is not kept (`keep` False) sees nothing, and its rows are all False."""
    nb = anchors.shape[1]
    q_block = torch.arange(nb * block_size, device=anchors.device) // block_size  # [Q]
    kv = torch.arange(context_len + nb * block_size, device=anchors.device)  # [K]
    anchor_of_q = anchors[:, q_block]  # [B, Q]
    sees_context = (kv[None, None] < context_len) & (kv[None, None] < anchor_of_q[..., None])
    kv_block = (kv - context_len).div(block_size, rounding_mode="floor")
    sees_block = (kv[None, None] >= context_len) & (kv_block[None, None] == q_block[None, :, None])
    return (sees_context | sees_block) & keep[:, q_block][..., None]


def pooled_context(aux: torch.Tensor) -> torch.Tensor:
    """The drafter's `targets` from the target layers' outputs concatenated on the last axis: [B, T, n*H] as is, or
    [B, T, S, n*H] (S residual streams, DeepSeek-V4's hyper-connections) mean-pooled over the streams (vLLM 0.32
    `v1/worker/gpu/spec_decode/dspark/speculator.py`: "DSpark consumes mean-pooled target aux hidden states")."""
    return aux.mean(dim=-2) if aux.dim() == 4 else aux


class MarkovHead(nn.Module):
    """The low-rank Markov head: a bias on slot k's logits from the token before it, markov_w2(markov_w1(prev)).
    markov_w1 [vocab, rank] is an embedding. markov_w2 is stored [vocab, rank], as a Linear(rank -> vocab)."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev [...] token ids -> (logit bias [..., vocab], the prev embedding [..., rank])."""
        embedded = self.markov_w1(prev)
        return self.markov_w2(embedded), embedded


class DSparkAttention(nn.Module):
    """Queries from the block and keys / values from [context; block], with this layer's own projections.
    The parameter names are those of Qwen3's attention (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=config.attention_bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        rope_k: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, Q, H] (block slots), context [B, S, H], mask bool [B, Q, S + Q] -> [B, Q, H]."""
        b, q_len, _ = x.shape
        both = torch.cat([context, x], dim=1)  # [B, S + Q, H]
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(both).view(b, -1, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(b, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, *rope_q), _rope(k, *rope_k)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        # a row with no visible key (a block that was not kept) gives zeros, not NaN
        scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, q_len, -1))


class DSparkLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x), context), then x + mlp(norm(x))."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DSparkAttention(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x, context, rope_q, rope_k, mask):  # noqa: ANN001, ANN201 - shapes as DSparkAttention's
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_k, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class BlockOutput:
    """One forward over blocks. nb blocks of bs slots each."""

    logits: torch.Tensor  # [B, nb, bs, vocab]: head logits plus the Markov bias of each slot's prev token
    confidence: torch.Tensor | None  # [B, nb, bs]: the confidence head's logit
    hidden: torch.Tensor  # [B, nb, bs, H]: after the final norm


class DSparkDraft(nn.Module):
    """A DSpark drafter: `config` gives the layers' shape (Qwen3Config: hidden, heads, MLP, rope, num_hidden_layers
    = the drafter's layer count) and `fields` gives the DSpark settings (block, target layers, noise id, Markov rank).
    The confidence head's Linear has a bias when `confidence_bias` is True (DeepSpec) and none when it is False
    (DeepSeek-V4's release)."""

    def __init__(self, config: Qwen3Config, fields: DSparkFields, confidence_bias: bool = False) -> None:
        super().__init__()
        if fields.noise_token_id is None or not fields.markov_rank:
            raise ValueError("a DSpark drafter needs dspark_noise_token_id and dspark_markov_rank")
        h = config.hidden_size
        self.fields, self.block_size, self.noise_id = fields, fields.block_size, fields.noise_token_id
        self.layers_config = config  # what `draft.dspark_disk` writes as transformer_layer_config
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.fc = nn.Linear(len(fields.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DSparkLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.markov_head = MarkovHead(config.vocab_size, fields.markov_rank)
        self.confidence_head = nn.Linear(h + fields.markov_rank, 1, bias=confidence_bias)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):  # noqa: ANN202
        """ids / positions [B, Q] block slots, targets [B, S, n*H] -> normed hidden [B, Q, H]."""
        x = self.embed_tokens(ids)
        context = self.hidden_norm(self.fc(targets))
        s = targets.shape[1]
        ctx_pos = torch.arange(s, device=ids.device).expand(ids.shape[0], s)
        rope_q = self.rotary_emb(x, positions)
        rope_k = self.rotary_emb(x, torch.cat([ctx_pos, positions], dim=1))
        for layer in self.layers:
            x = layer(x, context, rope_q, rope_k, mask)
        return self.norm(x)

    def _heads(self, hidden: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bias, embedded = self.markov_head(prev)
        confidence = self.confidence_head(torch.cat([hidden, embedded.to(hidden.dtype)], dim=-1)).squeeze(-1)
        return self.lm_head(hidden) + bias, confidence

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor
    ) -> BlockOutput:
        """Training pass, teacher-forced: input_ids [B, S] (the sequence), targets [B, S, n*H] (the target layers'
        states at each position), anchors / keep [B, nb]. Block j drafts the tokens at anchors_j + 1..bs. The Markov
        prev of slot k is the true token at anchor_j + k (ids past the end are clamped; mask them in the loss)."""
        b, s = input_ids.shape
        nb, bs = anchors.shape[1], self.block_size
        slots = torch.full((b, nb, bs), self.noise_id, dtype=torch.long, device=input_ids.device)
        slots[..., 0] = torch.where(keep, input_ids.gather(1, anchors), self.noise_id)
        hidden = self._layers(
            slots.flatten(1), block_positions(anchors, bs), targets, block_mask(anchors, keep, s, bs)
        ).view(b, nb, bs, -1)
        true_at = (anchors[..., None] + torch.arange(bs, device=anchors.device)).clamp(max=s - 1)  # [B, nb, bs]
        prev = input_ids.gather(1, true_at.flatten(1)).view(b, nb, bs)
        logits, confidence = self._heads(hidden, prev)
        return BlockOutput(logits=logits, confidence=confidence, hidden=hidden)

    @torch.no_grad()
    def draft_block(self, targets: torch.Tensor, last_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Serving: targets [B, S, n*H] for the verified positions 0..S-1, last_token [B] the token at position S
        (the one the target just sampled). Returns (draft tokens [B, bs] for positions S+1..S+bs, confidence logits
        [B, bs]). One pass of the layers; the Markov head then chains greedily over the slots."""
        b, s = targets.shape[0], targets.shape[1]
        bs = self.block_size
        anchors = torch.full((b, 1), s, dtype=torch.long, device=targets.device)
        slots = torch.full((b, bs), self.noise_id, dtype=torch.long, device=targets.device)
        slots[:, 0] = last_token
        keep = torch.ones(b, 1, dtype=torch.bool, device=targets.device)
        hidden = self._layers(slots, block_positions(anchors, bs), targets, block_mask(anchors, keep, s, bs))
        base = self.lm_head(hidden)  # [B, bs, vocab]
        prev, tokens, confidence = last_token, [], []
        for k in range(bs):
            bias, embedded = self.markov_head(prev)
            tokens.append((base[:, k] + bias).argmax(-1))
            confidence.append(self.confidence_head(torch.cat([hidden[:, k], embedded], dim=-1)).squeeze(-1))
            prev = tokens[-1]
        return torch.stack(tokens, dim=1), torch.stack(confidence, dim=1)


def eval_mask(anchors: torch.Tensor, keep: torch.Tensor, loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """bool [B, nb, bs]: slot k of block j is trained while its label (anchor + k + 1) is inside the sequence and in
    `loss_mask` [B, S], and so is every slot before it (a contiguous prefix, as acceptance is)."""
    s = loss_mask.shape[1]
    labels = anchors[..., None] + torch.arange(1, block_size + 1, device=anchors.device)
    inside = labels < s
    enabled = loss_mask.bool().gather(1, labels.clamp(max=s - 1).flatten(1)).view_as(labels)
    return (inside & enabled & keep[..., None]).int().cumprod(dim=-1).bool()


def dspark_loss(
    out: BlockOutput,
    labels: torch.Tensor,
    mask: torch.Tensor,
    target_logits: torch.Tensor | None = None,
    decay_gamma: float | None = None,
    weights: tuple[float, float, float] = (1.0, 0.0, 0.0),
) -> torch.Tensor:
    """DeepSpec's objective. labels / mask [B, nb, bs], target_logits [B, nb, bs, vocab] (the target's logits for
    the same tokens, needed for the second and third terms). Slot k weighs mask * exp(-k / decay_gamma). The loss
    is ce * CE + tv * sum |p_draft - p_target|_1 + conf * BCE(confidence, accept), with accept = 1 - 0.5 |p_d - p_t|_1
    (detached). Each term is normalised by the summed weights. weights = (ce, tv, conf)."""
    w = mask.float()
    if decay_gamma:
        w = w * torch.exp(-torch.arange(w.shape[-1], device=w.device).float() / decay_gamma)
    total = w.sum() + 1e-6
    ce_w, tv_w, conf_w = weights
    loss = (
        ce_w
        * (F.cross_entropy(out.logits.flatten(0, 2).float(), labels.flatten(), reduction="none") * w.flatten()).sum()
    )
    if tv_w or conf_w:
        if target_logits is None:
            raise ValueError("the total-variation and confidence terms need the target's logits")
        tv = (out.logits.float().softmax(-1) - target_logits.float().softmax(-1)).abs().sum(-1)  # [B, nb, bs]
        loss = loss + tv_w * (tv * w).sum()
        if conf_w:
            if out.confidence is None:
                raise ValueError("the confidence term needs the confidence head's output")
            accept = (1.0 - 0.5 * tv).clamp(0.0, 1.0).detach()
            bce = F.binary_cross_entropy_with_logits(out.confidence.float(), accept, reduction="none")
            loss = loss + conf_w * (bce * w).sum()
    return loss / total
