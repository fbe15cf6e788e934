"""How a fine-tuned MTP layer is stored back into a quantised target: in the target's own quantisation where the
exporters can write it, else unquantised with the layer excluded from the target's quantisation config.

- `fp8-e8m0` / `fp4-e8m0` (DeepSeek-V4 as released): requantised under the checkpoint's own names, `{}weight` e4m3
  with an e8m0 `{}scale` per 128 x 128 block, or `{}weight` int8 packed e2m1 with an e8m0 `{}scale` per 32 inputs
  (`checkpoint/fp4.py`'s quantisers, the inverses of the readers).
- ModelOpt (NVFP4 / FP8) and compressed-tensors (int4 / int8 / NVFP4 / MXFP4 pack-quantized) re-releases: written in
  the target's float dtype (bf16 on every release we know) under the logical key, the quantised parts dropped, and the
  MTP layer's module prefix added to the config's exclusion list, so the engine builds that layer unquantised.
- Anything else quantised (gpt-oss `mxfp4` blocks) is refused in one line naming the scheme.

How vLLM 0.34 loads each of the two, with the sources read: docs/engines.md, "A layer stored back into a quantised
release".

What this module does not do: read checkpoints (`checkpoint/`) or lay out shards (`stitched.py`, `nextn.py`).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from mtp2draft.checkpoint.fp4 import MX_BLOCK, quantize_fp4_e8m0, quantize_fp8_e8m0
from mtp2draft.checkpoint.quant import SCHEMES, TensorScheme
from mtp2draft.errors import DraftError

Shapes = dict[str, tuple[torch.dtype, tuple[int, ...]]]


UNQUANTISED_WHY = (
    "vLLM 0.34 builds an excluded layer unquantised (ModelOpt: UnquantizedLinearMethod for its linears, "
    "UnquantizedFusedMoEMethod for its experts; compressed-tensors: the same for an ignored layer), so the layer is "
    "written in the target's float dtype rather than requantised: neither config has a block-FP8 scheme that an "
    "excluded layer could take"
)


def _fp8_shapes(shape: tuple[int, ...], block: tuple[int, int]) -> Shapes:
    m, n = shape
    return {
        "data": (torch.float8_e4m3fn, (m, n)),
        "scale": (torch.float8_e8m0fnu, (math.ceil(m / block[0]), math.ceil(n / block[1]))),
    }


def _fp4_shapes(shape: tuple[int, ...], block: tuple[int, int]) -> Shapes:
    *rows, k = shape
    return {"data": (torch.int8, (*rows, k // 2)), "scale": (torch.float8_e8m0fnu, (*rows, math.ceil(k / MX_BLOCK)))}


def _fp8_write(weight: torch.Tensor, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    q, scale = quantize_fp8_e8m0(weight, block)  # [M, N] e4m3, [ceil(M/bm), ceil(N/bn)] e8m0
    return {"data": q, "scale": scale}


def _fp4_write(weight: torch.Tensor, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    packed, scale = quantize_fp4_e8m0(weight)  # [..., K/2] int8, [..., ceil(K/32)] e8m0
    return {"data": packed, "scale": scale}


# scheme -> (stored parts' dtypes and shapes from the logical shape, the quantiser); block: the FP8 block
WRITERS: dict[str, tuple[Callable[..., Shapes], Callable[..., dict[str, torch.Tensor]]]] = {
    "fp8-e8m0": (_fp8_shapes, _fp8_write),
    "fp4-e8m0": (_fp4_shapes, _fp4_write),
}


def _modelopt_exclude(q: dict[str, Any], prefixes: list[str]) -> None:
    """ModelOpt: `exclude_modules` (nested `quantization` section, hf_quant_config style) or `ignore` (flat), fnmatch
    wildcards (vLLM 0.34 `ModelOptQuantConfigBase.from_config` / `is_layer_excluded`)."""
    inner = q["quantization"] if isinstance(q.get("quantization"), dict) else q
    field = "exclude_modules" if inner is not q or "exclude_modules" in q else "ignore"
    inner[field] = [
        *(inner.get(field) or []),
        *(f"{p}.*" for p in prefixes if f"{p}.*" not in (inner.get(field) or [])),
    ]


def _ct_ignore(q: dict[str, Any], prefixes: list[str]) -> None:
    """compressed-tensors: `ignore`, exact names or `re:` patterns matched from the start (vLLM 0.34
    `is_equal_or_regex_match`)."""
    patterns = [f"re:{re.escape(p + '.')}.*" for p in prefixes]
    q["ignore"] = [*(q.get("ignore") or []), *(p for p in patterns if p not in (q.get("ignore") or []))]


# quant_method -> how the config excludes a module prefix from quantisation
EXCLUDERS: dict[str, Callable[[dict[str, Any], list[str]], None]] = {
    "modelopt": _modelopt_exclude,
    "compressed-tensors": _ct_ignore,
}


def how_stored(scheme: TensorScheme | None, config: Mapping[str, Any], key: str) -> str:
    """ "same" (not quantised), "requantised" (written in `scheme`) or "unquantised" (written in the float dtype, the
    layer excluded from the config's quantisation); one line for a scheme that can be neither."""
    if scheme is None:
        return "same"
    if scheme.name in WRITERS:
        return "requantised"
    method = str((config.get("quantization_config") or {}).get("quant_method") or "")
    if method in EXCLUDERS:
        return "unquantised"
    raise DraftError(
        f"the target stores {key} as {scheme.name} ({method or 'no quant_method'}): the stitched export writes "
        f"{' / '.join(WRITERS)} back as stored and ModelOpt / compressed-tensors layers unquantised, not this"
    )


def part_names(scheme: str, key: str) -> dict[str, str]:
    """role -> stored name of logical weight `key` in `scheme` (e.g. data `x.weight`, scale `x.scale`)."""
    s = SCHEMES[scheme]
    stem = key[: -len(s.logical.format(""))] if s.logical.format("") else key
    return {role: t.format(stem) for role, t in s.parts}


def excluded_config(config: Mapping[str, Any], prefixes: Iterable[str]) -> dict[str, Any]:
    """A copy of `config` whose quantisation config excludes the module `prefixes` (no trailing dot)."""
    out = copy.deepcopy(dict(config))
    q = out.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") in EXCLUDERS:
        EXCLUDERS[q["quant_method"]](q, sorted(set(prefixes)))
    return out
