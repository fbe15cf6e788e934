"""A native draft that holds every MTP layer a checkpoint ships and runs them as a chain.

Step s of a draft chain runs MTP layer `layer_at(s)` of the draft's n layers, by the draft's step rule: `cycle`
(layer s % n) or `first` (layer 0 at every step). Which engine applies which rule, with the engine sources read, is
docs/engines.md's "Several MTP layers".

Each layer keeps its own KV cache (engines give each MTP module its own attention layers). What a layer's cache holds
is the *forced chain*: at decoding time, once tokens are known, the chain is run from every origin p with the known
tokens, and layer l's entry for origin p (its input: the hidden layer l's previous step handed on at p, the token at
p + f + 1 where f is the first step that runs layer l; RoPE position p + f + 1) is kept. A chain drafting from origin o
therefore sees, in layer l's cache, the forced entries of origins <= o - f (the ones whose tokens are all known) and its
own entries of this chain; origins o - f + 1 .. o - 1 have no entry in layer l (vLLM fills those slots with entries
from the previous round's drafts; mtp2draft leaves them out, so the computation is a function of the accepted tokens
alone). With one layer (or the `first` rule) this is exactly the single-layer draft's computation
(`modules.NativeMtpDraft`): f = 0, the step-0 entries of every origin.

Training-time test (`train/ttt.py`) unrolls the same computation: step s's query of origin p sees, in layer l's
blocks, the first block (step f) at origins p' <= p - f and p' = p, and later blocks of layer l (steps f + n, ...) at
p' = p only. `tests/test_chain.py` proves the unrolled computation equals the decoding-time chain.

On disk (format_version 2): config.json as a single-layer native draft plus `num_layers`, `mtp_layers` (the
checkpoint's layer index of each draft layer, in step order) and `step_layers`; weights `layers.{j}.<native key>`. A
version-1 directory is a one-layer draft and loads as `NativeMtpDraft`, unchanged.

What this module does not do: decide which rule an engine applies (the spec's `[engines.*] step_layers`), decode
(`evaluation/decode.py`) or read hub checkpoints (`conversion.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from mtp2draft.draft.build import native_draft
from mtp2draft.draft.modules import DraftCache, DraftModule, NativeMtpDraft
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import STEP_LAYER_RULES, Spec

CHAIN_FORMAT_VERSION = 2
DEFAULT_RULE = "cycle"


def layer_at(step: int, num_layers: int, rule: str) -> int:
    """The draft layer step `step` (0-based) runs under `rule`."""
    if rule not in STEP_LAYER_RULES:
        raise DraftError(f"step_layers must be one of {', '.join(STEP_LAYER_RULES)}, got {rule!r}")
    return step % num_layers if rule == "cycle" else 0


def first_steps(num_layers: int, rule: str, steps: int) -> list[int]:
    """For each layer a chain of `steps` steps runs, the first step that runs it (the forced chain's step for that
    layer), in step order: cycle [0, 1, .., min(n, steps) - 1]; first [0]."""
    seen: dict[int, int] = {}
    for s in range(steps):
        seen.setdefault(layer_at(s, num_layers, rule), s)
    return list(seen.values())


class ChainCache:
    """One `DraftCache` per draft layer."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [DraftCache() for _ in range(num_layers)]

    def __getitem__(self, layer: int) -> DraftCache:
        return self.layers[layer]


