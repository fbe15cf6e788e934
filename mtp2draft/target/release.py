"""Whether a release as an engine loads it will run its MTP layer well: a quantised re-release or a fine-tune of a
family mtp2draft knows, judged from config.json, the index and shard headers only (no tensor bytes).

Five facts, then one verdict:
- which MTP layers the checkpoint holds (keys under the spec's block prefix or its named glue keys), and where: the
  index's shards, a separate `*mtp*.safetensors` the index names, or such a file the index does *not* name (which
  vLLM 0.34 does not load);
- the storage of each tensor group of the layer (bf16, block FP8, int4, NVFP4, ...), from the quantisation registry
  in `checkpoint/quant.py`;
- whether the quantisation config's exclusion list (ModelOpt `exclude_modules` / `ignore`, compressed-tensors
  `ignore`, FP8 `modules_to_not_convert`) agrees with how the layer's linears are stored: a bf16 layer the config
  does not exclude is built quantised by the engine, a quantised one it excludes cannot load;
- whether the count field the engines read (`num_nextn_predict_layers`, ...) equals the layers present;
- whether the layer's storage is one MTP heads are known to lose acceptance in (`SCHEME_FIT`).

Per-scheme and per-method facts are the tables below; no family name appears in the logic. The engine facts behind
each finding, with their sources, are docs/releases.md's table of findings.

What this module does not do: read tensor values (`checkpoint/tensors.py`), or write a graft (`formats/stitched.py`).
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mtp2draft.checkpoint.tensors import UNINDEXED_MTP_FILES, Checkpoint
from mtp2draft.dtypes import ST_LINEAR_FLOATS
from mtp2draft.family.schema import Spec

# Tensor groups of an MTP layer: the first pattern that matches a key (after the layer's prefix) names its group.
GROUPS: tuple[tuple[str, str], ...] = (
    ("norms", r"norm"),
    ("head / embedding", r"(shared_head\.head|shared_head\.output|embed_tokens|lm_head)\."),
    ("router", r"(mlp\.gate\.|\.router\.|e_score_correction)"),
    ("shared experts", r"shared_expert"),
    ("routed experts", r"experts"),
    ("projection", r"(^|\.)(eh_proj|[eh]_proj|fc|fc_embedding|fc_hidden)\."),
    ("attention", r"(self_attn|attn|attention|mixer)\."),
    ("mlp", r"(mlp|ffn)\."),
)
# Groups whose 2-D weights are linears an engine's quantisation config applies to (norms, heads, routers are not).
QUANTISABLE = frozenset({"shared experts", "routed experts", "projection", "attention", "mlp"})

# scheme (checkpoint/quant.py) -> the storage's short name; compressed-tensors int adds its bit width
SCHEME_LABELS = {
    "fp8-e8m0": "fp8-e8m0",
    "fp4-e8m0": "fp4-e8m0",
    "modelopt-nvfp4": "nvfp4",
    "ct-nvfp4": "nvfp4",
    "ct-mxfp4": "mxfp4",
    "mxfp4-blocks": "mxfp4",
    "modelopt-fp8": "fp8-tensor",
    "ct-int": "int{num_bits}",
}


@dataclass(frozen=True)
class Fit:
    """How an MTP layer stored so fares: `weak` storages are where reported acceptance collapses."""

    weak: bool
    why: str


# storage -> fit; a storage not listed is treated as fine (bf16, fp32, block FP8, int8)
SCHEME_FIT: dict[str, Fit] = {
    "int4": Fit(True, "int4 MTP heads are reported at 4 % acceptance where int8 gives 59 % (JustVugg/colibri#8)"),
    "int2": Fit(True, "a 2-bit MTP head keeps little of the layer (no release ships one)"),
    "nvfp4": Fit(
        True,
        "FP4 MTP layers are where re-releases lose acceptance (a quantised Qwen3.8-27B head at 0/24 vs 48 % bf16, "
        "kekzl/imp#1428); the releases that keep it ship the layer bf16 (nvidia/GLM-5.3-Flash-NVFP4, RadixArk NVFP4)",
    ),
    "mxfp4": Fit(True, "FP4 MTP layers are where re-releases lose acceptance (kekzl/imp#1428)"),
}


# ---- the exclusion rules of each quantisation method (vLLM 0.34) ------------------------------------------------
def _fnmatch(pattern: str, module: str) -> bool:
    """ModelOpt: fnmatch wildcards on the module name (`ModelOptQuantConfigBase.is_layer_excluded`)."""
    return fnmatch.fnmatchcase(module, pattern) or module == pattern


def _ct_match(pattern: str, module: str) -> bool:
    """compressed-tensors: an exact name, or `re:` + a regex matched from the start (`is_equal_or_regex_match`)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern


