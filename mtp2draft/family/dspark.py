"""Reading a DSpark block drafter's settings from config.json: `dspark_fields` is None for every other checkpoint.

A DSpark drafter (deepseek-ai/DeepSpec; DeepSeek-V4-Flash-0731 and V4.1 ship one under `mtp.*`) is recognised by
the config's `dspark_*` keys, top level or under `text_config`, never by `num_nextn_predict_layers`: V4-0731 says 1
there while it holds three DSpark stages. docs/notes/2026-12-05-dspark-definition.md has every field's source.

What this module does not do: read tensors (`family.dspark_inspect` reads the headers), or build the module
(`draft.dspark`). It imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtp2draft.errors import CheckpointError

# the key whose presence makes a config a DSpark drafter's (`family.not_supported.NOT_MTP_FIELDS` refuses it as MTP)
DETECT_KEY = "dspark_block_size"


@dataclass(frozen=True)
class DSparkFields:
    """The `dspark_*` settings of a release: what its block drafter reads and drafts."""

    block_size: int  # draft slots per block: slot 0 the last verified token, slots 1.. the noise token
    target_layer_ids: tuple[int, ...]  # target layers whose states feed the context projection (main_proj / fc)
    noise_token_id: int | None  # the id every slot after the first holds
    markov_rank: int | None  # rank of the Markov head's markov_w1 [vocab, rank] / markov_w2 [vocab, rank]
    n_routed_experts: int | None  # the drafter's own expert count where it differs from the trunk's (V4.1)
    num_experts_per_tok: int | None
    section: str  # "config.json" or "config.json text_config": where the fields were found

    def summary(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids),
            "noise_token_id": self.noise_token_id,
            "markov_rank": self.markov_rank,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
        }


def _count(value: Any, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{where}: {name} = {value!r} is not a whole number >= {minimum}")
    return value


def _optional(section: Mapping[str, Any], name: str, where: str, minimum: int) -> int | None:
    value = section.get(name)
    return None if value is None else _count(value, name, where, minimum)


def dspark_fields(config: Mapping[str, Any]) -> DSparkFields | None:
    """The DSpark settings of a config.json, or None when it has no `dspark_block_size` (top level or under
    `text_config`). CheckpointError when the fields are there but malformed: a block of 0, no target layers, ids
    not strictly increasing (DeepSpec's `validate_target_layer_ids`)."""
    text = config.get("text_config")
    for section, where in ((config, "config.json"), (text, "config.json text_config")):
        if not isinstance(section, Mapping) or section.get(DETECT_KEY) is None:
            continue
        block = _count(section[DETECT_KEY], DETECT_KEY, where)
        ids = section.get("dspark_target_layer_ids")
        if not isinstance(ids, list) or not ids:
            raise CheckpointError(f"{where}: dspark_target_layer_ids = {ids!r} is not a list of target layers")
        layers = tuple(_count(i, "dspark_target_layer_ids", where, minimum=-1) for i in ids)
        if any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
            raise CheckpointError(f"{where}: dspark_target_layer_ids = {ids!r} is not strictly increasing")
        return DSparkFields(
            block_size=block,
            target_layer_ids=layers,
            noise_token_id=_optional(section, "dspark_noise_token_id", where, 0),
            markov_rank=_optional(section, "dspark_markov_rank", where, 1),
            n_routed_experts=_optional(section, "dspark_n_routed_experts", where, 1),
            num_experts_per_tok=_optional(section, "dspark_num_experts_per_tok", where, 1),
            section=where,
        )
    return None