class MtpChainDraft(DraftModule):
    """n native MTP layers of one family run as a chain (`layer_at`): the draft step of `NativeMtpDraft`, where the
    step index picks the layer, and a `ChainCache` instead of one cache.

        logits, hidden = draft(input_ids, hidden, position_ids, attention_mask=None, cache=chain_cache, step=s)

    layer_options: what each layer computes (`NativeMtpDraft`'s hidden_handover, input_hidden, final_norm, engine),
    the same for every layer.
    """

    kind = NativeMtpDraft.kind

    def __init__(
        self,
        spec: Spec,
        target_config: Mapping[str, Any],
        mtp_layers: Sequence[int],
        step_layers: str = DEFAULT_RULE,
        **layer_options: Any,
    ) -> None:
        super().__init__()
        if not mtp_layers:
            raise DraftError("a chain draft needs at least one MTP layer")
        layer_at(0, 1, step_layers)  # checks the rule
        self.layers = nn.ModuleList([native_draft(spec, target_config, i, **layer_options) for i in mtp_layers])
        self.spec = spec
        self.target_config = dict(target_config)
        self.mtp_layers = [int(i) for i in mtp_layers]
        self.step_layers = step_layers

    # ---- what the stages ask of a draft (the same as NativeMtpDraft's) ------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def config(self):
        return self.layers[0].config

    @property
    def layer(self) -> int:
        return self.mtp_layers[0]

    @property
    def input_hidden(self) -> str:
        return self.layers[0].input_hidden

    @property
    def hidden_handover(self) -> str:
        return self.layers[0].hidden_handover

    @hidden_handover.setter
    def hidden_handover(self, value: str) -> None:
        for m in self.layers:
            m.hidden_handover = value

    @property
    def apply_final_norm(self) -> bool:
        return self.layers[0].apply_final_norm

    @property
    def engine(self) -> dict[str, str] | None:
        return self.layers[0].engine

    @property
    def embed_weight(self) -> torch.Tensor | None:
        return self.layers[0].embed_weight

    @property
    def head_weight(self) -> torch.Tensor | None:
        return self.layers[0].head_weight

    @property
    def attention_window(self) -> int | None:
        return self.layers[0].attention_window

    def layer_at(self, step: int) -> int:
        return layer_at(step, self.num_layers, self.step_layers)

    def first_steps(self, steps: int) -> list[int]:
        return first_steps(self.num_layers, self.step_layers, steps)

    def new_cache(self) -> ChainCache:
        return ChainCache(self.num_layers)

    def attach_target(self, embed: torch.Tensor, head: torch.Tensor) -> MtpChainDraft:
        for m in self.layers:  # the same tensors: no copy per layer
            m.attach_target(embed, head)
        return self

    def missing_target(self) -> str | None:
        return self.layers[0].missing_target()

    def initial_hidden(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def train_for_engine(self, engine: str) -> None:
        """Each layer computes what `engine` computes; the chain follows `engine`'s step rule where the spec states
        one (else keeps its own)."""
        if not self.spec.runs(engine, "mtp", self.num_layers):
            raise DraftError(self.spec.no_chain(engine, self.num_layers))
        for m in self.layers:
            m.train_for_engine(engine)
        facts = self.spec.engine(engine)
        if facts is not None and facts.step_layers:
            self.step_layers = facts.step_layers

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every layer's (`NativeMtpDraft.trainable_parameters`); under the `first` rule only layer 0 runs, so only
        layer 0 trains (the others get no gradient and stay as they are)."""
        used = {self.layer_at(s) for s in range(self.num_layers)}
        return [p for i, m in enumerate(self.layers) if i in used for p in m.trainable_parameters()]

    def step_layer(self, step: int, cache: ChainCache | None) -> tuple[NativeMtpDraft, DraftCache | None]:
        """Draft step `step` runs layer `layer_at(step)` with that layer's cache: `DraftModule.forward` hands the
        step to it."""
        i = self.layer_at(step)
        return self.layers[i], (cache[i] if cache is not None else None)

    def computation(self) -> dict[str, Any]:
        return {**self.layers[0].computation(), "step_layers": self.step_layers}

    def draft_config(self) -> dict[str, Any]:
        return chain_config(self.layers[0].draft_config(), self.mtp_layers, self.step_layers)


def chain_config(
    layer_config: Mapping[str, Any], mtp_layers: Sequence[int], step_layers: str = DEFAULT_RULE
) -> dict[str, Any]:
    """config.json of a chain draft directory (format_version 2): its first layer's (`modules.native_config`, whose
    fields but `mtp_layer` every layer shares) plus the chain's own."""
    return {
        **layer_config,
        "architectures": ["Mtp2DraftNativeMtpChain"],
        "format_version": CHAIN_FORMAT_VERSION,
        "num_layers": len(mtp_layers),
        "mtp_layers": [int(i) for i in mtp_layers],
        "step_layers": step_layers,
    }


def is_chain_config(cfg: Mapping[str, Any]) -> bool:
    return int(cfg.get("format_version", 1)) >= CHAIN_FORMAT_VERSION and "mtp_layers" in cfg
