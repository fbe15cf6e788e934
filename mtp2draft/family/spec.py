"""The spec registry: `model_specs/*.toml` (and `MTP2DRAFT_SPEC_PATH`'s files) parsed into the schema's frozen
`Spec` (`family/schema.py`), validated, and found for a config.json (`find_spec`).

What this module does not do: read checkpoints (`checkpoint/reader.py`) or apply transforms (`family/transforms.py`);
it only checks that the transforms a spec names are registered."""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mtp2draft.errors import Mtp2DraftError, SpecError, UnknownFamilyError
from mtp2draft.family.identity import named_in
from mtp2draft.family.not_supported import refuse_non_mtp, refuse_not_supported
from mtp2draft.family.schema import (
    ATTN_IMPLEMENTATIONS,
    AUX_ID_RULES,
    COMPONENTS,
    CONCAT_ORDERS,
    ENGINE_STEP_LAYER_RULES,
    ENGINES,
    HIDDEN_SOURCES,
    METHODS,
    NORM_STYLES,
    QUANT_FORMATS,
    BlockSpec,
    ConfigSpec,
    Eagle3Spec,
    EngineSpec,
    KeySpec,
    LayerSpec,
    NextNSpec,
    Spec,
    SpeculatorsSpec,
)
from mtp2draft.kinds import DraftKind


