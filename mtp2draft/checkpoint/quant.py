"""Quantised checkpoint tensors: the registry of schemes (data: which stored tensors make up one weight, their
dtypes, which function dequantises them), the pick from config.json's `quantization_config`, and the dequantisers.

A quantised weight has a *logical* key (the name an unquantised checkpoint would use, e.g. `...q_proj.weight`) and
*parts*: the stored tensors that make it up, named from the logical key's stem by templates (`{}weight_packed`,
`{}weight_scale`, ...). `Checkpoint` (reader.py) sees the index through `QuantView`: logical keys in, stored parts
fetched, one fp32 weight out per logical key. Schemes, each by its format's published rule:

- `fp8-e8m0` / `fp4-e8m0`: DeepSeek-V4 (`quant_method: fp8`, `scale_fmt: ue8m0`): `{}weight` F8_E4M3 with e8m0
  `{}scale` per 128 x 128 block, or `{}weight` int8 packed e2m1 with e8m0 `{}scale` per 32 inputs (`fp4.py`).
- `modelopt-nvfp4`: ModelOpt NVFP4 (`quant_method: modelopt`, `quant_algo: NVFP4`): `{}weight` uint8 packed e2m1
  [N, K/2], `{}weight_scale` F8_E4M3 [N, K/16], `{}weight_scale_2` fp32 scalar; W = e2m1 * scale * scale_2
  (vLLM 0.34 `model_executor/layers/quantization/modelopt.py`, `ModelOptNvFp4Config`).
- `modelopt-mxfp8`: ModelOpt MXFP8 (`quant_algo: MXFP8`, the HY-V4 / Hy4-preview FP8 release): `{}weight` F8_E4M3
  [N, K], `{}weight_scale` uint8 e8m0 [N, K/32]; W = e4m3 * 2^(s - 127) per 32 inputs (OCP MX v1.0).
- `ct-nvfp4`: compressed-tensors `nvfp4-pack-quantized`: `{}weight_packed`, `{}weight_scale` (F8_E4M3 per 16),
  `{}weight_global_scale`; W = e2m1 * scale / global_scale (compressed-tensors 0.20 `forward_helpers.py`: the
  effective scale is `scale / global_scale`, the reciprocal of ModelOpt's `weight_scale_2`).
- `ct-mxfp4`: compressed-tensors `mxfp4-pack-quantized`: `{}weight_packed` e2m1, `{}weight_scale` uint8 e8m0 per 32.
- `mxfp4-blocks`: `quant_method: mxfp4` (gpt-oss layout): `{}_blocks` uint8 [..., K/32, 16], `{}_scales` uint8.
- `ct-int`: compressed-tensors `pack-quantized` int4 / int8: `{}weight_packed` int32 (element j of a row at bits
  j*b .. j*b+b-1 of the little-endian bit stream, stored as q + 2^(b-1)), `{}weight_scale` per group / channel /
  tensor, optional `{}weight_zero_point` (packed along rows) and `{}weight_shape`; W = (q - zp) * scale.

Block FP8 with an fp32 `{}weight_scale_inv` (DeepSeek-V3 and most FP8 releases) is read by `fp8.py` in every
checkpoint, whatever its config says. Any other `quant_method` or format is refused in one line that names it.

What this module does not do: fetch bytes (`reader.py`), or write quantised exports (`formats/`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mtp2draft.checkpoint.fp4 import (
    MX_BLOCK,
    dequantize_fp4_e8m0,
    dequantize_fp4_grouped,
    dequantize_fp8_e8m0,
)
from mtp2draft.checkpoint.fp8 import DEFAULT_FP8_BLOCK
from mtp2draft.dtypes import ST_PACKED
from mtp2draft.errors import CheckpointError

NVFP4_GROUP = 16
# Stored beside quantised weights, never part of one: activation and KV-cache scales.
ACTIVATION_SUFFIXES = ("input_scale", "input_global_scale", "k_scale", "v_scale", "output_scale")
# Suffixes of quantisation schemes mtp2draft does not read (GPTQ / AWQ / bitsandbytes): met in an MTP layer, the
# tensor is refused by name rather than reported as an unknown block tensor.
FOREIGN_SUFFIXES = ("qweight", "qzeros", "g_idx", "SCB", "weight_format", "absmax", "quant_map", "nested_absmax")

Parts = dict[str, torch.Tensor]
Dequant = Callable[[Parts, Mapping[str, Any], str], torch.Tensor]
ShapeOf = Callable[[Mapping[str, tuple[int, ...]], Mapping[str, Any]], tuple[int, ...]]


@dataclass(frozen=True)
class TensorScheme:
    """One way a weight is stored: its parts (role -> template on the logical key's stem), the dtypes its `data`
    part may have, how to get the logical shape from the parts' shapes, and how to dequantise."""

    name: str
    logical: str  # template of the logical key, "{}weight" for a linear's weight
    parts: tuple[tuple[str, str], ...]  # required (role, template); the first is "data"
    data_dtypes: tuple[str, ...]
    shape: ShapeOf
    dequant: Dequant
    optional: tuple[tuple[str, str], ...] = ()  # read when present

    @property
    def data_template(self) -> str:
        return self.parts[0][1]

    def stem_of(self, stored: str) -> str | None:
        suffix = self.data_template.format("")
        return stored[: -len(suffix)] if stored.endswith(suffix) else None

    def names(self, stem: str) -> dict[str, str]:
        return {role: t.format(stem) for role, t in self.parts + self.optional}


# ---- dequantisers (parts -> fp32 logical tensor) ----------------------------------------------------------------------
def _fp8_e8m0(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    block = tuple(p.get("fp8_block", DEFAULT_FP8_BLOCK))
    return dequantize_fp8_e8m0(parts["data"], parts["scale"], block, key=key, scale_key=p.get("scale_key"))


def _fp4_e8m0(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    return dequantize_fp4_e8m0(parts["data"], parts["scale"], MX_BLOCK, key=key, scale_key=p.get("scale_key"))


def _scalar(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.numel() != 1:
        raise CheckpointError(f"{name} has shape {list(t.shape)}: a global scale is one number")
    return t.float().reshape(())


def _modelopt_nvfp4(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    scale = parts["scale"].float() * _scalar(parts["scale_2"], f"{key}_scale_2")  # [N, K/16]
    return dequantize_fp4_grouped(parts["data"], scale, NVFP4_GROUP, key, p.get("scale_key"))


def _ct_nvfp4(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    scale = parts["scale"].float() / _scalar(parts["global_scale"], f"{key}'s weight_global_scale")
    return dequantize_fp4_grouped(
        parts["data"], scale, int(p.get("group_size") or NVFP4_GROUP), key, p.get("scale_key")
    )


def _ct_mxfp4(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    return dequantize_fp4_e8m0(parts["data"], parts["scale"], MX_BLOCK, key=key, scale_key=p.get("scale_key"))


def _mxfp4_blocks(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    blocks = parts["data"]  # [..., K/32, 16]
    packed = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1])
    return dequantize_fp4_e8m0(packed, parts["scale"], MX_BLOCK, key=key, scale_key=p.get("scale_key"))


def unpack_int(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """compressed-tensors pack-quantized: int32 [R, P] -> signed int [R, columns]; element j of a row sits at bits
    (j*b) % 32 of word (j*b) // 32 as the unsigned value q + 2^(b-1)."""
    if bits not in (2, 4, 8):
        raise CheckpointError(f"pack-quantized weights of {bits} bits are not supported (2, 4 or 8)")
    per_word = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF  # [R, P]
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [R, P, per_word]
    values = values.reshape(packed.shape[0], -1)[:, :columns]
    return values - (1 << (bits - 1))


def _ct_int(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    bits, group, data = int(p["num_bits"]), p.get("group_size"), parts["data"]  # data: int32 [N, ceil(K*b/32)]
    rows, k = _ct_int_shape({"data": tuple(data.shape)}, p)
    if "shape" in parts and [int(v) for v in parts["shape"].flatten()] != [rows, k]:
        raise CheckpointError(
            f"{key}'s weight_shape says {parts['shape'].tolist()}, the packed data holds [{rows}, {k}]"
        )
    q = unpack_int(data, bits, k).float()  # [N, K]
    if "zero_point" in parts:
        zp = parts["zero_point"]
        zp = unpack_int(zp.t().contiguous(), bits, rows).t() if zp.dtype == torch.int32 and bits < 8 else zp
        q = q - _expand_groups(zp.float(), rows, k, group, f"{key}'s weight_zero_point")
    return q * _expand_groups(parts["scale"].float(), rows, k, group, p.get("scale_key") or f"{key}'s weight_scale")


def _expand_groups(t: torch.Tensor, rows: int, k: int, group: int | None, name: str) -> torch.Tensor:
    """Per-tensor [] / [1], per-channel [N, 1] or per-group [N, ceil(K/g)] -> broadcastable to [N, K]."""
    if t.numel() == 1:
        return t.reshape(1, 1)
    if group and tuple(t.shape) == (rows, math.ceil(k / group)):
        return t.repeat_interleave(group, dim=1)[:, :k]
    if tuple(t.shape) == (rows, 1):
        return t
    want = [rows, math.ceil(k / group)] if group else [rows, 1]
    raise CheckpointError(f"{name} has shape {list(t.shape)}, expected {want} for a [{rows}, {k}] weight")


# ---- logical shapes from the parts' header shapes ---------------------------------------------------------------------
def _packed_pairs(s: Mapping[str, tuple[int, ...]], p: Mapping[str, Any]) -> tuple[int, ...]:
    return (*s["data"][:-1], 2 * s["data"][-1])


def _same(s: Mapping[str, tuple[int, ...]], p: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(s["data"])


def _blocks(s: Mapping[str, tuple[int, ...]], p: Mapping[str, Any]) -> tuple[int, ...]:
    return (*s["data"][:-2], s["data"][-2] * s["data"][-1] * 2)


def _ct_int_shape(s: Mapping[str, tuple[int, ...]], p: Mapping[str, Any]) -> tuple[int, ...]:
    rows, words = s["data"]
    return (rows, words * 32 // int(p["num_bits"]))


# ---- the registry -----------------------------------------------------------------------------------------------------
_FP8 = ("F8_E4M3",)

SCHEMES: dict[str, TensorScheme] = {
    s.name: s
    for s in (
        TensorScheme("fp8-e8m0", "{}weight", (("data", "{}weight"), ("scale", "{}scale")), _FP8, _same, _fp8_e8m0),
        TensorScheme(
            "fp4-e8m0", "{}weight", (("data", "{}weight"), ("scale", "{}scale")), ST_PACKED, _packed_pairs, _fp4_e8m0
        ),
        TensorScheme(
            "modelopt-nvfp4",
            "{}weight",
            (("data", "{}weight"), ("scale", "{}weight_scale"), ("scale_2", "{}weight_scale_2")),
            ("U8",),
            _packed_pairs,
            _modelopt_nvfp4,
        ),
        TensorScheme(
            "ct-nvfp4",
            "{}weight",
            (("data", "{}weight_packed"), ("scale", "{}weight_scale"), ("global_scale", "{}weight_global_scale")),
            ("U8",),
            _packed_pairs,
            _ct_nvfp4,
        ),
        TensorScheme(
            "ct-mxfp4",
            "{}weight",
            (("data", "{}weight_packed"), ("scale", "{}weight_scale")),
            ("U8",),
            _packed_pairs,
            _ct_mxfp4,
        ),
        TensorScheme(
            "mxfp4-blocks", "{}", (("data", "{}_blocks"), ("scale", "{}_scales")), ("U8",), _blocks, _mxfp4_blocks
        ),
        TensorScheme(
            "ct-int",
            "{}weight",
            (("data", "{}weight_packed"), ("scale", "{}weight_scale")),
            ("I32",),
            _ct_int_shape,
            _ct_int,
            optional=(("zero_point", "{}weight_zero_point"), ("shape", "{}weight_shape")),
        ),
    )
}


def _modelopt_fp8(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    data, scale = parts["data"], parts["scale"].float()  # [N, K] e4m3; scale [] / [1] per tensor or [N] / [N, 1]
    if scale.numel() != 1 and scale.numel() != data.shape[0]:
        raise CheckpointError(f"{key}_scale has shape {list(scale.shape)}: expected one scale or one per row")
    return data.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))


SCHEMES["modelopt-fp8"] = TensorScheme(
    "modelopt-fp8", "{}weight", (("data", "{}weight"), ("scale", "{}weight_scale")), _FP8, _same, _modelopt_fp8
)


def _modelopt_mxfp8(parts: Parts, p: Mapping[str, Any], key: str) -> torch.Tensor:
    """MXFP8 (OCP MX v1.0): e4m3 [..., N, K] sharing one e8m0 scale per 32 consecutive inputs, [..., N, K/32]; fused
    3-D experts [E, N, K] are read as E * N rows (the block runs along K only)."""
    data, scale = parts["data"], parts["scale"]
    flat, flat_scale = data.reshape(-1, data.shape[-1]), scale.reshape(-1, scale.shape[-1])
    out = dequantize_fp8_e8m0(flat, flat_scale, (1, MX_BLOCK), key=key, scale_key=p.get("scale_key"))
    return out.reshape(data.shape)


SCHEMES["modelopt-mxfp8"] = TensorScheme(
    "modelopt-mxfp8", "{}weight", (("data", "{}weight"), ("scale", "{}weight_scale")), _FP8, _same, _modelopt_mxfp8
)


# ---- the method a checkpoint uses, from its config.json ---------------------------------------------------------------
@dataclass(frozen=True)
class QuantMethod:
    """The quantisation a config.json declares: which schemes its tensors may use, and their parameters (per
    compressed-tensors config group, matched to a weight by the group's `targets`)."""

    name: str
    schemes: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[tuple[tuple[str, ...], Mapping[str, Any]], ...] = ()

    def params_for(self, logical: str) -> dict[str, Any]:
        module = logical.removesuffix(".weight")
        fallback = None
        for targets, args in self.groups:
            for target in targets:
                if target.startswith("re:"):
                    if re.match(target[3:], module):
                        return {**self.params, **args}
                elif target == module:
                    return {**self.params, **args}
                elif fallback is None:  # a class name ("Linear"): every linear the checkpoint quantised
                    fallback = args
        if self.groups and fallback is None:  # stored packed, yet no group says with how many bits, in what groups
            targets = sorted({t for targets, _ in self.groups for t in targets})
            raise CheckpointError(
                f"{logical} is stored quantised but no quantization_config config group targets {module} (targets: "
                f"{', '.join(targets) or 'none'}): its bits and group size are unknown, so it cannot be dequantised"
            )
        return {**self.params, **(fallback or {})}


UNQUANTISED = QuantMethod("none")
SUPPORTED = (
    "fp8 (block scales, fp32 or e8m0; DeepSeek-V4's FP4 experts)",
    "modelopt NVFP4 / FP8 / MXFP8",
    "mxfp4",
    "compressed-tensors pack-quantized int4/int8, nvfp4-pack-quantized, mxfp4-pack-quantized",
)


def _refuse(what: str) -> CheckpointError:
    return CheckpointError(f"{what} is not supported; mtp2draft reads {'; '.join(SUPPORTED)}")


def _fp8_method(q: Mapping[str, Any]) -> QuantMethod:
    if q.get("fmt", "e4m3") != "e4m3":
        raise _refuse(f"fp8 quantization with fmt {q.get('fmt')!r}")
    block = q.get("weight_block_size") or DEFAULT_FP8_BLOCK
    return QuantMethod("fp8", ("fp8-e8m0", "fp4-e8m0"), {"fp8_block": (int(block[0]), int(block[1]))})


def _modelopt_method(q: Mapping[str, Any]) -> QuantMethod:
    inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else q
    algo = str(inner.get("quant_algo") or "").upper()
    schemes = {"NVFP4": ("modelopt-nvfp4",), "FP8": ("modelopt-fp8",), "MXFP8": ("modelopt-mxfp8",)}.get(algo)
    if schemes is None:
        raise _refuse(f"modelopt quant_algo {algo or 'absent'!r}")
    return QuantMethod(f"modelopt {algo}", schemes)


_CT_FORMATS = {"pack-quantized": "ct-int", "nvfp4-pack-quantized": "ct-nvfp4", "mxfp4-pack-quantized": "ct-mxfp4"}


def _compressed_tensors_method(q: Mapping[str, Any]) -> QuantMethod:
    schemes, groups = [], []
    for name, group in (q.get("config_groups") or {}).items():
        fmt = group.get("format") or q.get("format") or "dense"
        weights = group.get("weights") or {}
        if fmt == "dense" or not weights:
            continue
        scheme = _CT_FORMATS.get(fmt)
        if scheme is None:
            raise _refuse(f"compressed-tensors format {fmt!r} (config group {name})")
        if scheme == "ct-int" and weights.get("type", "int") != "int":
            raise _refuse(f"compressed-tensors pack-quantized {weights.get('type')} weights (config group {name})")
        schemes.append(scheme)
        groups.append((tuple(group.get("targets") or ()), dict(weights)))
    return QuantMethod(
        f"compressed-tensors {q.get('format') or 'mixed'}", tuple(dict.fromkeys(schemes)), {}, tuple(groups)
    )


METHODS: dict[str, Callable[[Mapping[str, Any]], QuantMethod]] = {
    "fp8": _fp8_method,
    "modelopt": _modelopt_method,
    "compressed-tensors": _compressed_tensors_method,
    "mxfp4": lambda q: QuantMethod("mxfp4", ("mxfp4-blocks",)),
}


def quant_method(config: Mapping[str, Any]) -> QuantMethod:
    """The method config.json's `quantization_config` declares (top level, or in a nested text config), or one line
    naming a method mtp2draft does not read."""
    q = config.get("quantization_config")
    if q is None:
        nested = [v.get("quantization_config") for v in config.values() if isinstance(v, Mapping)]
        q = next((n for n in nested if n), None)
    if not q:
        return UNQUANTISED
    if not isinstance(q, Mapping):
        raise CheckpointError(f"config.json's quantization_config is not an object: {q!r}")
    method = str(q.get("quant_method") or "").lower()
    if method not in METHODS:
        raise _refuse(f"quantization_config.quant_method {method or 'absent'!r}")
    return METHODS[method](q)


# ---- the logical view of an index ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantWeight:
    """One logical weight: its stored parts (role -> key) and the schemes that store a weight so, told apart by the
    dtype of the `data` part (DeepSeek-V4's FP8 and FP4 weights share their names)."""

    key: str
    names: Mapping[str, str]
    candidates: tuple[TensorScheme, ...]

    @property
    def data(self) -> str:
        return self.names["data"]

    def scheme(self, data_dtype: str) -> TensorScheme:
        for s in self.candidates:
            if data_dtype in s.data_dtypes:
                return s
        others = ", ".join(v for r, v in self.names.items() if r != "data")
        raise CheckpointError(
            f"{self.data} is stored as {data_dtype} beside {others}: no {'/'.join(s.name for s in self.candidates)} "
            "weight is stored so"
        )


class QuantView:
    """The index seen through a method: logical keys, the stored parts behind them, and the stored keys that belong
    to no weight (activation scales), from names alone (no header is read)."""

    def __init__(self, method: QuantMethod, stored: Iterable[str]) -> None:
        self.method = method
        self.keys = keys = set(stored)
        self.weights: dict[str, QuantWeight] = {}
        self.part_of: dict[str, str] = {}
        schemes = sorted((SCHEMES[s] for s in method.schemes), key=lambda s: -len(s.parts))
        for key in sorted(keys) if schemes else ():
            if key.rsplit(".", 1)[-1] in ACTIVATION_SUFFIXES:
                self.part_of[key] = ""
                continue
            found = [
                (s, s.stem_of(key))
                for s in schemes
                if s.stem_of(key) is not None and s.data_template.format(s.stem_of(key)) == key
            ]
            found = [(s, stem) for s, stem in found if all(t.format(stem) in keys for _, t in s.parts)]
            if not found:
                continue
            most = len(found[0][0].parts)
            best = [(s, stem) for s, stem in found if len(s.parts) == most]
            s, stem = best[0]
            names = {r: n for r, n in s.names(stem).items() if n in keys}
            same = tuple(b for b, st in best if b.names(st) == s.names(stem))
            weight = QuantWeight(s.logical.format(stem), names, same)
            self.weights[weight.key] = weight
            for name in names.values():
                self.part_of[name] = weight.key

    def needed(self, key: str) -> list[str]:
        weight = self.weights.get(key)
        return list(weight.names.values()) if weight else [key]

    def visible(self, stored: Iterable[str]) -> list[str]:
        """Logical keys and the stored keys that are part of no quantised weight."""
        out = [k for k in stored if k not in self.part_of]
        return sorted(set(out) | set(self.weights))

    def foreign(self, key: str) -> str | None:
        """One line when a stored key looks like part of a quantised weight this view cannot read."""
        last = key.rsplit(".", 1)[-1]
        if last in FOREIGN_SUFFIXES:
            return f"{key} is a {last} tensor of a quantisation mtp2draft does not read (GPTQ / AWQ / bitsandbytes)"
        mine = [SCHEMES[n] for n in self.method.schemes]
        for s in mine + [s for s in SCHEMES.values() if s not in mine]:
            stem = s.stem_of(key)
            if stem is not None and s.data_template != "{}weight" and key not in self.part_of:
                missing = [t.format(stem) for _, t in s.parts[1:] if t.format(stem) not in self.keys]
                return f"{key} is {s.name} data without {' / '.join(missing)}: cannot dequantise it"
        return None
