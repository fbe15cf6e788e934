"""The step every draft module exposes (`DraftModule`, its `DraftCache`) and the native MTP draft (`NativeMtpDraft`);
the EAGLE-3 draft is `draft/eagle3.py`'s, a multi-stream layer `hyper.py`'s. Their directories are read by `disk.py`;
several MTP layers chain in `chain.py`.

`NativeMtpDraft` is the MTP layer exactly as its family's checkpoint defines it: two RMSNorms, the concat in the
family's order, the bias-free Linear(2H -> H), the family's own decoder block (a transformers class, never
re-implemented here), the final norm and the target's lm_head.

Every draft exposes the same step so distillation and evaluation treat them alike (shapes: B batch, T tokens, H hidden):

    hidden0 = draft.initial_hidden(features)               # [B, T, H] from the target's features
    logits, hidden = draft(input_ids, hidden, position_ids, attention_mask=None, cache=None)
    # logits [B, T, V_draft]; hidden [B, T, H] is what the next draft step consumes

A layer whose hidden state is several residual streams (DeepSeek-V4's hyper-connections, `hyper.HyperMtpDraft`) reads
and hands on [B, T, S, H] instead: `draft.hidden_shape` is what follows [B, T]. Stages pass the hidden through as-is.

`draft.hidden_handover` says which hidden a step hands on: EAGLE-3 engines feed back the pre-norm output. A native MTP
draft computes what ONE engine computes, and its config records which (`engine`): the target hidden step 0 reads
(`input_hidden`), whether the final norm is applied (`final_norm`) and the hidden handed on (`hidden_handover`). The
values per engine and family are data (the spec's `[engines.*]` tables; docs/engines.md, "How each engine computes a
native MTP layer"). Without an engine, a draft computes the checkpoint's own layer (`[layer]`) and hands on the
post-norm hidden.

The target's embedding (and, for the native draft, its lm_head) are attached as non-persistent buffers: the draft
reads them, no optimizer sees them, and they are never written into a draft directory.

What this module does not do: read hub checkpoints (`checkpoint/reader.py`), initialise EAGLE-3 from an MTP layer (`eagle3/`),
or train (`train/recipe.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtp2draft.draft.block_config import block_config, norm_eps
from mtp2draft.draft.selection import with_draft_mask
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.kinds import (
    HIDDEN_PLACES,
    DraftKind,
    Hidden,
)

DRAFT_FORMAT_VERSION = 1


class DraftCache:
    """Minimal KV cache for one draft layer: the only call decoder layers make is `update`, plus `crop` for us.

    Entries are concatenated along the sequence axis (-2). Works for plain K/V and for MLA's compressed latents.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.indexer: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int = 0, **_: Any):
        self.keys = key if self.keys is None else torch.cat([self.keys, key], dim=-2)
        self.values = value if self.values is None else torch.cat([self.values, value], dim=-2)
        return self.keys, self.values

    def update_indexer(self, key: torch.Tensor, layer_idx: int = 0, **_: Any) -> torch.Tensor:
        self.indexer = key if self.indexer is None else torch.cat([self.indexer, key], dim=-2)
        return self.indexer

    @property
    def layers(self) -> tuple[DraftCache]:
        """The per-layer view attentions read their own length from (GLM-5.3's indexer): one layer, this cache."""
        return (self,)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def crop(self, length: int) -> None:
        """Keep the first `length` entries (drop rejected draft positions)."""
        if self.keys is not None:
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]
        if self.indexer is not None:
            self.indexer = self.indexer[..., :length, :]


def attach_buffer(module: nn.Module, name: str, tensor: torch.Tensor | None) -> None:
    # Non-persistent buffer: moves with .to(), is never in state_dict(), never seen by an optimizer.
    module.register_buffer(name, None if tensor is None else tensor.detach(), persistent=False)


