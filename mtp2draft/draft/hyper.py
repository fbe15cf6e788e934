"""The native MTP layer of a family whose residual is several streams (hyper-connections): DeepSeek-V4's.

Its hidden state is not one vector per token but `S` residual streams ([B, T, S, H], S = the config's `hc_mult`, the
spec's `[layer] streams`). Step 0 reads the target's last decoder layer output, all S streams, before the trunk's
`hc_head` reduction and final norm (`pre_norm`); a step hands on its block's output streams, the same shape, so
drafting chains on streams. Per step (vLLM 0.34 `vllm/models/deepseek_v4/nvidia/mtp.py`,
`DeepSeekV4MultiTokenPredictorLayer.forward` and `compute_logits`):

    x      = h_proj(hnorm(h)) + e_proj(enorm(embed))[:, :, None]     # [B, T, S, H]: hnorm per stream, e broadcast
    out    = block(x)                                                 # [B, T, S, H]: the decoder layer's hc mixers
    logits = head(norm(hc_head(out)))                                 # hc_head: S streams -> [B, T, H]

The block is transformers' own decoder layer (`DeepseekV4DecoderLayer`, sliding-window attention, top-k MoE, the
`attn_hc` / `ffn_hc` mixers); `hc_head` is its `DeepseekV4HyperHead` (the spec's `[block] head_mixer`). Nothing here
names the family: the spec says which classes and which config field.

What this module does not do: zero the embedding at position 0 (vLLM does, in its fused input norm; no other native
layer here does either), or read checkpoints (`layout.py` maps the keys through `GLUE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mtp2draft.draft.modules import DraftCache, NativeMtpDraft
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.kinds import Hidden


class HyperMtpDraft(NativeMtpDraft):
    """One multi-stream MTP layer (see the module docstring); the hidden it reads and hands on is [B, T, S, H]."""

    GLUE = {
        "enorm.weight": "enorm",
        "hnorm.weight": "hnorm",
        "e_proj.weight": "e_proj",
        "h_proj.weight": "proj",
        "hc_head.hc_fn": "hc_head_fn",
        "hc_head.hc_base": "hc_head_base",
        "hc_head.hc_scale": "hc_head_scale",
        "final_norm.weight": "final_norm",
    }
    DEFAULT_HANDOVER = Hidden.PRE_NORM  # the block's output streams: the reduced, normed hidden has lost them

    def __init__(self, spec: Spec, target_config: Mapping[str, Any], layer: int = 0, **options: Any) -> None:
        """As `NativeMtpDraft`; the hand-over is the block's output streams (`pre_norm`): the reduced, normed hidden
        has lost the streams the next step needs, so `post_norm` is refused."""
        options["hidden_handover"] = options.get("hidden_handover") or self.DEFAULT_HANDOVER
        if options["hidden_handover"] != Hidden.PRE_NORM:
            raise DraftError(
                f"a {spec.name} layer hands on its {spec.layer.streams} residual streams (pre_norm), "
                f"not {options['hidden_handover']!r}"
            )
        self.streams = spec.num_streams(target_config)
        super().__init__(spec, target_config, layer, **options)
        self._rope_types = [k for k, v in self.config.rope_parameters.items() if isinstance(v, dict)]

    def build_projection(self, cfg) -> None:
        """Two bias-free Linear(H -> H): `h_proj` on each stream of the hidden, `e_proj` on the embedding, summed;
        and the head that reduces the block's streams to one hidden (`hc_head`, kept in fp32 as the trunk's)."""
        h = cfg.hidden_size
        self.e_proj = nn.Linear(h, h, bias=False)
        self.h_proj = nn.Linear(h, h, bias=False)
        self.hc_head = self.spec.import_class(self.spec.block.head_mixer)(cfg).to(torch.float32)

    @property
    def hidden_shape(self) -> tuple[int, ...]:
        return (self.streams, self.hidden_size)

    def initial_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """Step 0 reads the target's last layer output as-is: [B, T, S, H] (the streams before its hc_head)."""
        self._check_streams(features)
        return features

    def _check_streams(self, hidden: torch.Tensor) -> None:
        if hidden.dim() != 4 or tuple(hidden.shape[-2:]) != self.hidden_shape:
            raise DraftError(
                f"this {self.spec.name} draft reads {self.streams} residual streams [B, T, {self.streams}, "
                f"{self.hidden_size}], got a hidden of shape {list(hidden.shape)}"
            )

    def position_embeddings(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        """cos / sin per rope type (the decoder layer's attention picks its own: `main` for sliding window)."""
        return {t: self.rotary_emb(x, position_ids, layer_type=t) for t in self._rope_types}

    def layer_forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DraftCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds [B, T, H], hidden [B, T, S, H] -> (normed reduced hidden [B, T, H], output streams [B, T, S, H])."""
        self._check_streams(hidden)
        x = self.h_proj(self.hnorm(hidden)) + self.e_proj(self.enorm(embeds)).unsqueeze(-2)  # [B, T, S, H]
        if attention_mask is None:
            attention_mask = self.default_mask(x, cache)
        out = self.block(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            position_embeddings=self.position_embeddings(x, position_ids),
        )  # [B, T, S, H]
        reduced = self.hc_head(out)  # [B, T, H]
        return (self.final_norm(reduced) if self.apply_final_norm else reduced), out
