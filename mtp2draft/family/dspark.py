"""Reading a DSpark block drafter's settings from config.json: `dspark_fields` is None for every other checkpoint.

A DSpark drafter (deepseek-ai/DeepSpec; DeepSeek-V4-Flash-0731 and V4.1 ship one under `mtp.*`) is recognised by
the config's `dspark_*` keys, top level or under `text_config`, never by `num_nextn_predict_layers`: V4-0731 says 1
there while it holds three DSpark stages. docs/notes/2026-12-05-dspark-definition.md has every field's source.

How each release names its drafter is data, one file per layout in `model_specs/dspark/` (`layouts`, `layout_for`):
the names of the first stage's context projection and the last stage's head stack (V4-0731's
`markov_head.markov_w{1,2}` and `hc_head_*`, V4.1's `markov_head.{embed,head}` and no `hc_head`), and which config
keys give a stage's own routed expert count (V4.1: `dspark_n_routed_experts`, falling back to `n_routed_experts`).
`mtp2draft specs` lists them.

What this module does not do: read tensors (`checkpoint.dspark.inspect_dspark` reads the headers), or build the module
(`draft.dspark`). It imports no torch.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mtp2draft.errors import CheckpointError, SpecError
from mtp2draft.family.identity import FamilyIdentity, named_in

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


# ---- layouts: how a release names its drafter (model_specs/dspark/*.toml) --------------------------------------------
LAYOUT_FOLDER = "dspark"
_LAYOUT_FIELDS = (
    "name", "description", "architectures", "model_types", "kind", "commands", "quantization", "stage_experts", "sources",
    "key_source", "stage", "first", "last",
)  # fmt: skip
FIRST_ROLES = ("main_proj", "main_norm")  # stage 0: fc over the target layers' states, then its norm
LAST_ROLES = ("norm", "markov_w1", "markov_w2", "confidence")  # the last stage's head stack (hc_head_* optional)
LAYOUT_KINDS = ("stages", "speculators")  # stages under mtp.{i}. of a target checkpoint / a standalone directory


@dataclass(frozen=True)
class DSparkLayout(FamilyIdentity):
    """One release's DSpark naming: role -> stored name under `mtp.{stage}.` (first stage, last stage)."""

    kind: str
    commands: str  # what mtp2draft does with it, as `specs` shows it
    quantization: str
    stage_experts: tuple[str, ...]  # config keys of a stage's routed expert count, the first one set wins
    sources: str
    key_source: str
    stage: str  # the drafter module that runs these stages (`draft.dspark_disk.STAGES`), "" while none exists
    first: Mapping[str, str]
    last: Mapping[str, str]

    def expert_count(self, text: Mapping[str, Any]) -> int | None:
        """The routed experts each stage holds, as the loader reads the config (vLLM 0.32: V4.1's
        `dspark_n_routed_experts or n_routed_experts`, V4's `n_routed_experts`)."""
        return next((text[k] for k in self.stage_experts if text.get(k)), None)

    def summary(self) -> dict[str, Any]:
        """The row `specs --json` prints for it."""
        return {
            **self.identity_row(),
            "draft_kind": "dspark",
            "layout": self.kind,
            "commands": self.commands,
            "quantization": self.quantization,
            "stage_experts": list(self.stage_experts),
            "first_stage": dict(self.first),
            "last_stage": dict(self.last),
            "sources": self.sources,
            "key_source": self.key_source,
            "stage": self.stage or None,
            "supported": True,
        }


def parse_layout(data: Mapping[str, Any], path: str) -> DSparkLayout:
    """Validate one layout file: exactly the known keys, the roles every DSpark drafter has."""
    unknown, missing = sorted(set(data) - set(_LAYOUT_FIELDS)), sorted(set(_LAYOUT_FIELDS) - set(data))
    if unknown or missing:
        raise SpecError(f"{path}: unknown key(s) {unknown} / missing key(s) {missing}")
    if data["name"] != Path(path).stem or data["kind"] not in LAYOUT_KINDS:
        raise SpecError(f"{path}: name must be the file's stem and kind one of {', '.join(LAYOUT_KINDS)}")
    for table, roles in (("first", FIRST_ROLES), ("last", LAST_ROLES)):
        lacking = [r for r in roles if not isinstance(data[table].get(r), str)]
        if lacking:
            raise SpecError(f"{path}: [{table}] names no {', '.join(lacking)}")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return DSparkLayout(**fields)


@cache
def layouts() -> dict[str, DSparkLayout]:
    """Every shipped layout by name."""
    folder = resources.files("mtp2draft.model_specs") / LAYOUT_FOLDER
    out = {}
    for file in sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".toml")):
        out[file.stem] = parse_layout(tomllib.loads(file.read_text()), str(file))
    return out


def layout_for(config: Mapping[str, Any]) -> DSparkLayout:
    """The layout of a target checkpoint whose config declares DSpark stages: matched by architectures, then
    model_type (top level, then text_config). CheckpointError naming the known layouts when none matches."""
    stages = [row for row in layouts().values() if row.kind == "stages"]
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    for matches in (
        lambda r: r.by_architecture(config),
        lambda r: r.by_model_type(config),
        lambda r: r.by_model_type(text),
    ):
        found = [r for r in stages if matches(r)]
        if found:
            return found[0]
    known = "; ".join(f"{r.name} ({', '.join(r.architectures)})" for r in stages)
    raise CheckpointError(
        f"config.json declares a DSpark drafter ({DETECT_KEY}) but its family ({named_in(config)}) names its stages "
        f"in no layout mtp2draft reads: {known} (model_specs/{LAYOUT_FOLDER}/)"
    )