def _substring(pattern: str, module: str) -> bool:
    """FP8 `modules_to_not_convert`: a module is skipped when a listed name is part of its name (transformers'
    `should_convert_module` rule, which vLLM's `Fp8Config.is_layer_skipped` also applies to a prefix)."""
    return pattern in module


@dataclass(frozen=True)
class ExclusionRule:
    fields: tuple[str, ...]  # config fields holding the list, first found wins
    nested: str  # a nested section that may hold them ("" for none)
    match: Callable[[str, str], bool]
    # whether a bf16 linear the list does not name is built quantised: false for block FP8, whose MTP classes build
    # some linears unquantised whatever the config says (DeepSeek's bf16 `eh_proj` in the FP8 release: vLLM 0.34
    # `deepseek_mtp.py` builds it with no quant_config), so only a quantised linear the list excludes is reported
    strict: bool = True


EXCLUSION_RULES: dict[str, ExclusionRule] = {
    "modelopt": ExclusionRule(("exclude_modules", "ignore"), "quantization", _fnmatch),
    "compressed-tensors": ExclusionRule(("ignore",), "", _ct_match),
    "fp8": ExclusionRule(("modules_to_not_convert", "ignored_layers"), "", _substring, strict=False),
}


def exclusion_list(config: Mapping[str, Any]) -> tuple[str, str, list[str]] | None:
    """(quant_method, field, patterns) of config.json's quantisation config; None when it has no method we know."""
    q = quantization_config(config)
    method = str(q.get("quant_method") or "").lower()
    rule = EXCLUSION_RULES.get(method)
    if rule is None:
        return None
    sections = [q[rule.nested]] if rule.nested and isinstance(q.get(rule.nested), Mapping) else []
    for section in [*sections, q]:
        for name in rule.fields:
            if isinstance(section.get(name), list):
                return method, name, [str(p) for p in section[name]]
    return method, rule.fields[0], []


def quantization_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    q = config.get("quantization_config")
    if q is None:
        q = next((v.get("quantization_config") for v in config.values() if isinstance(v, Mapping)), None)
    return q if isinstance(q, Mapping) else {}


def excluded(config: Mapping[str, Any], module: str) -> bool:
    found = exclusion_list(config)
    if found is None:
        return False
    rule = EXCLUSION_RULES[found[0]]
    return any(rule.match(p, module) for p in found[2])


# ---- the diagnosis ----------------------------------------------------------------------------------------------
def _group(rest: str) -> str:
    for name, pattern in GROUPS:
        if re.search(pattern, rest):
            return name
    return "other"


def storage(ckpt: Checkpoint, key: str) -> str:
    """How logical weight `key` is stored: a quantisation scheme's short name, `fp8-block` for an e4m3 weight with a
    `_scale_inv`, else the stored dtype in lower case (bf16, f32)."""
    scheme = ckpt.scheme_of(key)
    if scheme is not None:
        params = ckpt.quant_method.params_for(key)
        return SCHEME_LABELS.get(scheme.name, scheme.name).format(num_bits=params.get("num_bits", "?"))
    dtype = ckpt.info(key).dtype
    return "fp8-block" if dtype.startswith("F8") else dtype.lower()


def layer_prefix(keys: list[str]) -> str:
    """The longest dotted prefix the keys share, without its trailing dot (`model.layers.8`, `mtp`)."""
    parts = [k.split(".") for k in keys]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return ".".join(common[: min(len(p) for p in parts) - 1]) if parts else ""


def layer_keys(ckpt: Checkpoint, spec: Spec, layer: int, trunk: set[str]) -> list[str]:
    """The logical keys of MTP layer `layer` in the checkpoint: its block and its glue, not what it shares with the
    trunk (a final norm some families share)."""
    cfg = ckpt.config
    block = ckpt.keys_with_prefix(spec.key(spec.keys.block, cfg, layer))
    glue = [k for k in spec.component_keys(cfg, layer).values() if k not in trunk and ckpt.has(k)]
    return sorted(set(block) | set(glue))


