"""DeepSeek-V4's DSpark drafter (the `mtp.0..2` stages of V4-Flash-0731): the block drafter of `draft.dspark` with
V4 decoder blocks. Written from vLLM 0.32 (CPU build) `vllm/models/deepseek_v4/nvidia/dspark.py`
(`DSparkDeepseekV4Model`, `DSparkDeepseekV4ForCausalLM`) and `vllm/v1/worker/gpu/spec_decode/dspark/speculator.py`;
docs/notes/2026-12-05-dspark-definition.md has each fact's source. Shapes: B batch, S context, Q block slots, hc the
`hc_mult` streams, H hidden, D head_dim:

    main_x  = main_norm(main_proj(targets))         # targets [B, S, n*H]: each target layer mean-pooled over hc
    x       = embed(slots).repeat over hc            # [B, Q, hc, H]: slot 0 the last verified token, then noise
    per stage i (a V4 block: hc_pre / attention / hc_post, hc_pre / MoE / hc_post):
        keys = values = [rope(kv_norm(wkv_i(main_x))) at 0..S-1 ; the block's own at anchor + 0..Q-1]
        a slot sees the context keys in [anchor - window, anchor - 1] and its whole block; the sink joins the softmax
    h       = hc_head(x)                              # [B, Q, H]: the last stage's hc_head, pre-norm
    logits  = head(norm(h)) + markov_w2(markov_w1(prev))
    conf    = confidence_head(cat(h, markov_w1(prev)))   # the pre-norm h, as the speculator passes it; fp32, no bias

Each stage is transformers' own `DeepseekV4DecoderLayer` (the spec's block class, as the native V4 MTP layer in
`draft.hyper`), run as-is: the context keys reach its attention through the cache argument (`ContextKV.update`
returns [context; block]), so rope, the per-head query norm, the sink, the inverse rope on the output and the grouped
output projection are transformers' code. Only the context keys are computed here, with the stage's own `kv_proj`
and `kv_norm` (vLLM's `precompute_and_store_context_kv`).

What this module does not do: read or write a directory (`draft.dspark_v4_io`), run the target (the caller passes
the pooled target states), or hash-route (DSpark stages sit past the trunk: vLLM builds them as top-k MoE layers).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtp2draft.draft.block_config import block_config, norm_eps
from mtp2draft.draft.dspark import BlockOutput, MarkovHead, block_mask, block_positions
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_spec


def _register(module: nn.Module, name: str, tensor: torch.Tensor | None) -> None:
    # non-persistent buffer: the target's tensor is read, never trained, never written into the draft's state
    module.register_buffer(name, None if tensor is None else tensor.detach(), persistent=False)


def pool_streams(layer_streams: Sequence[torch.Tensor]) -> torch.Tensor:
    """The drafter's `targets` from the target layers' outputs: per layer [B, S, hc, H] (its residual streams after
    the layer) -> [B, S, n*H], each layer's streams averaged, concatenated in `dspark_target_layer_ids` order (vLLM
    0.32 (CPU build) `vllm/models/deepseek_v4/nvidia/model.py`: `aux_recon.mean(dim=1)`)."""
    return torch.cat([s.mean(dim=-2) for s in layer_streams], dim=-1)


def stage_spec(target_config: Mapping[str, Any]) -> Spec:
    """The spec of the family whose decoder blocks the stages are: the target's, found with the `dspark_*` keys left
    out (`find_spec` refuses a config carrying them as not MTP, which is right for every MTP path)."""

    def plain(section: Any) -> Any:
        if not isinstance(section, Mapping):
            return section
        return {k: plain(v) if k == "text_config" else v for k, v in section.items() if not k.startswith("dspark_")}

    return find_spec(plain(target_config))


def v4_block_mask(
    anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int, window: int | None
) -> torch.Tensor:
    """`dspark.block_mask` with V4's sliding window over the context: bool [B, nb * bs, context_len + nb * bs]. A slot
    of the block anchored at a sees context keys at positions a - window .. a - 1 (vLLM 0.32 (CPU build)
    `vllm/v1/attention/backends/mla/sparse_swa.py`, `ComputeDSparkNoncausalSWAIndicesKernel`: start max(prefix_len -
    window_size, 0), end seq_len) and every slot of its block."""
    mask = block_mask(anchors, keep, context_len, block_size)
    if not window:
        return mask
    q_block = torch.arange(mask.shape[1], device=anchors.device) // block_size
    kv = torch.arange(mask.shape[2], device=anchors.device)
    too_old = (kv[None, None] < context_len) & (kv[None, None] < anchors[:, q_block][..., None] - window)
    return mask & ~too_old


class ContextKV:
    """What a V4 attention's `cache.update` returns for one stage: the context keys [B, 1, S, D] (already normed and
    rotated at positions 0..S-1) before the block's own. K = V in V4, so both halves are the same tensor."""

    def __init__(self, context: torch.Tensor) -> None:
        self.context = context

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int = 0, **_: Any):
        both = torch.cat([self.context.to(key.dtype), key], dim=-2)
        return both, both


