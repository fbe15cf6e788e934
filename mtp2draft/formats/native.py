"""The native MTP formats' shared machinery, and the `mtp` format: mtp2draft's own native draft directory
(`convert --to mtp`, `distill`), which `validate` checks and which `export` reads but never writes.

Shared by `nextn` and `stitched`: the native layer seen under checkpoint key names (`NativeLayer`), the target
checkpoint's stored dtypes / FP8 layout (`_Stored`, `requantize_fp8`), the streaming shard writer, and the record of
which computation the draft was trained for (`engine_mismatches`).

What this module does not do: write either export (`nextn.py`, `stitched.py`).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX, chunk_rows, fp8_block_size, quantize_fp8
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.draft.build import native_class, native_draft
from mtp2draft.draft.layout import native_to_checkpoint
from mtp2draft.dtypes import ST_DTYPES, TORCH_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import get_spec
from mtp2draft.formats import Format
from mtp2draft.formats.common import load_weights, nonfinite
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE, DraftKind

# Tensors of a shard being rewritten are copied in runs of about this many bytes (peak memory per run).
COPY_RUN_BYTES = 256 * 2**20


def num_layers_field(spec: Spec) -> str:
    return getattr(spec.config, "num_layers", "num_hidden_layers")


def with_text_fields(spec: Spec, config: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of `config` with `fields` set in its (possibly nested) text config."""
    out = copy.deepcopy(dict(config))
    text = out[spec.config.text_config] if spec.config.text_config else out
    text.update(fields)
    return out


class NativeLayer:
    """A native draft's weights seen under checkpoint key names, one module tensor in memory at a time.

    The module -> checkpoint key map comes from `native_to_checkpoint` applied to meta tensors (no bytes read); a
    tensor is read and split (e.g. fused experts -> per-expert keys) when first asked for, and the last two module
    tensors are kept (a shard interleaves the gate_up and down pieces of consecutive experts)."""

    def __init__(
        self,
        weights: Path,
        spec: Spec,
        config: Mapping[str, Any],
        layer: int,
        prefix: str = "",
        stored: Callable[[str], bool] | None = None,
    ) -> None:
        """stored: whether the checkpoint written over holds a key (its layout is written back); None: the spec's."""
        from safetensors import safe_open

        self.spec, self.config, self.layer, self.prefix, self.weights = spec, dict(config), layer, prefix, weights
        self.stored = stored
        self._to_checkpoint = native_to_checkpoint
        self._fh = safe_open(str(weights), framework="pt")
        self.module_of: dict[str, str] = {}
        self.modules_of: dict[str, list[str]] = {}  # a checkpoint tensor made of several module tensors (fused qkv)
        self.shapes: dict[str, tuple[int, ...]] = {}
        # a chain draft's file holds every layer, layer j under `layers.{j}.` (`prefix`): only this one's keys
        keys = [k[len(prefix) :] for k in self._fh.keys() if k.startswith(prefix)]  # noqa: SIM118
        for module_key in keys:
            meta = torch.empty(self._fh.get_slice(prefix + module_key).get_shape(), device="meta")
            for ckpt_key, t in native_to_checkpoint(spec, self.config, layer, {module_key: meta}, stored).items():
                self.module_of.setdefault(ckpt_key, module_key)
                self.modules_of.setdefault(ckpt_key, []).append(module_key)
                self.shapes[ckpt_key] = tuple(t.shape)
        self._cache: OrderedDict[tuple[str, ...], dict[str, torch.Tensor]] = OrderedDict()

    def checkpoint_keys(self) -> list[str]:
        return list(self.module_of)

    def get(self, ckpt_key: str) -> torch.Tensor:
        """The tensor stored under `ckpt_key` (fp32 for floating tensors)."""
        module_keys = tuple(self.modules_of[ckpt_key])
        if module_keys not in self._cache:
            state = {}
            for module_key in module_keys:
                tensor = self._fh.get_tensor(self.prefix + module_key)
                check_tensors(self.weights, {self.prefix + module_key: tensor})
                state[module_key] = tensor.float()
            self._cache[module_keys] = self._to_checkpoint(self.spec, self.config, self.layer, state, self.stored)
            while len(self._cache) > 2:
                self._cache.popitem(last=False)
        self._cache.move_to_end(module_keys)
        return self._cache[module_keys][ckpt_key]


