"""A draft directory's config.json, parsed once into a typed, validated object (`DraftConfig`).

Every command that reads a draft (export, evaluate, distill, push, dump-hidden --draft) and `validate` go through
`parse_draft_config` / `load_draft_config`: a field of the wrong type ("256", 256.5, true), out of range (-1, 0) or
outside its enumeration (`hidden_handover: sideways`) is one `DraftError` line naming the file, the field, the rule
and the fix, before any weight is read or any output is claimed.

The schema is data: one `Field` per config key, in tables per layout (`NATIVE_FIELDS`, `EAGLE3_FIELDS`, the
speculators layout's top level and its `transformer_layer_config`), plus the few cross-field rules (sizes agree with
the recorded target config, the draft vocabulary is within the target's). A recorded target config
(`target_config`) is checked by the same rules as a checkpoint's: transformers' typed config class (types), and
every size / count field a whole number >= 1 (`SIZE_FIELD`, derived from the field names, not a hand-picked list).

What this module does not do: check what only the format knows (weights, shapes, aux ids against the target's
layers: `formats/`), or whether a draft belongs to a given target (`identity.py`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp2draft.dtypes import DTYPE_NAMES
from mtp2draft.errors import DraftError, Mtp2DraftError, read_json_file
from mtp2draft.kinds import CONFIG_FILE, DraftKind, detect_kind

HANDOVERS = ("post_norm", "pre_norm")  # which hidden a draft step hands on / step 0 reads
DRAFT_FORMAT_VERSIONS = (1, 2)  # the native draft layouts this version reads (draft.DRAFT_FORMAT_VERSION writes)
HIDDEN_ACTS = ("silu",)  # the EAGLE-3 layer's MLP is SwiGLU

FIX = "fix config.json or convert the draft again"


# ---- the rules --------------------------------------------------------------------------------------------------
# Each rule takes a value and returns None when it holds, or what the value must be (for the message).
Rule = Callable[[Any], str | None]


def whole(least: int) -> Rule:
    def rule(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= least
        return None if ok else f"a whole number >= {least}"

    return rule


def positive_number(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return None if ok else "a finite number > 0"


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def one_of(*values: Any, null: bool = False) -> Rule:
    def rule(v: Any) -> str | None:
        if v is None and null:
            return None
        ok = not isinstance(v, bool) and isinstance(v, type(values[0])) and v in values
        return None if ok else "one of " + ", ".join(map(str, values)) + (" (or null)" if null else "")

    return rule


def obj(v: Any) -> str | None:
    return None if isinstance(v, Mapping) else "a JSON object"


def obj_or_null(v: Any) -> str | None:
    return None if v is None or isinstance(v, Mapping) else "a JSON object or null"


def token_id(v: Any) -> str | None:
    def one(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    ok = v is None or one(v) or (isinstance(v, list) and bool(v) and all(one(x) for x in v))
    return None if ok else "null, a token id >= 0 or a list of them"


def layer_list(v: Any) -> str | None:
    ok = (
        isinstance(v, list)
        and len(v) >= 1
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)
        and len(set(v)) == len(v)
    )
    return None if ok else "a non-empty list of distinct MTP layer indices >= 0"


def ids(count: int, least: int) -> Rule:
    def rule(v: Any) -> str | None:
        ok = (
            isinstance(v, list)
            and len(v) == count
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= least for i in v)
            and len(set(v)) == count
        )
        return None if ok else f"{['no', 'one', 'two', 'three'][count]} distinct ids >= {least} (whole numbers)"

    return rule


def strings(v: Any) -> str | None:
    return None if isinstance(v, list) and all(isinstance(x, str) for x in v) else "a list of strings"


@dataclass(frozen=True)
class Field:
    name: str
    rule: Rule
    required: bool = False


def _spec_name(v: Any) -> str | None:
    from mtp2draft.family.spec import spec_names

    names = spec_names()
    return None if isinstance(v, str) and v in names else "one of the registered specs (" + ", ".join(names) + ")"


def _engine(v: Any) -> str | None:
    from mtp2draft.family.schema import ENGINES

    if v is None:
        return None
    ok = isinstance(v, Mapping) and v.get("name") in ENGINES and isinstance(v.get("version", ""), str)
    return None if ok else 'null or {"name": ' + " | ".join(ENGINES) + ', "version": "..."}'


def _step_rule(v: Any) -> str | None:
    from mtp2draft.family.schema import STEP_LAYER_RULES

    return one_of(*STEP_LAYER_RULES)(v)  # the specs' rules, imported when checked as `_spec_name` reads the registry


NATIVE_FIELDS = (
    Field("draft_kind", one_of(DraftKind.MTP.value), required=True),
    Field("format_version", one_of(*DRAFT_FORMAT_VERSIONS)),
    Field("architectures", strings),
    Field("spec", _spec_name, required=True),
    Field("mtp_layer", whole(0)),
    Field("num_layers", whole(1)),
    Field("mtp_layers", layer_list),
    Field("step_layers", _step_rule),
    Field("hidden_handover", one_of(*HANDOVERS)),
    Field("input_hidden", one_of(*HANDOVERS, null=True)),
    Field("final_norm", boolean),
    Field("engine", _engine),
    Field("hidden_size", whole(1)),
    Field("vocab_size", whole(1)),
    Field("target_config", obj, required=True),
    Field("mtp2draft", obj_or_null),
)

# The EAGLE-3 layer's Llama fields (SGLang's config.json top level; speculators' transformer_layer_config).
LLAMA_LAYER_FIELDS = (
    Field("hidden_size", whole(1)),
    Field("intermediate_size", whole(1)),
    Field("num_attention_heads", whole(1)),
    Field("num_key_value_heads", whole(1)),
    Field("head_dim", whole(1)),
    Field("num_hidden_layers", whole(1)),
    Field("max_position_embeddings", whole(1)),
    Field("vocab_size", whole(1)),
    Field("rms_norm_eps", positive_number),
    Field("rope_theta", positive_number),
    Field("rope_scaling", obj_or_null),
    Field("hidden_act", one_of(*HIDDEN_ACTS)),
    Field("tie_word_embeddings", boolean),
    Field("torch_dtype", one_of(*DTYPE_NAMES)),
    Field("bos_token_id", token_id),
    Field("eos_token_id", token_id),
    Field("pad_token_id", token_id),
)
# Both EAGLE-3 layouts: the draft's vocabulary and its place in the target, then mtp2draft's own records.
EAGLE3_TARGET_FIELDS = (
    Field("architectures", strings),
    Field("draft_vocab_size", whole(1)),
    Field("target_hidden_size", whole(1)),
    Field("eagle_aux_hidden_state_layer_ids", ids(3, 1)),  # 'input of layer i': at least 1
)
MTP2DRAFT_RECORD_FIELDS = (Field("mtp2draft", obj_or_null), Field("mtp2draft_init", obj_or_null))
EAGLE3_FIELDS = (
    *LLAMA_LAYER_FIELDS,
    *EAGLE3_TARGET_FIELDS,
    Field("eagle_config", obj_or_null),
    *MTP2DRAFT_RECORD_FIELDS,
)
SPECULATORS_FIELDS = (
    *EAGLE3_TARGET_FIELDS,
    Field("transformer_layer_config", obj),  # its absence is the format's violation (`formats.eagle3`)
    Field("speculators_config", obj_or_null),
    Field("norm_before_residual", boolean),
    Field("norm_before_fc", boolean),
    Field("fc_norm", boolean),
    Field("norm_output", boolean),
    Field("torch_dtype", one_of(*DTYPE_NAMES)),
    *MTP2DRAFT_RECORD_FIELDS,
)
EAGLE_CONFIG_FIELDS = (
    Field("eagle_aux_hidden_state_layer_ids", ids(3, 0)),  # SGLang's per-family terms: 0 is possible
    Field("use_aux_hidden_state", boolean),
)
# What convert records about the target in an EAGLE-3 draft (`mtp2draft`).
RECORD_FIELDS = (
    Field("spec", _spec_name),
    Field("mtp_layer", whole(0)),
    Field("target_num_layers", whole(1)),
    Field("target_config", obj_or_null),
)

# Fields of a model config that are sizes or counts (must be whole numbers >= 1 where given): derived from the
# naming transformers' configs follow, so a new family's fields are covered without a list to maintain.
SIZE_FIELD = re.compile(
    r"(^|_)(size|dim|heads|experts|experts_per_tok|rank)$|^num_hidden_layers$|_position_embeddings$"
)
# Named like sizes, but 0 or null is meaningful (no LoRA rank, no dense-only layers, no window).
SIZE_FIELD_EXCEPTIONS = frozenset({"q_lora_rank", "kv_lora_rank", "sliding_window", "n_shared_experts"})
POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "layer_norm_epsilon")
ZERO_SIZES = frozenset({"head_dim", "qk_rope_head_dim"})
"""Sizes that may be 0: an MLA without RoPE (GLM-5.3-Flash: qk_rope_head_dim 0, and head_dim, which its config
defines as the RoPE width, 0 too)."""


# ---- the parsed object --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftConfig:
    """A draft's config.json, checked. `raw` is the file's dict as written (what the loaders and formats read);
    the typed fields are what the rest of mtp2draft asks of a draft without building it."""

    kind: DraftKind
    where: str  # the file, for messages
    raw: Mapping[str, Any] = field(repr=False)
    spec: str | None  # the target family, when recorded (always for native drafts)
    hidden_size: int | None
    vocab_size: int | None
    target_config: Mapping[str, Any] | None = field(default=None, repr=False)  # the target's, when recorded
    mtp_layer: int = 0
    hidden_handover: str = "post_norm"
    input_hidden: str | None = None
    final_norm: bool = True
    engine: Mapping[str, str] | None = None


def _describe(value: Any) -> str:
    """A config value as the message shows it: its JSON, and its kind where that is the problem."""
    text = json.dumps(value, default=str)
    if isinstance(value, bool):
        return f"{text} (true/false)"
    if isinstance(value, str):
        return f"{text} (a string)"
    if isinstance(value, list | dict):
        kind = "a list" if isinstance(value, list) else "an object"
        return f"{text} ({kind})" if len(text) <= 40 else kind
    if isinstance(value, float) and value.is_integer():
        return f"{text} (a fraction)"
    return text


def _check(cfg: Mapping[str, Any], fields: tuple[Field, ...], where: str, prefix: str = "") -> None:
    for f in fields:
        if f.name not in cfg:
            if f.required:
                raise DraftError(f"{where}: {prefix}{f.name} is missing: {FIX}")
            continue
        need = f.rule(cfg[f.name])
        if need is not None:
            raise DraftError(f"{where}: {prefix}{f.name} is {_describe(cfg[f.name])}, it must be {need}: {FIX}")


def check_model_config(cfg: Mapping[str, Any], where: str, prefix: str = "") -> None:
    """A model config's sizes and counts (`SIZE_FIELD`) whole numbers >= 1 and its epsilons / RoPE bases (one, or one
    per layer) positive,
    where given. Types beyond these are checked by transformers' config classes when the module is built."""
    for key, value in cfg.items():
        if key in SIZE_FIELD_EXCEPTIONS or value is None:
            continue
        if SIZE_FIELD.search(key):
            _check(cfg, (Field(key, whole(0 if key in ZERO_SIZES else 1)),), where, prefix)
        elif key in POSITIVE_FLOATS and isinstance(value, list):  # one per layer (Step-3.5's rope_theta)
            for i, entry in enumerate(value):
                _check({f"{key}[{i}]": entry}, (Field(f"{key}[{i}]", positive_number),), where, prefix)
        elif key in POSITIVE_FLOATS:
            _check(cfg, (Field(key, positive_number),), where, prefix)