# ---- native MTP ---------------------------------------------------------------------------------------------------
class ComposedBlock(nn.Module):
    """Pre-norm decoder block from a family's attention and MLP classes, for families whose decoder-layer class
    is not the MTP block (LongCat-Flash's MTP block is MLA + dense MLP; its trunk layer is a dual-branch MoE)."""

    def __init__(self, spec: Spec, config) -> None:
        super().__init__()
        norm = spec.import_class(spec.block.norm)
        self.input_layernorm = norm(config.hidden_size, eps=norm_eps(config))
        attention = spec.import_class(spec.block.attention_class)
        self.selects = bool(spec.block.selection_mask)  # the attention reads valid queries, the mask goes to the hook
        if self.selects:
            attention = with_draft_mask(attention, spec.block.selection_mask)
        self.self_attn = attention(config, 0)
        self.post_attention_layernorm = norm(config.hidden_size, eps=norm_eps(config))
        self.mlp = spec.import_class(spec.block.mlp_class)(config)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, position_embeddings=None):
        residual = hidden_states
        if self.selects:  # all B x T queries valid; the draft's mask hides keys through the selection hook
            self.self_attn.draft_mask = attention_mask
            attention_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        out = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            position_embeddings=position_embeddings,
        )
        if self.selects:
            self.self_attn.draft_mask = None
        hidden_states = residual + (out[0] if isinstance(out, tuple) else out)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DraftModule(nn.Module):
    """What every draft module shares (a chain of native layers too, `chain.MtpChainDraft`): sizes from the
    transformers config, and one draft step (`forward`): the target's embedding of the input ids, the layer
    (`layer_forward`: post-final-norm and pre-norm outputs), the head (`logits`) and the hidden the next step consumes
    (`hidden_handover`: `post_norm` or `pre_norm`). A chain's step is its layer's (`step_layer` picks it)."""

    config: Any
    hidden_handover: str

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def hidden_shape(self) -> tuple[int, ...]:
        """The hand-over's shape after [B, T]: (H,), or (streams, H) for a multi-stream layer (`hyper.py`)."""
        return (self.hidden_size,)

    def missing_target(self) -> str | None:
        """Why `forward` cannot run yet (a target tensor not attached), or None."""
        raise NotImplementedError

    def layer_forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, *args: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_layer(self, step: int, cache: Any) -> tuple[DraftModule, DraftCache | None]:
        """The layer that runs draft step `step`, and its cache: a one-layer draft itself, at every step."""
        return self, cache

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        step: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, T], hidden [B, T, H] -> (logits [B, T, V or Vd], the hidden the next step reads [B, T, H]).

        cache: the draft's `new_cache()`; step: the draft step (0-based), which picks the layer (`step_layer`)."""
        layer, cache = self.step_layer(step, cache)
        if layer is not self:  # a chain's layer: its own step, called as a module so its hooks (FSDP's unshard) run
            return layer(input_ids, hidden, position_ids, attention_mask, cache)
        missing = self.missing_target()
        if missing:
            raise DraftError(missing)
        embeds = F.embedding(input_ids, self.embed_weight).to(hidden.dtype)  # [B, T, H]
        normed, out = self.layer_forward(embeds, hidden, position_ids, attention_mask, cache)
        return self.logits(normed), (normed if self.hidden_handover == Hidden.POST_NORM else out)


