"""Stage 1: checkpoint + spec -> draft directory (`--to mtp`, the native layer; `--to eagle3`, SGLang's EAGLE-3).

Reads config.json and the index, selects the MTP layer's tensors by key (never by shard name), fetches only their
bytes, dequantises FP8, and writes group by group, so peak memory follows the largest tensor group. The output
directory appears complete or not at all.

Also `inspect_checkpoint`: what a SOURCE holds and what a conversion would fetch, from config, index and headers only.

What this module does not do: train (`train/recipe.py`), or write engine-specific exports beyond the EAGLE-3 SGLang layout
(`formats/export.py`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.checkpoint.dspark import inspect_dspark
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.checkpoint.tensors import Checkpoint, check_finite
from mtp2draft.conversion.dspark import convert_dspark
from mtp2draft.draft.build import converted_config
from mtp2draft.draft.eagle3 import Eagle3Draft, vocab_maps, without_identity_maps
from mtp2draft.draft.eagle3_config import TOKEN_FIELDS, sglang_config
from mtp2draft.draft.layout import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    MtpLayerPlan,
    expert_keys,
    iter_native_tensors,
    plan_mtp_layer,
    resolve_layer,
    target_head_key,
)
from mtp2draft.draft.modules import block_config
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.eagle3.transfer import Eagle3Build
from mtp2draft.eagle3.transforms import EAGLE3_TRANSFORMS, check_eagle3_transforms
from mtp2draft.errors import CheckpointError, Mtp2DraftError, OptionError, ShallowTargetError
from mtp2draft.family.dspark import dspark_fields
from mtp2draft.family.schema import ENGINES, Spec
from mtp2draft.family.spec import find_spec
from mtp2draft.family.transforms import LOAD_TRANSFORMS
from mtp2draft.kinds import CONFIG_FILE, DSPARK_KIND, PROVENANCE_FILE, WEIGHTS_FILE, DraftKind
from mtp2draft.manifest import write_json
from mtp2draft.outputs.directories import atomic_output_dir, check_output_dir
from mtp2draft.outputs.writer import SafetensorsWriter, save_tensors
from mtp2draft.progress import Progress, meter, quiet
from mtp2draft.redact import command_line
from mtp2draft.settings import ConvertConfig, HubAccess

# ---- EAGLE-3 --------------------------------------------------------------------------------------------------------
# fc fuses three distinct target layers, and engines capture layer inputs only (the outputs of layers 0..N-2).
MIN_EAGLE3_LAYERS = 4


def default_aux_layers(num_layers: int) -> list[int]:
    """Target layers whose outputs EAGLE-3's fc fuses, 0-based 'output of layer i' (SGLang eagle_config ids).

    The high one is the last layer engines can capture (they capture the input of a layer, never the output of the
    final one): the output of layer N-2, the closest to the final hidden state the MTP layer was trained on. The
    mid one is the usual N//2 - 1 and the low one layer 1 (layer 0 when the target is too shallow for distinct ids).
    """
    if num_layers < MIN_EAGLE3_LAYERS:
        raise ShallowTargetError(
            f"EAGLE-3 needs three distinct capturable target layers (the outputs of layers 0..N-2), so a target of "
            f"at least {MIN_EAGLE3_LAYERS} layers; this one has {num_layers}: convert --to mtp instead"
        )
    high = num_layers - 2
    mid = max(min(num_layers // 2 - 1, high - 1), 1)
    # Layer 1 as the low id wherever three distinct ids allow it (N >= 5): it is EAGLE-3's usual choice, and the
    # only low id below 2 SGLang can express for DeepSeek targets (it adds 1 to the ids only when the first is 1).
    low = 1 if mid > 1 else 0
    return [low, mid, high]


def refuse_eagle3(spec: Spec) -> None:
    """OptionError when the family has no EAGLE-3 conversion: its spec names no `[eagle3] transforms` (no engine
    captures its aux states, and its block has no EAGLE-3 counterpart the transfers know)."""
    if not spec.eagle3.transforms:
        served = [e for e in ENGINES if spec.serves(e, DraftKind.MTP)]
        raise OptionError(
            f"{spec.name} has no EAGLE-3 conversion (spec {spec.path} names no [eagle3] transforms); its native MTP "
            f"draft is served by {', '.join(served) or 'no engine'}: use --to mtp"
        )


def build_eagle3(
    ckpt: Checkpoint,
    spec: Spec,
    plan: MtpLayerPlan,
    aux_layers: list[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """EAGLE-3 config, weights (in `dtype`) and per-tensor provenance, initialised from the MTP layer by the
    transforms the spec names. Experts are read one at a time, and only those the MoE transform keeps.

    Memory: the transforms compute in fp32 on the inputs they read, and what each one wrote is checked finite and
    cast to `dtype` as soon as it returns, so the build holds the finished layer in `dtype` plus one transform's fp32
    working set, never the whole layer in fp32. The cast commutes with what later transforms still do to earlier
    outputs (concatenate heads, repeat kv heads: copies), so the bytes equal a cast of the all-fp32 result."""
    cfg = ckpt.config
    refuse_eagle3(spec)
    check_eagle3_transforms(spec)
    text = spec.text_config(cfg)
    by_module = {g.module_key: g for g in plan.groups}
    cache: dict[str, torch.Tensor] = {}

    def tensor(name: str) -> torch.Tensor:
        if name not in cache:
            g = by_module.get(name)
            if g is None:
                raise CheckpointError(f"the EAGLE-3 transforms need {name}, which this MTP layer does not have")
            raw = ckpt.read_weights(g.ckpt_keys)
            parts = [raw[k] for k in g.ckpt_keys]
            cache[name] = LOAD_TRANSFORMS[g.transform].combine(g, parts) if g.transform else parts[0]
        return cache[name]

    def expert(e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys = expert_keys(plan, e)
        if keys is not None:  # stored one by one: read this expert's three tensors only
            raw = ckpt.read_weights(keys)
            return raw[keys[0]], raw[keys[1]], raw[keys[2]]
        gate_up, down = tensor(EXPERTS_GATE_UP), tensor(EXPERTS_DOWN)  # stored fused: [E, 2I, H], [E, H, I]
        g, u = gate_up[e].chunk(2, dim=0)
        return g, u, down[e]

    def head() -> torch.Tensor:  # copied as it is: read straight into the output dtype, never held in fp32
        key = target_head_key(ckpt, spec, plan)
        return ckpt.read_weights([key], dtype)[key]

    aux = _aux_layers(spec.num_layers(cfg), aux_layers)
    b = Eagle3Build(spec, block_config(spec, cfg), text, tensor, by_module.__contains__, expert, head, aux)
    b.shapes.update(plan.expected)
    b.dtype = dtype
    b.config.update(hidden_size=int(text["hidden_size"]), hidden_act="silu", vocab_size=int(text["vocab_size"]))
    done: dict[str, torch.Tensor] = {}  # outputs already checked and cast (by identity: transforms reassign)
    for name in spec.eagle3.transforms:
        EAGLE3_TRANSFORMS[name](b)
        cache.clear()  # inputs are re-read by the transform that needs them, not kept for the whole build
        for key, value in b.out.items():
            if done.get(key) is not value:  # the transforms' arithmetic, too, must stay finite
                b.out[key] = done[key] = check_finite(key, value).to(dtype)
        _return_freed_memory()
    config = _sglang_layout_config(b.config, text, aux, cfg, spec.name)
    # every weight the SGLang layout needs must have been produced by the spec's transforms
    with torch.device("meta"):
        expected = Eagle3Draft(config).state_dict()
    missing = sorted(set(expected) - set(b.out) - {"d2t", "t2d"})
    if missing:
        raise CheckpointError(f"spec {spec.name}: eagle3.transforms leave {', '.join(missing)} uninitialised")
    return config, b.out, b.provenance


def _sglang_layout_config(
    fields: dict[str, Any], text: dict[str, Any], aux: list[int], target_config: dict[str, Any], spec_name: str
) -> dict[str, Any]:
    """config.json of the new EAGLE-3 draft, through the `sglang` format's own codec (one builder of that layout):
    the transforms' Llama fields, the target's width, token ids and aux ids ('input of layer i' at the top level;
    `eagle_config` in SGLang's terms for the family). convert adds the `mtp2draft` record and the dtype itself."""
    draft = {"rms_norm_eps": float(text.get("rms_norm_eps", 1e-6)), **fields}
    draft.update(target_hidden_size=int(text["hidden_size"]), eagle_aux_hidden_state_layer_ids=[i + 1 for i in aux])
    draft["mtp2draft"] = {"spec": spec_name}  # the family, for the SGLang aux id rule
    for key in TOKEN_FIELDS:
        if key in text or key in target_config:
            draft[key] = text.get(key, target_config.get(key))
    config = sglang_config(draft, torch.bfloat16)
    del config["mtp2draft"]  # written last, in full, by convert
    return config


def _return_freed_memory() -> None:
    """Give the heap pages a transform freed back to the OS. glibc's malloc keeps them for later allocations, which
    fragments them, so the process's RSS would climb towards the sum of the transforms' fp32 working sets rather than
    the largest one (benchmarks/bench_convert.py measures it). A no-op where the C library has no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _aux_layers(num_layers: int, aux_layers: list[int] | None) -> list[int]:
    """The three target layers fc fuses: the given ones, checked, or `default_aux_layers`."""
    aux = list(aux_layers) if aux_layers else default_aux_layers(num_layers)
    if len(aux) != 3 or len(set(aux)) != 3 or not all(0 <= i < num_layers - 1 for i in aux):
        # repeated ids are refused by every exporter (and by SGLang's fc, which expects three different layers)
        raise CheckpointError(f"aux layer ids must be three distinct target layers in 0..{num_layers - 2}, got {aux}")
    return aux


# ---- the stage --------------------------------------------------------------------------------------------------------
@dataclass
class ConvertResult:
    out: Path
    kind: str
    spec: str
    layer: int
    num_mtp_layers: int
    bytes_fetched: int
    bytes_needed: int
    checkpoint_bytes: int
    seconds: float
    provenance: dict[str, Any] = field(default_factory=dict)


def default_kind(spec: Spec) -> DraftKind:
    """The draft kind made when none is asked for: native MTP where an engine serves it for the family, EAGLE-3
    otherwise (docs/notes/eagle3-from-mtp.md: distilled for the same steps, the native draft accepts more than an EAGLE-3
    draft converted from the same layer)."""
    return DraftKind.MTP if any(spec.serves(e, DraftKind.MTP) for e in ENGINES) else DraftKind.EAGLE3


def check_conversion(ckpt: Checkpoint, config: ConvertConfig) -> tuple[Spec, ConvertConfig, int, int]:
    """Everything `convert` refuses from the checkpoint's config alone, before any tensor byte is read (`run`'s
    pre-flight calls it too): the family, the layer, and for EAGLE-3 a family with a conversion and a target deep
    enough for its aux layers. Returns (spec, the config with its kind filled in, layer, MTP layer count)."""
    spec = find_spec(ckpt.config)
    if config.to is None:
        config = replace(config, to=default_kind(spec))  # re-checked with the kind filled in
    layer, count = resolve_layer(ckpt, spec, config.layer)
    if config.to == DraftKind.EAGLE3:
        refuse_eagle3(spec)
        _aux_layers(spec.num_layers(ckpt.config), config.aux_layers)
    return spec, config, layer, count


def convert(
    source: str,
    out: str | Path,
    config: ConvertConfig | None = None,
    *,
    hub: HubAccess | None = None,
    overwrite: bool = False,
    progress: Progress = quiet,
    **settings: Any,
) -> ConvertResult:
    """Convert MTP layer `config.layer` of SOURCE into a draft directory `out` (`config.to`: mtp or eagle3); with
    `config.all_layers`, every MTP layer the checkpoint ships into one native chain draft (`draft/chain.py`, layer i
    at step i). Without `config`, `settings` are `ConvertConfig`'s fields by keyword (`to="eagle3", dtype=...`).
    `hub`: SOURCE's revision and the token that reaches it."""
    config = config or ConvertConfig(**settings)
    hub = hub or HubAccess()
    revision, token = hub.revision, hub.token
    check_output_dir(out, overwrite, inputs=[source])
    started = time.perf_counter()
    progress(f"resolving {source}")
    ckpt = open_checkpoint(source, revision, token)
    dspark = dspark_fields(ckpt.config)
    if dspark is not None:  # the config's dspark_* keys: all the stages, as a dspark draft directory
        got = convert_dspark(ckpt, dspark, out, config, source=source, revision=revision, overwrite=overwrite,
                             progress=progress)  # fmt: skip
        return ConvertResult(Path(out), DSPARK_KIND, got["model_type"], 0, got["num_stages"], ckpt.bytes_fetched,
                             got["drafter_bytes"], got["checkpoint_bytes"], got["seconds"], got["provenance"])  # fmt: skip
    spec, config, layer, count = check_conversion(ckpt, config)
    to, all_layers, aux_layers = DraftKind(config.to), config.all_layers, config.aux_layers
    dtype = config.draft_dtype  # not named: fp32 tensors of the checkpoint stay fp32 (native drafts)
    progress(f"{spec.name}: MTP layer {layer} of {count}; reading shard headers")
    # every declared layer planned (headers only), as `inspect` does: a checkpoint declaring more MTP layers than it
    # ships is refused whichever layer is asked for, not converted as if its config were whole
    every = [plan_mtp_layer(ckpt, spec, j) for j in range(count)]
    plan = every[layer]
    plans = every if all_layers else [plan]
    for p in plans:
        check_weight_dtypes(ckpt, p.checkpoint_keys)
    provenance = _provenance(ckpt, spec, plan, source, revision, to, dtype)
    if all_layers:
        provenance["mtp_layers"] = list(range(count))
        provenance["dequantised_fp8"] = [k for p in plans for k in p.checkpoint_keys if ckpt.scale_key(k)]
        provenance["dequantised"] = _dequantised(ckpt, [k for p in plans for k in p.checkpoint_keys])
        provenance["stored_float32"] = [k for p in plans for k in p.checkpoint_keys
                                        if k in ckpt.weight_map and ckpt.info(k).dtype == "F32"]  # fmt: skip
    with atomic_output_dir(out, overwrite, inputs=[source]) as tmp:
        if to == DraftKind.MTP:
            keep = config.dtype is None
            draft_cfg = _write_native_draft(ckpt, plans, tmp, dtype, provenance, progress, all_layers, keep)
        else:
            draft_cfg = _write_eagle3_draft(ckpt, plan, tmp, dtype, aux_layers, provenance, progress)
        draft_cfg["mtp2draft"] = {
            "version": __version__,
            "spec": spec.name,
            "source": ckpt.source,
            "commit": ckpt.commit,
            "mtp_layer": layer,
            "target_num_layers": spec.num_layers(ckpt.config),  # lets `validate` check aux ids without the target
        }
        tokenizer = tokenizer_digests(ckpt)
        if tokenizer:  # lets a graft refuse a release with another tokenizer (formats/graft.py)
            draft_cfg["mtp2draft"]["tokenizer_sha256"] = tokenizer
        if to == DraftKind.EAGLE3:  # the target it belongs to (a native draft keeps it as `target_config`)
            draft_cfg["mtp2draft"]["target_config"] = dict(ckpt.config)
        write_json(tmp / CONFIG_FILE, draft_cfg)
        provenance["bytes_fetched"] = ckpt.bytes_fetched
        write_json(tmp / PROVENANCE_FILE, provenance)
    # bytes needed: exact for the native layer; the EAGLE-3 transforms read a subset (experts), so what they fetched
    keys = [k for p in plans for k in p.checkpoint_keys]
    needed = ckpt.bytes_for(keys) if to == DraftKind.MTP else ckpt.bytes_fetched
    seconds = time.perf_counter() - started
    return ConvertResult(
        Path(out), to, spec.name, layer, count, ckpt.bytes_fetched, needed, ckpt.total_bytes(), seconds, provenance
    )