def trunk_names(spec: Spec, cfg: Mapping[str, Any]) -> set[str]:
    """Keys the spec names that belong to the trunk (embedding, head, final norm), which a layer may share."""
    return {spec.key(t, cfg, 0) for t in (spec.keys.target_embed, spec.keys.target_head, spec.keys.target_norm) if t}


PROBE_LAYERS = 8  # layer indices looked for past the count field (a count that says fewer than are stored)


def diagnose(ckpt: Checkpoint, spec: Spec) -> dict[str, Any]:
    """The release check of `ckpt` (see the module docstring): facts, problems (kind, text) and one verdict."""
    cfg = ckpt.config
    count = spec.num_mtp_layers(cfg)
    trunk = trunk_names(spec, cfg)
    layers: list[dict[str, Any]] = []
    for i in range(max(count, 0) + PROBE_LAYERS):
        keys = layer_keys(ckpt, spec, i, trunk)
        if not keys:
            if i >= count:
                break
            continue
        layers.append(_layer_facts(ckpt, i, keys))
    present = [entry["layer"] for entry in layers]
    problems: list[dict[str, str]] = []
    field = spec.config.mtp_count
    where = f"{spec.config.text_config}.{field}" if spec.config.text_config else field
    if not present:
        said = f"; config.json's {where} still says {count}" if count else ""
        problems.append(
            {"kind": "missing", "text": f"the checkpoint holds no MTP layer: engines run no MTP draft{said}"}
        )
    elif present != list(range(count)):
        problems.append(
            {
                "kind": "count",
                "text": f"config.json's {where} says {count}, the checkpoint holds {len(present)} MTP layer(s) "
                f"({', '.join(map(str, present))}): engines build {count} and "
                + ("run no draft" if count == 0 else "fail on the missing weights or ignore the extra ones")
                + f"; set {where} to {len(present)}",
            }
        )
    for entry in layers:
        for file in entry["unindexed_files"]:
            problems.append(
                {
                    "kind": "unindexed",
                    "text": f"MTP layer {entry['layer']} is in {file}, which model.safetensors.index.json does not "
                    "name: vLLM 0.34 loads only the files the index names (SGLang 0.5.23 re-adds one for GLM-4 MoE "
                    "only); add its tensors to the index",
                }
            )
        problems += _exclusion_problems(cfg, entry)
        for label in sorted(entry["storages"]):
            fit = SCHEME_FIT.get(label)
            if fit and fit.weak:
                problems.append(
                    {
                        "kind": "weak",
                        "text": f"MTP layer {entry['layer']} has {entry['storages'][label]} weight(s) stored "
                        f"{label}: engines run it, but {fit.why}",
                    }
                )
    problems.sort(key=lambda p: list(REMEDIES).index(p["kind"]))  # the most severe first: it decides the verdict
    exclusion = exclusion_list(cfg)
    return {
        "count_field": where,
        "count": count,
        "layers_present": present,
        "layers": layers,
        "quantisation": ckpt.quant_method.name,
        "exclusion": None
        if exclusion is None
        else {"method": exclusion[0], "field": exclusion[1], "patterns": exclusion[2]},
        "problems": problems,
        "status": "ok" if not problems else problems[0]["kind"],
        "verdict": verdict(problems, present),
    }


def _layer_facts(ckpt: Checkpoint, layer: int, keys: list[str]) -> dict[str, Any]:
    prefix = layer_prefix(keys)
    groups: dict[str, Counter] = {}
    linears: list[tuple[str, bool]] = []  # (module, stored quantised) of the layer's quantisable linears
    files: set[str] = set()
    for key in keys:
        weight = ckpt.quantised(key)
        files.add(ckpt.weight_map[weight.data if weight else key])
        group = _group(key[len(prefix) :])
        label = storage(ckpt, key)
        groups.setdefault(group, Counter())[label] += 1
        if group in QUANTISABLE and key.endswith("weight") and len(ckpt.shape_of(key)) >= 2:
            linears.append((key.removesuffix(".weight"), weight is not None or label.startswith("fp8")))
    storages: Counter = Counter()
    for group, counter in groups.items():
        if group in QUANTISABLE:
            storages.update(counter)
    return {
        "layer": layer,
        "prefix": prefix,
        "files": sorted(files),
        "place": _place(ckpt, files),
        "unindexed_files": sorted(f for f in files if f in ckpt.unindexed),
        "groups": {g: dict(sorted(c.items())) for g, c in sorted(groups.items())},
        "storages": dict(sorted(storages.items())),
        "linears": linears,
    }