class NativeMtpDraft(DraftModule):
    """One MTP layer of `spec`'s family, computed as the checkpoint defines it."""

    kind = DraftKind.MTP
    GLUE = {
        "enorm.weight": "enorm",
        "hnorm.weight": "hnorm",
        "eh_proj.weight": "proj",
        "final_norm.weight": "final_norm",
    }
    """Module tensors outside the block -> the `[keys]` component each is stored under (`layout.py` maps by it)."""
    OWN_HEAD = {"own_head.weight": "head"}
    """The layer's own lm_head [V, H], where the family has one (`[layer] own_head`): frozen, written back as read."""
    DEFAULT_HANDOVER = Hidden.POST_NORM
    """The hand-over of this layer kind when none is asked for: the only place it is decided (`convert` writes it
    through `build.converted_config`, a module built without one takes it)."""

    def __init__(
        self,
        spec: Spec,
        target_config: Mapping[str, Any],
        layer: int = 0,
        hidden_handover: str | None = None,
        input_hidden: str | None = None,
        final_norm: bool = True,
        engine: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        hidden_handover = hidden_handover or self.DEFAULT_HANDOVER  # the layer kind's own, decided by its class
        for name, value in (("hidden_handover", hidden_handover), ("input_hidden", input_hidden or Hidden.POST_NORM)):
            if value not in HIDDEN_PLACES:
                raise DraftError(f"{name} must be post_norm or pre_norm, got {value!r}")
        self.spec = spec
        self.target_config = dict(target_config)
        self.layer = layer
        self.hidden_handover = hidden_handover
        self.input_hidden = input_hidden or spec.layer.hidden
        """Target hidden step 0 reads: before (`pre_norm`) or after (`post_norm`) the target's final norm."""
        self.apply_final_norm = bool(final_norm)
        """False where the serving engine applies no final norm (ERNIE-4.5): logits and hand-over read the block
        output."""
        self.engine = dict(engine) if engine else None
        """{"name", "version"} of the engine whose computation this draft is trained for; None: the checkpoint's."""
        self.config = cfg = block_config(spec, target_config, layer)
        norm = spec.import_class(spec.block.norm)
        h = cfg.hidden_size
        eps = norm_eps(cfg)
        self.enorm = norm(h, eps=eps)
        self.hnorm = norm(h, eps=eps)
        self.build_projection(cfg)
        self.block = spec.block_class()(cfg, 0) if spec.block.decoder_layer else ComposedBlock(spec, cfg)
        self.final_norm = norm(h, eps=eps)
        if spec.layer.own_head:  # [V, H], never trained: the engines' logits of this layer read it
            self.own_head = nn.Linear(h, cfg.vocab_size, bias=False).requires_grad_(False)
        # No rotary (`[block] rotary = ""`): the block's attention uses no positional encoding (Nemotron-H's NoPE).
        self.rotary_emb = spec.import_class(spec.block.rotary)(config=cfg) if spec.block.rotary else None
        # Rotaries with per-layer-type frequencies (MiMo-V2-Flash) take the layer type the block was built as.
        layer_types = getattr(cfg, "layer_types", None)
        takes_type = (
            self.rotary_emb is not None and "layer_type" in inspect.signature(self.rotary_emb.forward).parameters
        )
        self._rotary_kwargs = {"layer_type": layer_types[0]} if layer_types and takes_type else {}
        attach_buffer(self, "embed_weight", None)
        attach_buffer(self, "head_weight", None)

    @classmethod
    def glue(cls, spec: Spec) -> dict[str, str]:
        """`GLUE`, plus the layer's own lm_head where the family has one."""
        return {**cls.GLUE, **(cls.OWN_HEAD if spec.layer.own_head else {})}

    def build_projection(self, cfg) -> None:
        """The projection of the two normalised inputs: one bias-free Linear(2H -> H) of their concatenation."""
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def attach_target(self, embed: torch.Tensor, head: torch.Tensor) -> NativeMtpDraft:
        """Share the target's embedding [V, H] and lm_head [V, H] (read-only)."""
        attach_buffer(self, "embed_weight", embed)
        attach_buffer(self, "head_weight", head)
        return self

    def new_cache(self) -> DraftCache:
        return DraftCache()

    def initial_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """Step 0 reads the target's final hidden state as-is ([B, T, H]; pre- or post-norm per the spec)."""
        return features

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def train_for_engine(self, engine: str) -> None:
        """Compute what `engine`'s native MTP module computes for this family (the spec's `[engines.<engine>]`)."""
        facts = self.spec.engine_computation(engine)  # SpecError when the engine serves no native MTP draft
        self.input_hidden = facts["input_hidden"]
        self.apply_final_norm = facts["final_norm"]
        self.hidden_handover = facts["hidden_handover"]
        engine_facts = self.spec.engine(engine)
        self.engine = {"name": engine, "version": engine_facts.version if engine_facts else ""}

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Everything but tensors the layer shares with the trunk: when the family's final norm IS the trunk's
        (ERNIE applies `model.norm`), it stays frozen, or writing the layer back would change the target. A final
        norm the computation does not apply is frozen too (it gets no gradient)."""
        shared = self.spec.keys.final_norm == self.spec.keys.target_norm or not self.apply_final_norm
        return [
            p for n, p in self.named_parameters() if p.requires_grad and not (shared and n.startswith("final_norm."))
        ]

    @property
    def attention_window(self) -> int | None:
        """Sliding window of the block's attention (keys within `window` positions), None for full attention."""
        window = getattr(getattr(self.block, "self_attn", None), "sliding_window", None)
        return int(window) if window else None

    def missing_target(self) -> str | None:
        if self.embed_weight is None or self.head_weight is None:
            return "the native draft needs the target's embedding and lm_head: call attach_target()"
        return None

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        own = getattr(self, "own_head", None)  # the layer's own head, else the target's
        return F.linear(normed, (self.head_weight if own is None else own.weight).to(normed.dtype))  # [B, T, V]

    def layer_forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DraftCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer without embedding and head: (post-final-norm [B, T, H], pre-norm block output [B, T, H]).

        Used directly when the embedding and head are live trainable tensors (joint training of a target)."""
        e, h = self.enorm(embeds), self.hnorm(hidden)
        x = self.eh_proj(torch.cat([e, h] if self.spec.layer.concat == "embed_hidden" else [h, e], dim=-1))
        position_embeddings = (
            self.rotary_emb(x, position_ids, **self._rotary_kwargs) if self.rotary_emb is not None else None
        )
        if attention_mask is None:
            attention_mask = self.default_mask(x, cache)
        out = self.block(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            position_embeddings=position_embeddings,
        )
        if isinstance(out, tuple):  # decoder layers returning (hidden, extras): GLM-5's (hidden, DSA top-k indices)
            out = out[0]
        return (self.final_norm(out) if self.apply_final_norm else out), out

    def default_mask(self, x: torch.Tensor, cache: DraftCache | None = None) -> torch.Tensor | None:
        """The causal mask used when the caller passes none: None where SDPA's own causal path suffices, else an
        additive [1, 1, T, past + T] mask (query i sits at past + i), limited to the block attention's sliding
        window when it has one (key j visible iff q - window < j <= q, as transformers' sliding-window masks)."""
        window = getattr(getattr(self.block, "self_attn", None), "sliding_window", None)
        t = x.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        if self.config._attn_implementation == "sdpa" and not window and (past == 0 or t == 1):
            return None  # SDPA's causal path aligns queries to the first keys: right only without a cached past
        q = torch.arange(past, past + t, device=x.device)[:, None]
        k = torch.arange(past + t, device=x.device)[None, :]
        allowed = (k <= q) & (k > q - int(window)) if window else k <= q
        mask = torch.zeros(t, past + t, dtype=x.dtype, device=x.device)
        return mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]

    def draft_config(self) -> dict[str, Any]:
        return native_config(
            self.spec,
            self.target_config,
            self.layer,
            hidden_handover=self.hidden_handover,
            input_hidden=self.input_hidden,
            final_norm=self.apply_final_norm,
            engine=self.engine,
        )

    def computation(self) -> dict[str, Any]:
        """What this draft computes, as the config records it (compare with `Spec.engine_computation`)."""
        return {
            "input_hidden": self.input_hidden,
            "final_norm": self.apply_final_norm,
            "hidden_handover": self.hidden_handover,
        }


def native_config(
    spec: Spec,
    target_config: Mapping[str, Any],
    layer: int,
    *,
    hidden_handover: str,
    input_hidden: str | None = None,
    final_norm: bool = True,
    engine: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """config.json of a native MTP draft directory: enough to rebuild the module without the target checkpoint.
    hidden_handover has no default here: the layer kind's own is its class's `DEFAULT_HANDOVER`
    (`build.converted_config`)."""
    text = spec.text_config(target_config)
    return {
        "architectures": ["Mtp2DraftNativeMtp"],
        "draft_kind": DraftKind.MTP,
        "format_version": DRAFT_FORMAT_VERSION,
        "spec": spec.name,
        "mtp_layer": layer,
        "hidden_handover": hidden_handover,
        "input_hidden": input_hidden or spec.layer.hidden,
        "final_norm": bool(final_norm),
        "engine": dict(engine) if engine else None,
        "hidden_size": int(text["hidden_size"]),
        "vocab_size": int(text["vocab_size"]),
        "target_config": dict(target_config),
    }