def _provenance(
    ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan, source: str, revision: str | None, to: DraftKind, dtype: str
) -> dict[str, Any]:
    """provenance.json's head: where the draft comes from and how it was made (the writers add the tensors)."""
    dequantised = [k for k in plan.checkpoint_keys if ckpt.scale_key(k)]
    return {
        "tool": "mtp2draft",
        "version": __version__,
        "command": command_line(),
        "source": str(source),  # as the user named it
        "revision": revision,
        "commit": ckpt.commit,
        "spec": spec.name,
        "spec_verified": spec.verified,
        "mtp_layer": plan.layer,
        "draft_kind": to,
        "dtype": dtype,
        "dequantised_fp8": dequantised,
        "fp8_block_size": list(ckpt.fp8_block_size()) if dequantised else None,
        "quantization": ckpt.quant_method.name,
        "dequantised": _dequantised(ckpt, plan.checkpoint_keys),  # scheme -> keys (other than `_scale_inv` FP8)
        # stored fp32 (V4's hc_* mixes, sinks, router bias): an export without --target writes them back so
        "stored_float32": [k for k in plan.checkpoint_keys if k in ckpt.weight_map and ckpt.info(k).dtype == "F32"],
        "unindexed_files": dict(ckpt.unindexed),
    }


def _dequantised(ckpt: Checkpoint, keys: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in keys:
        scheme = ckpt.scheme_of(key)
        if scheme is not None:
            out.setdefault(scheme.name, []).append(key)
    return out


def _write_native_draft(
    ckpt: Checkpoint,
    plans: list[MtpLayerPlan],
    out: Path,
    dtype: str,
    provenance: dict[str, Any],
    progress: Progress,
    chain: bool = False,
    keep_float32: bool = False,
) -> dict[str, Any]:
    """`--to mtp`: the layer's tensors streamed into out/model.safetensors; with `chain` (`--all-layers`) every
    layer's, layer j under `layers.{j}.` (`draft/chain.py`). With `keep_float32` (no --dtype named), a tensor the
    checkpoint stores in fp32 stays fp32. Returns the draft's config; provenance's `exact` is what the write
    measured (`iter_native_tensors`), never assumed."""
    from mtp2draft.draft.chain import chain_config

    prefixed = [(f"layers.{j}." if chain else "", plan) for j, plan in enumerate(plans)]
    exact = _write_native(ckpt, prefixed, out, TORCH_DTYPES[dtype], progress, keep_float32)
    provenance["tensors"] = {
        prefix + g.module_key: {
            "exact": exact[prefix + g.module_key],
            "from": list(g.ckpt_keys),
            "how": g.transform or "copied",
        }
        for prefix, plan in prefixed
        for g in plan.groups
    }
    first = plans[0]
    draft_cfg = converted_config(first.spec, ckpt.config, first.layer)  # the layer kind's own hand-over
    if chain:
        draft_cfg = chain_config(draft_cfg, [p.layer for p in plans])
    draft_cfg["torch_dtype"] = dtype
    return draft_cfg


def _write_eagle3_draft(
    ckpt: Checkpoint,
    plan: MtpLayerPlan,
    out: Path,
    dtype: str,
    aux_layers: list[int] | None,
    provenance: dict[str, Any],
    progress: Progress,
) -> dict[str, Any]:
    """`--to eagle3`: the EAGLE-3 layer initialised from the MTP layer, written with identity vocab maps (the full
    vocabulary; distill narrows it); returns the draft's config."""
    progress("initialising the EAGLE-3 layer from the MTP layer")
    draft_cfg, weights, tensor_prov = build_eagle3(ckpt, plan.spec, plan, aux_layers, TORCH_DTYPES[dtype])
    draft_cfg["torch_dtype"] = dtype
    d2t, t2d = vocab_maps(torch.arange(draft_cfg["draft_vocab_size"]), draft_cfg["vocab_size"])
    ordered = {k: weights[k] for k in sorted(weights)}  # already in `dtype` (build_eagle3 casts as it goes)
    del weights
    ordered["d2t"], ordered["t2d"] = d2t, t2d
    ordered = without_identity_maps(ordered, draft_cfg["vocab_size"], draft_cfg["draft_vocab_size"])
    save_tensors(out / WEIGHTS_FILE, ordered, {"format": "pt"})
    provenance["tensors"] = tensor_prov
    provenance["aux_layer_ids"] = [i - 1 for i in draft_cfg["eagle_aux_hidden_state_layer_ids"]]
    return draft_cfg


def check_weight_dtypes(ckpt: Checkpoint, keys: list[str]) -> None:
    """Every MTP tensor must be stored as a float (FP8 included): an integer "weight" would convert, then crash an
    exporter or an engine."""
    for key in keys:
        if not ckpt.weight_dtype(key).is_floating_point:
            raise CheckpointError(f"{key} is stored as {ckpt.info(key).dtype}: MTP weights must be floating point")


def _write_native(
    ckpt: Checkpoint,
    plans: list[tuple[str, MtpLayerPlan]],
    out: Path,
    dtype: torch.dtype,
    progress: Progress,
    keep_float32: bool = False,
) -> dict[str, bool]:
    """Stream the layers' tensors into out/model.safetensors, each under its (prefix, plan): one layer with prefix
    "" for a one-layer draft, `layers.{j}.` for each of a chain's. One tensor group in memory at a time. Returns,
    per written key, whether it holds the checkpoint's values unrounded."""
    # dtypes come from the header (integer tensors stay as stored), shapes from the module the config implies
    tensor_plan, kept = [], {}
    for prefix, plan in plans:
        kept[prefix] = {g.module_key for g in plan.groups if keep_float32 and _all_float32(ckpt, g.ckpt_keys)}
        for g in plan.groups:
            stored = ckpt.weight_dtype(g.ckpt_keys[0])
            fp32 = g.module_key in plan.buffers or g.module_key in kept[prefix]
            want = stored if not stored.is_floating_point else torch.float32 if fp32 else dtype
            tensor_plan.append((prefix + g.module_key, want, plan.expected[g.module_key]))
    total = sum(math.prod(shape) * want.itemsize for _, want, shape in tensor_plan)
    bar = meter(progress, "convert", total, "B")
    measured: dict[str, bool] = {}
    with SafetensorsWriter(out / WEIGHTS_FILE, tensor_plan, {"format": "pt"}) as writer:
        for prefix, plan in plans:
            exact: dict[str, bool] = {}
            for key, tensor in iter_native_tensors(ckpt, plan, dtype, kept[prefix], exact):
                writer.write(prefix + key, tensor)
                bar.update(tensor.numel() * tensor.element_size())
                del tensor  # let the group go before the next one is read
            measured.update({prefix + k: v for k, v in exact.items()})
    bar.close()
    return measured


def _all_float32(ckpt: Checkpoint, keys: Iterable[str]) -> bool:
    """Whether every one of `keys` is stored in fp32 (not dequantised from a smaller format)."""
    return all(k in ckpt.weight_map and ckpt.info(k).dtype == "F32" and not ckpt.scale_key(k) for k in keys)


# ---- inspect --------------------------------------------------------------------------------------------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def tokenizer_digests(ckpt: Checkpoint) -> dict[str, str]:
    """sha256 of the tokenizer files of a local checkpoint (a hub one's are not fetched for this): file -> digest."""
    if not ckpt.is_local:
        return {}
    root = Path(ckpt.source)
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in TOKENIZER_FILES if (root / n).is_file()}