def _place(ckpt: Checkpoint, files: set[str]) -> str:
    if any(f in ckpt.unindexed for f in files):
        return "a separate file the index does not name"
    if all(fnmatch.fnmatch(f, UNINDEXED_MTP_FILES) for f in files):
        return "a separate file the index names"
    return "the index's shards"


def _exclusion_problems(cfg: Mapping[str, Any], entry: dict[str, Any]) -> list[dict[str, str]]:
    found = exclusion_list(cfg)
    if found is None:
        return []
    method, field, patterns = found
    layer, prefix = entry["layer"], entry["prefix"]
    strict = EXCLUSION_RULES[method].strict
    plain = [m for m, q in entry["linears"] if strict and not q and not excluded(cfg, m)]
    packed = [m for m, q in entry["linears"] if q and excluded(cfg, m)]
    out = []
    if plain:
        rule = EXCLUSION_RULES[method]
        dead = [p for p in patterns if not rule.match(p, prefix) and _names_a_layer(p)]
        hint = f" ({', '.join(dead[:2])} in it names another namespace)" if dead else ""
        out.append(
            {
                "kind": "exclusion",
                "text": f"MTP layer {layer} stores {len(plain)} linear(s) unquantised (e.g. {plain[0]}) but "
                f"quantization_config.{field}{hint} does not exclude them: the engine builds them {method}-"
                f"quantised and misreads the bf16 weights; add {prefix}.* to {field}",
            }
        )
    if packed:
        out.append(
            {
                "kind": "exclusion",
                "text": f"MTP layer {layer} stores {len(packed)} linear(s) quantised (e.g. {packed[0]}) that "
                f"quantization_config.{field} excludes: the engine builds them unquantised and cannot load them",
            }
        )
    return out


def unexcluded(config: Mapping[str, Any], stored: Mapping[str, tuple[str, list[int]]]) -> list[str]:
    """One line per MTP linear stored in a float dtype (key -> (safetensors dtype, shape)) that config.json's
    quantisation would build quantised: what `validate` reports for an overlay, as the engines will read it."""
    found = exclusion_list(config)
    if found is None or not EXCLUSION_RULES[found[0]].strict:
        return []
    out = []
    for key, (dtype, shape) in sorted(stored.items()):
        module = key.removesuffix(".weight")
        linear = key.endswith(".weight") and len(shape) >= 2 and _group(key) in QUANTISABLE
        if linear and dtype in ST_LINEAR_FLOATS and not excluded(config, module):
            out.append(
                f"{key} is stored {dtype} but quantization_config.{found[1]} does not exclude {module}: the engine "
                f"builds it {found[0]}-quantised"
            )
    return out


def _names_a_layer(pattern: str) -> bool:
    return re.search(r"layers?\W*\d|mtp", pattern) is not None


# problem kind -> what to do (the first problem decides the verdict; `{base}` is the original release)
REMEDIES = {
    "missing": "graft one: `mtp2draft convert <base release> --out base-draft`, then `mtp2draft export base-draft "
    "--format stitched --target <this release> --out grafted` (realign it first with `mtp2draft distill --target "
    "<this release>`)",
    "count": "fix the count field (`mtp2draft export --format stitched --target <this release>` writes it)",
    "unindexed": "re-index the layer (`mtp2draft export --format stitched --target <this release>` writes the index)",
    "exclusion": "exclude the layer in the namespace its keys use (`mtp2draft export --format stitched` writes it)",
    "weak": "graft the bf16 layer from the base release (`mtp2draft export base-draft --format stitched --target "
    "<this release>`), realigned with `mtp2draft distill --target <this release>`",
}


def verdict(problems: list[dict[str, str]], present: list[int]) -> str:
    if not problems:
        return f"ok: {len(present)} MTP layer(s), loaded and quantised as the engines expect"
    first = problems[0]
    more = f" (+{len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{first['kind']}: {first['text']}{more}. What to do: {REMEDIES[first['kind']]}"