# ---- parsing ------------------------------------------------------------------------------------------------------
def _build(cls: type, data: Any, where: str) -> Any:
    """Instantiate dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a table, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls) if f.name != "path"}
    unknown = sorted(set(data) - set(known) - {"path"})
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    kwargs = {name: value for name, value in data.items() if name != "path"}
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # missing required keys
        raise SpecError(f"{where}: {exc}") from exc
    for f in fields(cls):
        value = getattr(obj, f.name)
        expected = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if "tuple" in expected and isinstance(value, list):
            object.__setattr__(obj, f.name, tuple(value))
            value = tuple(value)
        if expected == "str" and not isinstance(value, str):
            raise SpecError(f"{where}.{f.name}: expected a string, got {value!r}")
        if expected == "bool" and not isinstance(value, bool):
            raise SpecError(f"{where}.{f.name}: expected true/false, got {value!r}")
        if expected.startswith("Mapping") and not isinstance(value, Mapping):
            raise SpecError(f"{where}.{f.name}: expected a table, got {value!r}")
        if "tuple" in expected and (isinstance(value, str) or not all(isinstance(v, str) for v in value)):
            raise SpecError(f"{where}.{f.name}: expected a list of strings, got {value!r}")
    return obj


def parse_spec(data: Mapping[str, Any], path: str = "<spec>") -> Spec:
    """Validate one spec table and return the frozen Spec."""
    data = copy.deepcopy(dict(data))
    sections = {
        "config": ConfigSpec,
        "keys": KeySpec,
        "layer": LayerSpec,
        "block": BlockSpec,
        "eagle3": Eagle3Spec,
        "nextn": NextNSpec,
        "speculators": SpeculatorsSpec,
    }
    engines = data.get("engines", {})
    if not isinstance(engines, Mapping):
        raise SpecError(f"{path} [engines]: expected a table of engine tables")
    data["engines"] = {}
    for engine, table in engines.items():
        if engine not in ENGINES:
            raise SpecError(f"{path} [engines.{engine}]: unknown engine; known: {', '.join(ENGINES)}")
        data["engines"][engine] = _build(EngineSpec, table, f"{path} [engines.{engine}]")
    for name, cls in sections.items():
        if name in data:
            data[name] = _build(cls, data[name], f"{path} [{name}]")
        elif name in ("config", "keys", "block"):
            raise SpecError(f"{path}: missing section [{name}]")
    spec = _build(Spec, data, path)
    spec = Spec(**{**{f.name: getattr(spec, f.name) for f in fields(Spec)}, "path": path})
    _check_values(spec)
    return spec


def _check_values(spec: Spec) -> None:
    where = spec.path
    if spec.layer.concat not in CONCAT_ORDERS:
        raise SpecError(f"{where}: layer.concat must be one of {CONCAT_ORDERS}, got {spec.layer.concat!r}")
    if spec.layer.hidden not in HIDDEN_SOURCES:
        raise SpecError(f"{where}: layer.hidden must be one of {HIDDEN_SOURCES}, got {spec.layer.hidden!r}")
    if spec.layer.norm not in NORM_STYLES:
        raise SpecError(f"{where}: layer.norm must be one of {NORM_STYLES}, got {spec.layer.norm!r}")
    for engine, facts in spec.engines.items():
        at = f"{where} [engines.{engine}]"
        bad = [m for m in facts.methods if m not in METHODS]
        if bad:
            raise SpecError(f"{at}: methods must be among {METHODS}, got {bad}")
        if DraftKind.MTP in facts.methods and facts.handover not in HIDDEN_SOURCES:
            raise SpecError(f"{at}: an engine serving mtp needs handover in {HIDDEN_SOURCES}, got {facts.handover!r}")
        if facts.handover and facts.handover not in HIDDEN_SOURCES:
            raise SpecError(f"{at}: handover must be one of {HIDDEN_SOURCES}, got {facts.handover!r}")
        if facts.hidden and facts.hidden not in HIDDEN_SOURCES:
            raise SpecError(f"{at}: hidden must be one of {HIDDEN_SOURCES}, got {facts.hidden!r}")
        if facts.aux_ids not in AUX_ID_RULES:
            raise SpecError(f"{at}: aux_ids must be one of {AUX_ID_RULES}, got {facts.aux_ids!r}")
        if facts.step_layers and facts.step_layers not in ENGINE_STEP_LAYER_RULES:
            raise SpecError(f"{at}: step_layers must be one of {ENGINE_STEP_LAYER_RULES}, got {facts.step_layers!r}")
        if not facts.version:
            raise SpecError(f"{at}: version (the engine release the facts were read from) is required")
    if spec.speculators.mtp_model_type and not spec.speculators.version:
        raise SpecError(
            f"{where} [speculators]: version (the speculators release the facts were read from) is required"
        )
    for q in spec.quantization:
        if q not in QUANT_FORMATS:
            raise SpecError(f"{where}: unknown quantization {q!r}; known: {QUANT_FORMATS}")
    if spec.block.attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise SpecError(
            f"{where}: block.attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, "
            f"got {spec.block.attn_implementation!r}"
        )
    if bool(spec.block.decoder_layer) == bool(spec.block.attention_class or spec.block.mlp_class):
        raise SpecError(f"{where}: [block] needs either decoder_layer or attention_class + mlp_class")
    if not spec.architectures and not spec.model_types:
        raise SpecError(f"{where}: a spec must match at least one architecture or model_type")
    if bool(spec.layer.streams) != bool(spec.block.head_mixer) or bool(spec.layer.streams) != bool(
        spec.keys.hc_head_fn
    ):
        raise SpecError(f"{where}: a multi-stream layer needs [layer] streams, [block] head_mixer and keys.hc_head_fn")
    if spec.layer.own_head and not spec.keys.head:
        raise SpecError(f"{where}: [layer] own_head needs keys.head (the layer's own lm_head)")
    for name in (*COMPONENTS, "block"):
        template = getattr(spec.keys, name)
        try:
            template.format(i=0, n=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise SpecError(f"{where}: keys.{name} = {template!r} uses a placeholder other than {{i}}/{{n}}") from exc


def load_spec_file(path: str | Path) -> Spec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from exc
    spec = parse_spec(data, str(path))
    if spec.name != path.stem:
        raise SpecError(f"{path}: name {spec.name!r} must equal the file name {path.stem!r}")
    return spec


SPEC_PATH_ENV = "MTP2DRAFT_SPEC_PATH"


def _spec_files() -> list[Path]:
    """Shipped spec files, then any in the directories of $MTP2DRAFT_SPEC_PATH (os.pathsep-separated)."""
    root = resources.files("mtp2draft.model_specs")
    files = sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml"))
    for folder in filter(None, os.environ.get(SPEC_PATH_ENV, "").split(os.pathsep)):
        files += sorted(Path(folder).glob("*.toml"))
    return files


@cache
def registry() -> dict[str, Spec]:
    """All specs by name: the shipped ones plus user specs from $MTP2DRAFT_SPEC_PATH (which may override)."""
    specs = {}
    for path in _spec_files():
        spec = load_spec_file(path)
        specs[spec.name] = spec
    return specs


def spec_names() -> list[str]:
    return sorted(registry())


def get_spec(name: str) -> Spec:
    try:
        return registry()[name]
    except KeyError:
        raise UnknownFamilyError(f"no spec named {name!r}; supported: {', '.join(spec_names())}") from None


def find_spec(config: Mapping[str, Any], trunk_only: bool = False) -> Spec:
    """The spec matching a config.json: by `architectures` first, then by `model_type`. A config marking its MTP
    tensors as another drafter (`not_supported.NOT_MTP_FIELDS`) is refused first, whatever its family, unless
    `trunk_only` (the checkpoint is run as a target: its trunk is the family's, whatever its `mtp.*` holds); one of
    a family listed as not supported (`family.not_supported`) is refused with its reason when no spec matches."""
    if not trunk_only:
        refuse_non_mtp(config)
    for spec in registry().values():
        if spec.by_architecture(config):
            return spec
    for spec in registry().values():
        if spec.by_model_type(config):
            return spec
    refuse_not_supported(config)
    found = named_in(config)
    # one short line (listing every family and architecture made it 1,173 characters): `mtp2draft specs` lists them
    raise UnknownFamilyError(
        f"no spec matches this checkpoint ({found}): mtp2draft knows {len(registry())} families, none of them this "
        "one (`mtp2draft specs` lists them with their architectures)"
    )


def find_nextn_spec(config: Mapping[str, Any]) -> Spec | None:
    """The spec of a NextN checkpoint's config.json (the draft's own, `architectures` naming the NextN class): by its
    model_type (the target's), else by the NextN architecture where exactly one spec names it. A family matched by
    architecture only (Ling 3, whose model_type `bailing_hybrid` Ling 2.5 shares) has no model_type to go by; the
    NextN class alone cannot tell apart the specs that share one (Qwen3.5's MTP class), so those give None."""
    try:
        return find_spec({"model_type": config.get("model_type")})
    except Mtp2DraftError:  # no spec by model_type, or one refused: the NextN class is the one name left
        named = [s for s in registry().values() if s.nextn.named_by(config)]
        return named[0] if len(named) == 1 else None