def inspect_checkpoint(source: str, hub: HubAccess | None = None) -> dict[str, Any]:
    """Family, MTP layers and their tensors, and the bytes a conversion fetches vs the whole checkpoint.

    Reads config, index and the headers of the shards holding MTP tensors; no tensor bytes. A DSpark drafter (the
    config's `dspark_*` keys, `family.dspark`) is described by `checkpoint.dspark` instead."""
    from mtp2draft.target.release import diagnose

    hub = hub or HubAccess()
    ckpt = open_checkpoint(source, hub.revision, hub.token)
    dspark = dspark_fields(ckpt.config)
    if dspark is not None:
        return inspect_dspark(ckpt, dspark)
    spec = find_spec(ckpt.config)
    count = spec.num_mtp_layers(ckpt.config)
    release = diagnose(ckpt, spec)
    layers = []
    # A release whose count field and weights disagree on every layer (none stored, or a count of 0 over a stored
    # layer) is reported, not refused: the release check says what is wrong and what to do.
    listed = range(count) if set(release["layers_present"]) & set(range(count)) else range(0)
    try:
        if count > 0 and listed:
            resolve_layer(ckpt, spec, 0)
        plans = [plan_mtp_layer(ckpt, spec, layer) for layer in listed]
    except Mtp2DraftError as exc:
        if release["status"] == "ok":
            raise
        raise type(exc)(f"{exc} (release check: {release['verdict']})") from exc
    for layer, plan in zip(listed, plans, strict=True):
        keys = ckpt.needed_keys(plan.checkpoint_keys)
        tensors = [
            {"name": k, "shape": list(ckpt.info(k).shape), "dtype": ckpt.info(k).dtype, "bytes": ckpt.info(k).nbytes}
            for k in keys
        ]
        params = sum(math.prod(ckpt.shape_of(k)) for k in plan.checkpoint_keys)
        schemes = Counter(s.name for s in map(ckpt.scheme_of, plan.checkpoint_keys) if s is not None)
        layers.append(
            {
                "layer": layer,
                "parameters": params,
                "bytes": sum(t["bytes"] for t in tensors),
                "fp8_weights": sum(1 for k in plan.checkpoint_keys if ckpt.scale_key(k)),
                "quantised_weights": dict(sorted(schemes.items())),  # scheme -> count (checkpoint/quant.py)
                "stored_embed": plan.stored_embed,
                "stored_head": plan.stored_head,
                "tensors": tensors,
            }
        )
    return {
        "source": ckpt.source,
        "commit": ckpt.commit,
        "spec": spec.name,
        "family": spec.description,
        "block": f"{spec.block.attention} + {spec.block.mlp}",
        "num_mtp_layers": count,
        "layers": layers,
        "convert_bytes": layers[0]["bytes"] if layers else 0,
        "checkpoint_bytes": ckpt.total_bytes(),
        "bytes_read_by_inspect": ckpt.bytes_fetched,
        "unindexed_files": dict(ckpt.unindexed),  # file -> tensors found there, outside the index
        "release": release,  # as an engine loads it: where the layer is, how stored, excluded, counted (target/release.py)
    }
