"""The spec schema: the frozen dataclasses a `model_specs/*.toml` file becomes (`Spec` and its sections) and the
values each field may take (`ENGINES`, `STEP_LAYER_RULES`, ...).

A spec is declarative data: where a family keeps its MTP layer, how that layer computes (concat order, which
target hidden it reads, norm style), which transformers classes build its decoder block, which named transforms map
it onto each draft kind, and what each engine does with it. Everything family-specific that stage code needs comes
from here, so stage code never branches on an architecture name.

What this module does not do: read or validate spec files, or find a config's spec (`family/spec.py`).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtp2draft.errors import CheckpointError, SpecError
from mtp2draft.family.identity import FamilyIdentity
from mtp2draft.kinds import DRAFT_KINDS, HIDDEN_PLACES, DraftKind, Hidden

CONCAT_ORDERS = ("embed_hidden", "hidden_embed")
HIDDEN_SOURCES = HIDDEN_PLACES
NORM_STYLES = ("standard", "zero_centered")
QUANT_FORMATS = ("fp8_block",)
ENGINES = ("vllm", "sglang")
METHODS = DRAFT_KINDS  # an engine's speculative methods are the draft kinds
AUX_ID_RULES = ("plus_one", "plus_one_if_first_is_one")
STEP_LAYER_RULES = ("cycle", "first")
# An engine's rule for a family's chain of MTP layers: one of STEP_LAYER_RULES, or "neither" (it serves one MTP
# layer and runs no chain: a chain draft cannot be served by it, nor trained for it).
NO_CHAIN = "neither"
ENGINE_STEP_LAYER_RULES = (*STEP_LAYER_RULES, NO_CHAIN)
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
# The named (non-block) components of an MTP layer, as `[keys]` names them.
COMPONENTS = (
    "enorm",
    "hnorm",
    "proj",
    "e_proj",
    "final_norm",
    "hc_head_fn",
    "hc_head_base",
    "hc_head_scale",
    "embed",
    "head",
)


@dataclass(frozen=True)
class ConfigSpec:
    """Where the family's config.json keeps what we need."""

    transformers_model_type: str
    """`model_type` whose transformers config class parses the (text) config, e.g. `qwen2` for MiMo."""
    mtp_count: str = "num_nextn_predict_layers"  # field holding the number of MTP layers
    mtp_count_default: int | None = None
    """Used when the field is absent (Qwen3-Next releases omit it; engines assume 1). None: absent means none."""
    num_layers: str = "num_hidden_layers"
    """Field holding the number of trunk decoder layers (`{n}` in key templates, EAGLE-3 aux layer ids);
    LongCat-Flash's release calls it `num_layers`."""
    num_layers_list: str = "layers_block_type"
    """A per-layer list whose length is the trunk's layer count where the release omits `num_layers`: transformers'
    NemotronHConfig derives num_hidden_layers = len(layers_block_type), and Nemotron-3 Ultra's config.json has no
    num_hidden_layers; empty: none."""
    text_config: str = ""
    """Key of a nested text config (`text_config` for Qwen3.5); empty: the config is top level."""
    block_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Config fields set on the block's copy of the config so the decoder-layer class builds the MTP block's kind
    at layer index 0 (e.g. `first_k_dense_replace = 0`, `layer_types = ["full_attention"]`)."""
    block_from: Mapping[str, str] = field(default_factory=dict)
    """Fields of the block's config copy set from the release's own fields, where transformers' class reads other
    names: target (a dotted path into a dict field, e.g. `rope_parameters.sliding_attention.rope_theta`) ->
    `field`, or `field / n` / `field * n` (MiMo-V2.5 has no transformers class: its SWA fields are mapped onto
    `mimo_v2_flash`'s, which derives the SWA key-value heads as num_key_value_heads * 2)."""
    block_unset: tuple[str, ...] = ()
    """Config fields set to None on the block's copy (TOML has no null): K-EXAONE's MTP layer is full attention with
    RoPE, which transformers' ExaoneMoeAttention computes only when `sliding_window` is None."""
    layer_lists: tuple[str, ...] = ()
    """Per-layer list fields of the (text) config that go on past the trunk with one entry per MTP layer (Step-3.5's
    layer_types, rope_theta, ...: num_hidden_layers + MTP count entries; a config saved by transformers keeps them
    as `mtp_<field>`): MTP layer i's block config holds only its own entry, so each layer is built as its kind."""
    layer_sets: tuple[str, ...] = ()
    """Layer-index set fields (comma-separated, e.g. Step-3.5's moe_layers_enum): MTP layer i's block config holds
    index 0 when trunk layers + i is in the set, else none."""


@dataclass(frozen=True)
class KeySpec:
    """Checkpoint key templates. `{i}` is the MTP layer index, `{n}` is the trunk's layer count + i (see
    `ConfigSpec.num_layers`)."""

    enorm: str
    hnorm: str
    proj: str
    final_norm: str
    block: str
    """Prefix of the decoder block's keys; keys under it that name another component are excluded."""
    target_embed: str
    target_head: str
    target_norm: str
    embed: str = ""
    """Optional copy of the embedding stored inside the MTP layer (engines ignore it and share the target's)."""
    head: str = ""  # optional copy of the lm_head stored inside the MTP layer
    e_proj: str = ""
    """The embedding's own projection where the layer keeps two (DeepSeek-V4: `e_proj` beside `h_proj`, which is then
    `proj`); empty: one projection of the concatenation."""
    hc_head_fn: str = ""
    """The stream-reducing head of a multi-stream layer (`[layer] streams`): its mixing weights, bias and scale."""
    hc_head_base: str = ""
    hc_head_scale: str = ""


@dataclass(frozen=True)
class LayerSpec:
    concat: str = "embed_hidden"
    """Order of the two normalised inputs fed to the projection."""
    hidden: str = Hidden.POST_NORM
    """Which target hidden state feeds step 0: after (`post_norm`) or before (`pre_norm`) the final norm."""
    norm: str = "standard"
    """`standard` RMSNorm (x * w) or `zero_centered` (x * (1 + w))."""
    own_head: bool = False
    """Each MTP layer has its own lm_head (`[keys] head`) and the engines compute its logits with it (Step-3.5 /
    3.7); false: the layer shares the target's lm_head (a stored `head` is then a copy, never read)."""
    streams: str = ""
    """Config field holding the number of residual streams (hyper-connections, DeepSeek-V4's `hc_mult`) the layer reads
    and hands on: its hidden state is [B, T, streams, H], reduced by the layer's own head (`[block] head_mixer`)
    before the final norm. Empty: one hidden vector [B, T, H]. With streams, `pre_norm` names the streams before that
    reduction (what the trunk's last layer outputs) and `post_norm` the reduced, normed [B, T, H]."""


@dataclass(frozen=True)
class BlockSpec:
    module: str
    """transformers module that holds the classes below."""
    norm: str
    rotary: str
    """Rotary-embedding class; empty where the block's attention has no positional encoding (Nemotron-H)."""
    attention: str
    """Block kind, as words for people and for `inspect`: mla, gqa, gated_gqa, swa, ..."""
    mlp: str  # dense or moe
    decoder_layer: str = ""
    """Decoder-layer class instantiated as-is. Leave empty to compose `attention_class` + `mlp_class`."""
    attention_class: str = ""
    mlp_class: str = ""
    load: tuple[str, ...] = ()
    """Named key transforms (checkpoint -> module layout) applied in order to the block's tensors."""
    rename: Mapping[str, str] = field(default_factory=dict)
    """Plain prefix renames of block keys, checkpoint -> module, applied before `load`."""
    selection_mask: str = ""
    """Method of `attention_class` turning the attention's own sparse selection (a DSA indexer's top-k) into its mask,
    for an attention reading a bool [B, T] of valid queries and building causality from its cache (GLM-5.3-Flash). Set:
    the composed block hands it all-valid queries and adds the draft's additive mask to it. Empty: it reads the mask."""
    head_mixer: str = ""
    """Class reducing a multi-stream layer's streams to one hidden before the final norm (`[layer] streams`)."""
    qkv: Mapping[str, str] = field(default_factory=dict)
    """Where a fused, pre-sharded `qkv_proj` (`load = ["deinterleave_qkv"]`) takes its geometry: config fields for
    `chunks` (the tensor-parallel shards it is stored in), `heads`, `kv_heads`, `head_dim`, `v_head_dim`."""
    min_transformers: str = ""  # lowest transformers computing the block as the engines do (draft/block_config.py)
    attn_implementation: str = "sdpa"
    """transformers attention kernel the block runs with: `sdpa`, or `eager` where the family's attention has a term
    SDPA cannot express (MiMo-V2-Flash's attention-sink bias, which its SDPA path would silently drop)."""


@dataclass(frozen=True)
class Eagle3Spec:
    transforms: tuple[str, ...] = ()
    """Named transforms (in `transforms.EAGLE3_TRANSFORMS`) that initialise the EAGLE-3 layer from the MTP layer."""


@dataclass(frozen=True)
class NextNSpec:
    architecture: str = ""
    """`architectures` entry SGLang's NextN loader expects for this family; empty: no NextN export."""
    layers: str = "one"
    """How the engine finds the layer in a standalone checkpoint: "one" (`num_hidden_layers: 1`, the layer renumbered
    to trunk layer 0: SGLang's `export_deepseek_nextn.py` layout) or "target" (the target's layer count kept and the
    layer under its own key names as MTP layer 0: a loader that maps the MTP keys past the trunk's last layer)."""
    sources: str = ""
    """Where the engines' NextN loading was read, with their versions."""

    def __post_init__(self) -> None:
        if self.layers not in ("one", "target"):
            raise SpecError(f"[nextn] layers must be 'one' or 'target', got {self.layers!r}")

    def named_by(self, config: Mapping[str, Any]) -> bool:
        """A NextN checkpoint's config.json names this family's NextN class in its `architectures`."""
        return bool(self.architecture) and self.architecture in (config.get("architectures") or [])


@dataclass(frozen=True)
class SpeculatorsSpec:
    """What vLLM's `speculators` library does with this family's MTP layer, read from its source at `version`
    (`[speculators]`); formats/speculators_mtp.py writes its `mtp` speculator type only where `mtp_model_type` is set."""

    version: str = ""
    """speculators release the facts were read from (e.g. "0.9.0")."""
    mtp_model_type: str = ""
    """The key of speculators' `mtp_model_classes` (`speculators/models/mtp/model_definitions.py`) that builds this
    family's MTP layer: the `model_type` of the (text) config it reads as `transformer_layer_config`; empty: the `mtp`
    speculator type has no class for the family."""
    sources: str = ""  # speculators source files the facts were read from


@dataclass(frozen=True)
class EngineSpec:
    """What one serving engine does with this family, read from its source at `version` (`[engines.<name>]`).

    Facts, not wishes: a method listed is one the engine loads AND runs for this target class; a computation field
    says what the engine's MTP module computes, which may differ from how the checkpoint was trained (`[layer]`)."""

    version: str
    """Engine release the facts below were read from (e.g. "0.33.0")."""
    methods: tuple[str, ...] = ()
    """Draft kinds the engine serves for this target: `mtp` (its native MTP module), `eagle3` (it captures the
    target's aux hidden states)."""
    handover: str = ""
    """Hidden the engine's MTP module hands to the next draft step: `post_norm` or `pre_norm` ("" without mtp)."""
    hidden: str = ""
    """Target hidden the engine feeds MTP step 0 (`post_norm` | `pre_norm`); empty: as `[layer] hidden`."""
    final_norm: bool = True
    """Whether the engine applies the MTP layer's final norm before the lm_head (ERNIE-4.5 in vLLM and SGLang: no)."""
    aux_ids: str = "plus_one"
    """How the engine turns `eagle_config` aux ids into captured layers (SGLang): `plus_one` (captures the input of
    layer id + 1, i.e. the output of layer id) or `plus_one_if_first_is_one` (DeepSeek V2/V3/V3.2 in SGLang: + 1 only
    when the first id is 1, otherwise the ids are the captured layer inputs as they stand)."""
    step_layers: str = ""
    """Which MTP layer draft step s (of k) runs: `cycle` (layer s % n, n = the checkpoint's MTP layers) or `first`
    (layer 0 at every step: the engine loads one layer); empty: not recorded. Equal for one-layer checkpoints."""
    sources: str = ""
    """Engine source files the facts were read from."""
    notes: str = ""
    known_bug: str = ""
    """A bug of this engine release that changes what a user gets from a draft of this family (its issue and fix PR):
    `specs`, the model card and `evaluate --engine` say it. Empty: none known."""
    config_view: Mapping[str, Any] = field(default_factory=dict)
    """config.json fields the engine reads instead of the release's, where it cannot parse the released type (MiMo-7B:
    `model_type = "qwen2"`): what a served view and the card's overlay rewrite. Empty: read as released."""
    extract_view: Mapping[str, Any] = field(default_factory=dict)
    """config.json fields its hidden-state extraction reads (MiMo-7B's trunk as Qwen2's); empty: as released."""
    extract_drop: tuple[str, ...] = ()  # key prefixes hidden from the extraction's view (tensors its class refuses)

    def serves(self, method: str) -> bool:
        return method in self.methods


@dataclass(frozen=True)
class Spec(FamilyIdentity):
    config: ConfigSpec
    keys: KeySpec
    layer: LayerSpec
    block: BlockSpec
    eagle3: Eagle3Spec = Eagle3Spec()
    nextn: NextNSpec = NextNSpec()
    speculators: SpeculatorsSpec = SpeculatorsSpec()
    quantization: tuple[str, ...] = ()
    engines: Mapping[str, EngineSpec] = field(default_factory=dict)
    """Engine name (`ENGINES`) -> what that engine does with this family; an engine absent serves nothing."""
    verified: bool = True
    """False when the layout comes from an engine loader we could not check against a released checkpoint."""
    key_source: str = ""
    """Where the MTP key list the layout follows was read (repo + path, engine version): a release's index or a loader
    test reading the real files where `verified`; else the loaders' names. Empty: not recorded beyond the notes."""
    notes: str = ""
    path: str = ""

    # ---- helpers used by stage code -------------------------------------------------------------------------
    def text_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The (text) config dict, unwrapped from `text_config` when the family nests it."""
        if self.config.text_config:
            inner = config.get(self.config.text_config)
            if not isinstance(inner, Mapping):
                raise SpecError(f"config.json has no '{self.config.text_config}' section, which {self.name} needs")
            return dict(inner)
        return dict(config)

    def num_mtp_layers(self, config: Mapping[str, Any]) -> int:
        text = self.text_config(config)
        value = text.get(self.config.mtp_count)
        if value is None:
            value = self.config.mtp_count_default
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise CheckpointError(f"config.json: {self.config.mtp_count} = {value!r} is not a count of MTP layers")
        return int(value or 0)

    def num_layers(self, config: Mapping[str, Any]) -> int:
        """Number of trunk decoder layers, from the field the spec names."""
        text = self.text_config(config)
        value = text.get(self.config.num_layers)
        per_layer = text.get(self.config.num_layers_list) if self.config.num_layers_list else None
        if value is None and isinstance(per_layer, list):
            value = len(per_layer)
        if value is None:
            raise SpecError(f"config.json has no '{self.config.num_layers}', which {self.name} needs")
        return int(value)

    def key(self, template: str, config: Mapping[str, Any], layer: int) -> str:
        if "{n}" not in template:  # only `{n}` needs the trunk's layer count
            return template.format(i=layer)
        return template.format(i=layer, n=self.num_layers(config) + layer)

    def block_from_values(self, text: Mapping[str, Any]) -> dict[str, Any]:
        """`[config] block_from` evaluated on a (text) config: target -> `field`, `field / n` or `field * n`; one line
        when a field is absent or the division is not exact."""
        out = {}
        for target, expr in self.config.block_from.items():
            name, op, n = (expr.split() + ["", ""])[:3]
            if name not in text:
                raise CheckpointError(f"config.json has no {name} field, which the MTP block's {expr!r} reads")
            value = text[name]
            if op and (not isinstance(value, int) or isinstance(value, bool) or op not in "*/" or not n.isdigit()):
                raise CheckpointError(f"config.json field {name} is {value!r}: {expr!r} needs a count")
            if op == "/" and value % int(n):
                raise CheckpointError(f"config.json field {name} is {value}, which {expr!r} does not divide")
            out[target] = value * int(n) if op == "*" else value // int(n) if op == "/" else copy.deepcopy(value)
        return out

    def component_keys(self, config: Mapping[str, Any], layer: int) -> dict[str, str]:
        """Resolved keys of the named (non-block) components of MTP layer `layer`."""
        return {
            name: self.key(getattr(self.keys, name), config, layer) for name in COMPONENTS if getattr(self.keys, name)
        }

    def num_streams(self, config: Mapping[str, Any]) -> int:
        """Residual streams the layer's hidden state carries (`[layer] streams`); 0 for a single [B, T, H] hidden."""
        if not self.layer.streams:
            return 0
        value = self.text_config(config).get(self.layer.streams)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"config.json: {self.layer.streams} = {value!r} is not a count of residual streams")
        return value

    def engine(self, name: str) -> EngineSpec | None:
        """The engine's facts for this family, None when the spec lists none (the engine serves nothing)."""
        if name not in ENGINES:
            raise SpecError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
        return self.engines.get(name)

    def serves(self, engine: str, method: str) -> bool:
        facts = self.engine(engine)
        return facts is not None and facts.serves(method)

    def runs(self, engine: str, method: str, layers: int = 1) -> bool:
        """Whether `engine` runs a `method` draft of `layers` MTP layers for this family: it serves the method, and a
        chain (layers > 1) only where its step rule is not "neither"."""
        facts = self.engine(engine)
        return self.serves(engine, method) and (layers <= 1 or facts is None or facts.step_layers != NO_CHAIN)

    def no_chain(self, engine: str, layers: int) -> str:
        """The one line refusing a chain of `layers` MTP layers for `engine`, whose rule for this family is "neither"."""
        facts = self.engine(engine)
        version = f" {facts.version}" if facts else ""
        return (
            f"{engine}{version} runs no chain of MTP layers for {self.name} targets (spec {self.path}: "
            f'[engines.{engine}] step_layers = "{NO_CHAIN}"): this draft chains {layers}; distill a one-layer draft '
            "(convert --layer N) for it, or pick another engine"
        )

    def engine_computation(self, engine: str) -> dict[str, Any]:
        """What `engine`'s native MTP module computes for this family: the step-0 target hidden (`input_hidden`),
        whether it applies the final norm (`final_norm`) and the hidden it hands on (`hidden_handover`)."""
        facts = self.engine(engine)
        if facts is None or not facts.serves(DraftKind.MTP):
            raise SpecError(f"{engine} serves no native MTP draft for {self.name} targets (spec {self.path})")
        return {
            "input_hidden": facts.hidden or self.layer.hidden,
            "final_norm": facts.final_norm,
            "hidden_handover": facts.handover,
        }

    def support_table(self) -> dict[str, dict[str, bool]]:
        """engine -> method -> served, for every known engine and method."""
        return {e: {m: self.serves(e, m) for m in METHODS} for e in ENGINES}

    def block_class(self) -> type:
        return _import(self.block.module, self.block.decoder_layer)

    def import_class(self, name: str) -> type:
        return _import(self.block.module, name)

    def summary(self) -> dict[str, Any]:
        return {
            **self.identity_row(),
            "block": f"{self.block.attention} + {self.block.mlp}",
            "concat": self.layer.concat,
            "hidden": self.layer.hidden,
            "norm": self.layer.norm,
            "streams": self.layer.streams,
            "quantization": list(self.quantization),
            "eagle3_transforms": list(self.eagle3.transforms),
            "speculators_mtp": self.speculators.mtp_model_type,
            "engines": {
                name: {
                    "version": facts.version,
                    "methods": list(facts.methods),
                    "handover": facts.handover,
                    "hidden": facts.hidden or self.layer.hidden,
                    "final_norm": facts.final_norm,
                    "aux_ids": facts.aux_ids,
                    "step_layers": facts.step_layers,
                    "sources": facts.sources,
                    "known_bug": facts.known_bug,
                }
                for name, facts in self.engines.items()
            },
            "verified": self.verified,
            "key_source": self.key_source,
        }


def _import(module: str, name: str) -> type:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"transformers has no {module}.{name} (installed version too old?): {exc}") from exc