class ChainLayers:
    """Several `NativeLayer`s (a chain draft's) seen as one: every layer's checkpoint keys."""

    def __init__(self, layers: list[NativeLayer]) -> None:
        self.layers = layers
        self.owner = {k: n for n in layers for k in n.checkpoint_keys()}
        self.shapes = {k: v for n in layers for k, v in n.shapes.items()}

    def checkpoint_keys(self) -> list[str]:
        return list(self.owner)

    def get(self, ckpt_key: str) -> torch.Tensor:
        return self.owner[ckpt_key].get(ckpt_key)


def draft_layers(src: Path, cfg: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(weight-name prefix, checkpoint MTP layer) of each layer a native draft directory holds: one for a
    single-layer draft, `layers.{j}.` for each of a chain draft's (format_version 2)."""
    from mtp2draft.draft.chain import is_chain_config

    if is_chain_config(cfg):
        return [(f"layers.{j}.", int(i)) for j, i in enumerate(cfg["mtp_layers"])]
    return [("", int(cfg.get("mtp_layer", 0)))]


def refuse_chain(cfg: Mapping[str, Any], fmt: str, why: str) -> None:
    """One line for a format that holds a single MTP layer, given a chain draft."""
    from mtp2draft.draft.chain import is_chain_config

    if is_chain_config(cfg):
        raise DraftError(
            f"the {fmt} format holds one MTP layer ({why}); this draft chains {len(cfg['mtp_layers'])}: export it "
            "as --format stitched, or convert one layer (convert --layer i)"
        )


def native_input(src: Path, cfg: Mapping[str, Any]) -> tuple[Spec, dict[str, Any], int]:
    if not (src / WEIGHTS_FILE).is_file():
        raise DraftError(f"{src} has no {WEIGHTS_FILE}")
    try:
        return get_spec(cfg["spec"]), dict(cfg["target_config"]), int(cfg.get("mtp_layer", 0))
    except KeyError as exc:
        raise DraftError(f"{src}/{CONFIG_FILE} lacks {exc} (not a native draft written by convert/distill?)") from exc


def open_target(target: str, cfg: Mapping[str, Any], revision, token) -> Checkpoint:
    """The target checkpoint, checked to be the one the draft was converted from (`identity.check_target_identity`:
    every field of its config that changes the computation)."""
    from mtp2draft.draft.config import parse_draft_config
    from mtp2draft.target.identity import check_target_identity

    ckpt = open_checkpoint(target, revision, token)
    check_target_identity(parse_draft_config(cfg), ckpt.config, f"--target {target}")
    return ckpt


@dataclass(frozen=True)
class _Stored:
    """How one checkpoint tensor is written: dtype, for block FP8 the scale's key and dtype, for a weight written in
    a quantisation scheme (`formats/requant.py`) the scheme and its parts (role -> stored name)."""

    dtype: torch.dtype
    scale_key: str | None = None
    scale_dtype: torch.dtype = torch.float32
    scheme: str | None = None
    parts: Mapping[str, str] | None = None
    chunks: int = 1  # block FP8 pre-sharded in row chunks with per-chunk scale grids, as the target stores it


def fp8_block(config: Mapping[str, Any], provenance: Mapping[str, Any]) -> tuple[tuple[int, int], bool]:
    quant = config.get("quantization_config") or {}
    block = provenance.get("fp8_block_size") or fp8_block_size(config)
    # DeepSeek-V3.1 ships power-of-two (UE8M0) scales; requantised weights keep that property.
    return (int(block[0]), int(block[1])), quant.get("scale_fmt") == "ue8m0"


def requantize_fp8(
    weight: torch.Tensor, block: tuple[int, int], ue8m0: bool = False, chunks: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 weight -> (float8_e4m3fn weight, fp32 `_scale_inv`) per block, scale = amax / 448 (`quantize_fp8`);
    with `ue8m0` the scale is rounded up to a power of two (so no value clips) and the weight requantised with it;
    with `chunks` > 1 each row chunk on its own grid, the grids stacked (`fp8.py`)."""
    if chunks > 1:
        rows = chunk_rows(weight.shape[0], chunks, "weight")
        pairs = [requantize_fp8(weight[c * rows : (c + 1) * rows], block, ue8m0) for c in range(chunks)]
        return torch.cat([q for q, _ in pairs]), torch.cat([s for _, s in pairs])
    q, scale = quantize_fp8(weight, block)
    if not ue8m0:
        return q, scale
    scale = torch.exp2(torch.ceil(torch.log2(scale)))
    m, n = weight.shape
    full = scale.repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :n]
    fmax = torch.finfo(torch.float8_e4m3fn).max
    return (weight.float() / full).clamp(-fmax, fmax).to(torch.float8_e4m3fn), scale


class NativeWriter:
    """Produces the stored form of each checkpoint tensor of the native layer: cast to the target's dtype, FP8
    requantised with `_scale_inv`, or written in a quantisation scheme's parts (all parts of one weight come out of
    one quantisation, whichever is asked for first)."""

    def __init__(self, native: NativeLayer, stored: Mapping[str, _Stored], block: tuple[int, int], ue8m0: bool):
        self.native, self.stored, self.block, self.ue8m0 = native, stored, block, ue8m0
        self.scale_of = {s.scale_key: k for k, s in stored.items() if s.scale_key}
        self.part_of = {(n, r): k for k, s in stored.items() if s.parts for r, n in s.parts.items()}
        self.weight_of = {n: k for (n, _), k in self.part_of.items()}
        self._pending: dict[str, torch.Tensor] = {}
        self.requantised: list[str] = []
        self.quantised: dict[str, list[str]] = {}  # scheme -> weights written in it

    def names(self, key: str) -> list[str]:
        stored = self.stored[key]
        if stored.parts:
            return list(stored.parts.values())
        return [key, stored.scale_key] if stored.scale_key else [key]

    def spec(self, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) of a weight, scale or part name as it will be written."""
        if key in self.weight_of:
            from mtp2draft.formats.requant import WRITERS

            weight = self.weight_of[key]
            role = next(r for r, n in self.stored[weight].parts.items() if n == key)
            return WRITERS[self.stored[weight].scheme][0](self.native.shapes[weight], self.block)[role]
        if key in self.scale_of:
            weight = self.scale_of[key]
            m, n = self.native.shapes[weight]
            c = self.stored[weight].chunks
            return self.stored[weight].scale_dtype, (c * math.ceil(m / c / self.block[0]), math.ceil(n / self.block[1]))
        return self.stored[key].dtype, self.native.shapes[key]

    def get(self, key: str) -> torch.Tensor:
        if key in self._pending:
            return self._pending.pop(key)
        if key in self.weight_of:
            return self._get_part(key)
        weight = self.scale_of.get(key, key)
        stored = self.stored[weight]
        tensor = self.native.get(weight)
        if stored.scale_key is None:
            return tensor.to(stored.dtype) if tensor.is_floating_point() else tensor
        q, scale = requantize_fp8(tensor, self.block, self.ue8m0, stored.chunks)
        self.requantised.append(weight)
        scale = scale.to(stored.scale_dtype)
        if key == weight:
            self._pending[stored.scale_key] = scale
            return q
        self._pending[weight] = q
        return scale

    def _get_part(self, name: str) -> torch.Tensor:
        from mtp2draft.formats.requant import WRITERS

        weight = self.weight_of[name]
        stored = self.stored[weight]
        parts = WRITERS[stored.scheme][1](self.native.get(weight), self.block)
        self.quantised.setdefault(stored.scheme, []).append(weight)
        for role, other in stored.parts.items():
            if other != name:
                self._pending[other] = parts[role]
        return next(parts[r] for r, n in stored.parts.items() if n == name)


def stored_from_target(ckpt: Checkpoint, keys: Iterable[str]) -> dict[str, _Stored]:
    """How the target stores each key: as is, block FP8, in a quantisation scheme the exporters write back, or (a
    ModelOpt / compressed-tensors weight) unquantised in the target's float dtype (`formats/requant.py`)."""
    from mtp2draft.formats.requant import how_stored

    out = {}
    for key in keys:
        scheme = ckpt.scheme_of(key)
        how = how_stored(scheme, ckpt.config, key)
        if how == "requantised":
            names = dict(ckpt.quantised(key).names)
            out[key] = _Stored(ST_DTYPES[ckpt.info(names["data"]).dtype][0], scheme=scheme.name, parts=names)
            continue
        if how == "unquantised":
            out[key] = _Stored(_float_dtype(ckpt.config))
            continue
        dtype = ST_DTYPES[ckpt.info(key).dtype][0]
        scale = ckpt.scale_key(key)
        scale_dtype = ST_DTYPES[ckpt.info(scale).dtype][0] if scale else torch.float32
        out[key] = _Stored(dtype, scale, scale_dtype, chunks=_stored_chunks(ckpt, key, scale))
    return out


def _stored_chunks(ckpt: Checkpoint, key: str, scale: str | None) -> int:
    """The row chunks whose per-chunk scale grids the target stores `key` with (1: one grid)."""
    chunks = ckpt.fp8_row_chunks.get(key, 1)
    if scale is None or chunks == 1:
        return 1
    m, bm = ckpt.info(key).shape[0], ckpt.fp8_block_size()[0]
    return chunks if ckpt.info(scale).shape[0] == chunks * math.ceil(m / chunks / bm) else 1


def stored_from_provenance(
    native: NativeLayer, spec: Spec, target_config: Mapping[str, Any], provenance: Mapping[str, Any]
) -> dict[str, _Stored]:
    """Without the target: FP8 exactly where convert dequantised FP8 (provenance), module buffers (router bias)
    fp32, every other floating tensor in the target's torch_dtype (bf16 on every release we know)."""
    from mtp2draft.formats.requant import WRITERS, part_names

    fp8 = set(provenance.get("dequantised_fp8") or [])
    fp32 = set(provenance.get("stored_float32") or [])  # the source's own fp32 tensors (absent in older drafts)
    schemes = {k: s for s, keys in (provenance.get("dequantised") or {}).items() if s in WRITERS for k in keys}
    with torch.device("meta"):
        module = native_draft(spec, target_config, native.layer)
    buffers = {k for k, _ in module.named_buffers()}
    default = _float_dtype(target_config, spec)
    out = {}
    for key in native.checkpoint_keys():
        if key in schemes:
            parts = part_names(schemes[key], key)
            out[key] = _Stored(WRITERS[schemes[key]][0](native.shapes[key], (1, 1))["data"][0], None, torch.float32,
                               schemes[key], parts)  # fmt: skip
        elif key in fp8:
            out[key] = _Stored(torch.float8_e4m3fn, key + SCALE_SUFFIX)
        else:
            out[key] = _Stored(torch.float32 if native.module_of[key] in buffers or key in fp32 else default)
    return out


def _float_dtype(config: Mapping[str, Any], spec: Spec | None = None) -> torch.dtype:
    """The target's float dtype (`torch_dtype`, the text config's first): bf16 on every release we know."""
    text = spec.text_config(config) if spec is not None else config
    name = str(text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return TORCH_DTYPES.get(name) or torch.bfloat16


def computation_record(spec: Spec, cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "hidden_handover": cfg.get("hidden_handover") or native_class(spec).DEFAULT_HANDOVER,
        "input_hidden": cfg.get("input_hidden") or spec.layer.hidden,
        "final_norm": cfg.get("final_norm", True),
        "engine": cfg.get("engine"),
    }


def engine_mismatches(spec: Spec, cfg: Mapping[str, Any], engines: Iterable[str]) -> list[str]:
    """One line per engine whose MTP computation for the family (the spec's `[engines.*]`) differs from the one the
    native draft was trained for: served there, it loses acceptance beyond step 1 (or from step 1 on when the
    step-0 input or the final norm differ)."""
    mine = computation_record(spec, cfg)
    notes = []
    for engine in engines:
        facts = spec.engine(engine)
        if facts is None or not facts.serves(DraftKind.MTP):
            notes.append(f"{engine} serves no native MTP draft for {spec.name} targets")
            continue
        layers = len(cfg.get("mtp_layers") or [0]) if isinstance(cfg.get("mtp_layers"), list) else 1
        if not spec.runs(engine, DraftKind.MTP, layers):
            notes.append(f"{engine} {facts.version} runs no chain of MTP layers for {spec.name} targets")
            continue
        theirs = spec.engine_computation(engine)
        wrong = [f"{k} {mine[k]} (draft) vs {theirs[k]} ({engine})" for k in theirs if mine[k] != theirs[k]]
        if wrong:
            notes.append(
                f"{engine} {facts.version} computes this family's MTP layer differently: {'; '.join(wrong)}; "
                f"for {engine}, distill with --serving-engine {engine}"
            )
    return notes


def trunk_keys(spec: Spec, config: Mapping[str, Any], layer: int) -> set[str]:
    """Checkpoint keys of the trunk's embedding, head and final norm (shared, never the MTP layer's own)."""
    return {spec.key(t, config, layer) for t in (spec.keys.target_norm, spec.keys.target_embed, spec.keys.target_head)}


def contiguous_runs(infos: list, limit: int) -> Iterable[list]:
    run: list = []
    size = 0
    for info in infos:
        if run and size + info.nbytes > limit:
            yield run
            run, size = [], 0
        run.append(info)
        size += info.nbytes
    if run:
        yield run


def natural_order(key: str) -> list[Any]:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def meta_checkpoint(
    spec: Spec,
    target_config: Mapping[str, Any],
    key_config: Mapping[str, Any],
    layer: int,
    stored: Callable[[str], bool] | None = None,
):
    """(checkpoint key -> shape, module-buffer checkpoint keys) of one MTP layer, from meta tensors; `stored`: the
    keys of the checkpoint whose layout it takes (`native_to_checkpoint`)."""
    with torch.device("meta"):
        module = native_draft(spec, target_config, layer)
    state = module.state_dict()
    buffers = {k for k, _ in module.named_buffers()}
    shapes: dict[str, tuple[int, ...]] = {}
    buffer_keys: set[str] = set()
    for module_key, t in state.items():
        for key, out in native_to_checkpoint(spec, dict(key_config), layer, {module_key: t}, stored).items():
            shapes[key] = tuple(out.shape)
            if module_key in buffers:
                buffer_keys.add(key)
    return shapes, buffer_keys


def _validate_native(path: Path, cfg: dict[str, Any]) -> list[str]:
    """mtp2draft's own native draft directory: the module's tensors under module names, shapes from the config."""
    problems: list[str] = []
    try:
        spec, target_config = get_spec(cfg["spec"]), cfg["target_config"]
        expected = {}
        for prefix, layer in draft_layers(path, cfg):  # a chain draft: every layer under `layers.{j}.`
            with torch.device("meta"):
                module = native_draft(spec, target_config, layer)
            expected |= {prefix + k: tuple(v.shape) for k, v in module.state_dict().items()}
    except Exception as exc:
        return [f"cannot build the native module from config.json: {exc}"]
    weights = load_weights(path, problems)
    if weights is None:
        return problems
    for key in sorted(set(expected) - set(weights)):
        problems.append(f"{key} is missing")
    for key in sorted(set(weights) - set(expected)):
        problems.append(f"{key} is not a tensor of the {spec.name} MTP module")
    for key in sorted(set(weights) & set(expected)):
        if tuple(weights[key].shape) != expected[key]:
            problems.append(f"{key} has shape {list(weights[key].shape)}, the config implies {list(expected[key])}")
        if (msg := nonfinite(key, weights[key])) is not None:
            problems.append(msg)
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
PROVIDES: dict[str, Format] = {
    "mtp": Format(
        write=None,  # the draft directory itself: `convert --to mtp` and `distill` write it
        validate=_validate_native,
        detect=lambda config: config.get("draft_kind") == DraftKind.MTP,
        launch_lines=lambda target, draft, k: {},  # export it to serve it
        usable=lambda spec: False,
    ),
}
