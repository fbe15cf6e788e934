"""The EAGLE-3 draft (`Eagle3Draft`): the engines' EAGLE-3 layer (`LlamaForCausalLMEagle3` in SGLang, weights named
exactly as it loads them): `fc` fusing three target layers, one Llama-shaped layer whose q/k/v read [embed, hidden]
(2H wide), `norm`, an own `lm_head` over the draft vocabulary, and `d2t` / `t2d` mapping draft ids to target ids. It
exposes the step of `modules.DraftModule` and hands on the pre-norm output.

What this module does not do: initialise the layer from an MTP layer (`eagle3/`), read or write its config.json
(`eagle3_config.py`, `config.py`), or train (`train/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mtp2draft.draft.eagle3_config import LLAMA_FIELDS, aux_ids
from mtp2draft.draft.modules import DraftCache, DraftModule, NativeMtpDraft, attach_buffer
from mtp2draft.kinds import (
    DraftKind,
    Hidden,
)


# ---- EAGLE-3 ------------------------------------------------------------------------------------------------------
def llama_config(cfg: Mapping[str, Any]):
    """transformers LlamaConfig for the EAGLE-3 layer from an EAGLE-3 config.json dict."""
    from transformers import LlamaConfig

    # the EAGLE-3 config's Llama fields; RoPE goes through rope_parameters below
    names = [k for k in (*LLAMA_FIELDS, "vocab_size") if k not in ("rope_theta", "rope_scaling")]
    fields = {k: cfg[k] for k in names if k in cfg}
    rope = dict(cfg.get("rope_scaling") or {"rope_type": "default"})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
    out = LlamaConfig(**fields, rope_parameters=rope, attention_bias=False, mlp_bias=False)
    out._attn_implementation = "sdpa"
    return out


class Eagle3Layer(nn.Module):
    """SGLang's `midlayer`: attention over [input_layernorm(embed), hidden_norm(h)] (2H wide), residual from h."""

    def __init__(self, config) -> None:
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = LlamaAttention(config, 0)
        # q/k/v read the concatenation [embed, hidden]: 2H wide (the only change to the Llama layer).
        attn = self.self_attn
        attn.q_proj = nn.Linear(2 * h, config.num_attention_heads * attn.head_dim, bias=False)
        attn.k_proj = nn.Linear(2 * h, config.num_key_value_heads * attn.head_dim, bias=False)
        attn.v_proj = nn.Linear(2 * h, config.num_key_value_heads * attn.head_dim, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds, hidden, position_embeddings, attention_mask=None, cache=None):
        residual = hidden  # the UN-normalised h
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H], embed first
        attn, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask, cache=cache)
        residual = residual + attn
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Draft(DraftModule):
    """The EAGLE-3 draft in SGLang's layout (weights named exactly as `LlamaForCausalLMEagle3` loads them)."""

    kind = DraftKind.EAGLE3
    hidden_handover = Hidden.PRE_NORM

    def __init__(self, config: Mapping[str, Any]) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.eagle_config = dict(config)
        self.config = cfg = llama_config(config)
        h = cfg.hidden_size
        ht = int(config.get("target_hidden_size") or h)
        vd = int(config.get("draft_vocab_size") or cfg.vocab_size)
        self.fc = nn.Linear(3 * ht, h, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        # Identity maps (the first vd target ids) until a draft vocabulary is chosen (distill --draft-vocab-size).
        self.register_buffer("d2t", torch.zeros(vd, dtype=torch.int64))
        self.register_buffer("t2d", torch.arange(cfg.vocab_size) < vd)
        self.rotary_emb = LlamaRotaryEmbedding(config=cfg)
        attach_buffer(self, "embed_weight", None)

    @property
    def aux_layer_ids(self) -> list[int]:
        """Target layers (0-based, 'output of layer i') whose outputs `fc` fuses, low to high: the top-level
        ('input of layer i') ids - 1, as every engine reads them; `eagle_config`'s copy is in SGLang's terms, which
        depend on the target family (see `draft.eagle3_config.sglang_aux_ids`)."""
        return aux_ids(self.eagle_config)

    @property
    def draft_vocab_size(self) -> int:
        return int(self.lm_head.out_features)

    def attach_target(self, embed: torch.Tensor, head: torch.Tensor | None = None) -> Eagle3Draft:
        """Share the target's embedding [V, H] (read-only). The lm_head is the draft's own."""
        attach_buffer(self, "embed_weight", embed)
        return self

    def new_cache(self) -> DraftCache:
        return DraftCache()

    def initial_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """features: [B, T, 3*Ht] = cat(low, mid, high) target layer outputs -> [B, T, H]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def missing_target(self) -> str | None:
        return (
            "the EAGLE-3 draft needs the target's embedding: call attach_target()"
            if self.embed_weight is None
            else None
        )

    def layer_forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor, *mask_cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(out), out [B, T, H]); the pre-norm `out` is what the next step consumes (`hidden_handover`)."""
        out = self.midlayer(embeds, hidden, self.rotary_emb(hidden, position_ids), *mask_cache)
        return self.norm(out), out

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.lm_head(normed)  # [B, T, Vd]

    def draft_config(self) -> dict[str, Any]:
        return dict(self.eagle_config)


Draft = NativeMtpDraft | Eagle3Draft


# ---- d2t / t2d --------------------------------------------------------------------------------------------------------
def vocab_maps(used: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t [Vd] int64 offsets and t2d [V] bool from the target ids kept in the draft vocabulary.

    `used` is sorted ascending first, so draft id i maps to target id used[i] = i + d2t[i].
    """
    used = torch.sort(torch.as_tensor(used, dtype=torch.int64).unique()).values
    d2t = used - torch.arange(used.numel(), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


VOCAB_MAPS = ("d2t", "t2d")


def without_identity_maps(state: Mapping[str, torch.Tensor], vocab_size: int, draft_vocab_size: int) -> dict:
    """`state` minus d2t/t2d when the draft vocabulary is the target's whole vocabulary.

    vLLM 0.32's Eagle3LlamaForCausalLM creates `draft_id_to_target_id` (where it loads d2t) only when the vocabularies
    differ, so a full-vocabulary draft that carries d2t fails to load ("no module or parameter named
    'draft_id_to_target_id'"); speculators omits both maps for full vocabularies too. Every EAGLE-3 draft mtp2draft
    writes goes through here; `load_draft` puts the identity maps back."""
    if draft_vocab_size != vocab_size:
        return dict(state)
    return {k: v for k, v in state.items() if k not in VOCAB_MAPS}