def _native(cfg: Mapping[str, Any], where: str) -> DraftConfig:
    from mtp2draft.family.spec import get_spec

    _check(cfg, NATIVE_FIELDS, where)
    spec = get_spec(cfg["spec"])
    try:
        text = spec.text_config(cfg["target_config"])
    except Mtp2DraftError as exc:
        raise DraftError(f"{where}: target_config: {exc}: {FIX}") from None
    prefix = "target_config." + (f"{spec.config.text_config}." if spec.config.text_config else "")
    check_model_config(text, where, prefix)
    for key in ("hidden_size", "vocab_size"):
        _check(text, (Field(key, whole(1), required=True),), where, prefix)
        if key in cfg and cfg[key] != text[key]:
            raise DraftError(
                f"{where}: {key} is {cfg[key]}, its target_config says {text[key]}: the file was edited; {FIX}"
            )
    layer, count = cfg.get("mtp_layer", 0), spec.num_mtp_layers(cfg["target_config"])
    if layer >= max(count, 1):
        raise DraftError(f"{where}: mtp_layer is {layer}, the target has {count} MTP layer(s): {FIX}")
    if cfg.get("format_version", 1) >= 2:  # a chain of layers (draft/chain.py)
        if "mtp_layers" not in cfg:
            raise DraftError(f"{where}: format_version 2 needs mtp_layers (the chain's MTP layers): {FIX}")
        layers = cfg["mtp_layers"]
        if cfg.get("num_layers", len(layers)) != len(layers):
            raise DraftError(f"{where}: num_layers is {cfg['num_layers']}, mtp_layers lists {len(layers)}: {FIX}")
        if max(layers) >= max(count, 1):
            raise DraftError(f"{where}: mtp_layers {layers} names a layer the target lacks ({count} MTP layers): {FIX}")
    elif "mtp_layers" in cfg or "num_layers" in cfg:
        raise DraftError(f"{where}: mtp_layers / num_layers need format_version 2 (a chain draft): {FIX}")
    return DraftConfig(
        DraftKind.MTP,
        where,
        cfg,
        spec.name,
        int(text["hidden_size"]),
        int(text["vocab_size"]),
        cfg["target_config"],
        layer,
        cfg.get("hidden_handover", "post_norm"),
        cfg.get("input_hidden"),
        cfg.get("final_norm", True),
        cfg.get("engine"),
    )