class DSparkV4Draft(nn.Module):
    """DeepSeek-V4 DSpark stages (see the module docstring), with `DSparkDraft`'s interface: `fields`, `block_size`,
    `noise_id`, `forward(input_ids, targets, anchors, keep) -> BlockOutput` and `draft_block(targets, last_token)`.
    The target's embedding and head are attached (`attach_target`), never part of the state dict."""

    # module tensors outside the stage blocks -> (stage, release name relative to the stage prefix): "first" is
    # mtp.0's context fusion, "last" the head stack (vLLM 0.32 (CPU build) nvidia/dspark.py `_remap_dspark_name`)
    GLUE: dict[str, tuple[str, str]] = {
        "main_proj.weight": ("first", "main_proj.weight"),
        "main_norm.weight": ("first", "main_norm.weight"),
        "norm.weight": ("last", "norm.weight"),
        "hc_head.hc_fn": ("last", "hc_head_fn"),
        "hc_head.hc_base": ("last", "hc_head_base"),
        "hc_head.hc_scale": ("last", "hc_head_scale"),
        "markov_head.markov_w1.weight": ("last", "markov_head.markov_w1.weight"),
        "markov_head.markov_w2.weight": ("last", "markov_head.markov_w2.weight"),
        "confidence_head.weight": ("last", "confidence_head.proj.weight"),
    }

    def __init__(
        self, target_config: Mapping[str, Any], fields: DSparkFields, num_stages: int, spec: Spec | None = None
    ) -> None:
        super().__init__()
        if fields.noise_token_id is None or not fields.markov_rank:
            raise DraftError("a DSpark drafter needs dspark_noise_token_id and dspark_markov_rank")
        if num_stages < 1:
            raise DraftError(f"a DSpark drafter needs at least one stage, not {num_stages}")
        self.spec = spec or stage_spec(target_config)
        if not self.spec.layer.streams:
            raise DraftError(f"{self.spec.name}'s blocks carry one residual stream: this is DeepSeek-V4's DSpark")
        self.target_config = copy.deepcopy(dict(target_config))
        self.fields, self.block_size, self.noise_id = fields, fields.block_size, fields.noise_token_id
        self.num_stages = num_stages
        self.config = cfg = block_config(self.spec, self.target_config, 0)
        self.layers_config = cfg  # the stages' transformers config: hidden_size, vocab_size (as DSparkDraft's)
        h, eps = cfg.hidden_size, norm_eps(cfg)
        self.streams = self.spec.num_streams(self.target_config)
        self.window = getattr(cfg, "sliding_window", None)
        norm = self.spec.import_class(self.spec.block.norm)
        self.main_proj = nn.Linear(len(fields.target_layer_ids) * h, h, bias=False)
        self.main_norm = norm(h, eps=eps)
        self.layers = nn.ModuleList(self.spec.block_class()(cfg, 0) for _ in range(num_stages))
        self.hc_head = self.spec.import_class(self.spec.block.head_mixer)(cfg).to(torch.float32)
        self.norm = norm(h, eps=eps)
        self.markov_head = MarkovHead(cfg.vocab_size, fields.markov_rank)
        # fp32 and no bias, as vLLM builds it (qwen3_dspark.py DSparkConfidenceHead: params_dtype float32)
        self.confidence_head = nn.Linear(h + fields.markov_rank, 1, bias=False).to(torch.float32)
        self.rotary_emb = self.spec.import_class(self.spec.block.rotary)(config=cfg)
        self._rope_types = [k for k, v in cfg.rope_parameters.items() if isinstance(v, dict)]
        _register(self, "embed_weight", None)
        _register(self, "head_weight", None)

    def attach_target(self, embed: torch.Tensor, head: torch.Tensor) -> DSparkV4Draft:
        """Share the target's embedding [V, H] and head [V, H] (read-only; vLLM aliases both)."""
        _register(self, "embed_weight", embed)
        _register(self, "head_weight", head)
        return self

    def _target(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.embed_weight is None or self.head_weight is None:
            raise DraftError("the DSpark drafter needs the target's embedding and head: call attach_target()")
        return self.embed_weight, self.head_weight

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {t: self.rotary_emb(x, positions, layer_type=t) for t in self._rope_types}

    def _context_kv(self, layer: nn.Module, main_x: torch.Tensor, rope: dict) -> torch.Tensor:
        """The stage's keys of the context: [B, 1, S, D], its own kv_proj and kv_norm on main_x, rotated at 0..S-1."""
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb

        attn = layer.self_attn
        kv = attn.kv_norm(attn.kv_proj(main_x)).unsqueeze(1)
        cos, sin = rope[attn.rope_layer_type]
        return apply_rotary_pos_emb(kv, cos, sin)

    def head_hidden(
        self, ids: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """ids / positions [B, Q] block slots, targets [B, S, n*H], mask bool [B, Q, S + Q] -> the last stage's
        hc_head output [B, Q, H], before the final norm (what vLLM's model returns)."""
        embed, _ = self._target()
        b, s = ids.shape[0], targets.shape[1]
        main_x = self.main_norm(self.main_proj(targets.to(self.main_proj.weight.dtype)))  # [B, S, H]
        x = F.embedding(ids, embed).to(main_x.dtype)
        streams = x.unsqueeze(-2).repeat(1, 1, self.streams, 1)  # [B, Q, hc, H]: the embedding on every stream
        rope_q = self._rope(x, positions)
        rope_k = self._rope(main_x, torch.arange(s, device=ids.device).expand(b, s))
        additive = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)
        additive = additive.masked_fill(~mask, torch.finfo(x.dtype).min)[:, None]  # [B, 1, Q, S + Q]
        for layer in self.layers:
            streams = layer(
                streams,
                attention_mask=additive,
                position_ids=positions,
                cache=ContextKV(self._context_kv(layer, main_x, rope_k)),
                position_embeddings=rope_q,
            )
        return self.hc_head(streams)

    def _logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pre-norm hidden [..., H] -> (normed [..., H], head logits [..., V])."""
        _, head = self._target()
        normed = self.norm(hidden)
        return normed, F.linear(normed, head.to(normed.dtype))

    def _confidence(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden, embedded.to(hidden.dtype)], dim=-1).float()
        return F.linear(x, self.confidence_head.weight.float()).squeeze(-1)

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor
    ) -> BlockOutput:
        """Training pass, teacher-forced, as `DSparkDraft.forward`: input_ids [B, S], targets [B, S, n*H], anchors /
        keep [B, nb]. Block j drafts the tokens at anchors_j + 1..bs; slot k's Markov prev is the true token at
        anchor_j + k (clamped past the end: mask those in the loss)."""
        b, s = input_ids.shape
        nb, bs = anchors.shape[1], self.block_size
        slots = torch.full((b, nb, bs), self.noise_id, dtype=torch.long, device=input_ids.device)
        slots[..., 0] = torch.where(keep, input_ids.gather(1, anchors), self.noise_id)
        mask = v4_block_mask(anchors, keep, s, bs, self.window)
        hidden = self.head_hidden(slots.flatten(1), block_positions(anchors, bs), targets, mask).view(b, nb, bs, -1)
        true_at = (anchors[..., None] + torch.arange(bs, device=anchors.device)).clamp(max=s - 1)
        prev = input_ids.gather(1, true_at.flatten(1)).view(b, nb, bs)
        bias, embedded = self.markov_head(prev)
        normed, base = self._logits(hidden)
        return BlockOutput(
            logits=base + bias.to(base.dtype), confidence=self._confidence(hidden, embedded), hidden=normed
        )

    @torch.no_grad()
    def draft_block(self, targets: torch.Tensor, last_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Serving, as `DSparkDraft.draft_block`: targets [B, S, n*H] at the verified positions 0..S-1, last_token
        [B] the token at S. Returns (draft tokens [B, bs] for S+1..S+bs, confidence logits [B, bs]): one pass of
        the stages, then the Markov head chained greedily (the speculator's `_sample_sequential`, argmax)."""
        b, s = targets.shape[0], targets.shape[1]
        bs, device = self.block_size, targets.device
        anchors = torch.full((b, 1), s, dtype=torch.long, device=device)
        slots = torch.full((b, bs), self.noise_id, dtype=torch.long, device=device)
        slots[:, 0] = last_token
        keep = torch.ones(b, 1, dtype=torch.bool, device=device)
        mask = v4_block_mask(anchors, keep, s, bs, self.window)
        hidden = self.head_hidden(slots, block_positions(anchors, bs), targets, mask)  # [B, bs, H]
        _, base = self._logits(hidden)
        prev, tokens, confidence = last_token, [], []
        for k in range(bs):
            bias, embedded = self.markov_head(prev)
            tokens.append((base[:, k] + bias.to(base.dtype)).argmax(-1))
            confidence.append(self._confidence(hidden[:, k], embedded))
            prev = tokens[-1]
        return torch.stack(tokens, dim=1), torch.stack(confidence, dim=1)