def _eagle3(cfg: Mapping[str, Any], where: str) -> DraftConfig:
    if cfg.get("speculators_model_type") is not None:
        _check(cfg, SPECULATORS_FIELDS, where)
        layer = cfg.get("transformer_layer_config") or {}
        _check(layer, LLAMA_LAYER_FIELDS, where, "transformer_layer_config.")
        vocab, hidden = layer.get("vocab_size"), layer.get("hidden_size")
    else:
        _check(cfg, EAGLE3_FIELDS, where)
        if isinstance(cfg.get("eagle_config"), Mapping):
            _check(cfg["eagle_config"], EAGLE_CONFIG_FIELDS, where, "eagle_config.")
        vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size")
    draft_vocab = cfg.get("draft_vocab_size")
    if isinstance(vocab, int) and isinstance(draft_vocab, int) and draft_vocab > vocab:
        raise DraftError(f"{where}: draft_vocab_size {draft_vocab} exceeds vocab_size {vocab}: {FIX}")
    record = cfg.get("mtp2draft") or {}
    _check(record, RECORD_FIELDS, where, "mtp2draft.")
    target_config = record.get("target_config")
    if target_config is not None:
        check_model_config(target_config, where, "mtp2draft.target_config.")
    return DraftConfig(
        DraftKind.EAGLE3,
        where,
        cfg,
        record.get("spec"),
        cfg.get("target_hidden_size") or hidden,
        vocab,
        target_config,
        record.get("mtp_layer", 0),
        "pre_norm",
    )


def parse_draft_config(cfg: Any, where: str | Path = CONFIG_FILE, hint: str = "") -> DraftConfig:
    """The checked `DraftConfig` of a draft config.json's dict; one DraftError line otherwise."""
    where = str(where)
    if not isinstance(cfg, Mapping):
        raise DraftError(f"{where} must hold a JSON object, not {type(cfg).__name__}")
    try:
        kind = detect_kind(cfg, hint)
    except DraftError as exc:
        raise DraftError(f"{where}: {exc}") from None
    return _native(cfg, where) if kind is DraftKind.MTP else _eagle3(cfg, where)


def load_draft_config(path: str | Path, hint: str = "") -> DraftConfig:
    """Read and check `path`/config.json of a draft directory."""
    path = Path(path)
    cfg_file = path / CONFIG_FILE
    if not path.is_dir():
        raise DraftError(f"draft directory {path} does not exist")
    raw = read_json_file(cfg_file, DraftError, f"{path} has no {CONFIG_FILE}: not a draft directory")
    return parse_draft_config(raw, cfg_file, hint)
