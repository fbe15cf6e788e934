"""FP4 (e2m1) and e8m0 block scales, as DeepSeek-V4 and the OCP MX formats store them, read and written.

- e2m1: 1 sign, 2 exponent, 1 mantissa bit; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP MX spec 1.0, section 5.3.3).
  Two values per byte, **element 2i in the low nibble, 2i+1 in the high nibble**: transformers 5.24
  `integrations/finegrained_fp8.py` `Fp8Dequantize._unpack_fp4` (`lut[u8 & 0xF], lut[u8 >> 4]` stacked last),
  vLLM 0.34 `model_executor/layers/quantization/utils/nvfp4_emulation_utils.py` (`tl.interleave(low, high)`) and
  SGLang 0.5.23 `srt/layers/quantization/mxfp4_tensor.py` (`left_side = x & 0x0F`) all unpack so.
- e8m0: an unsigned power-of-two exponent byte, value 2^(b - 127), 255 = NaN (`torch.float8_e8m0fnu`; MX exports
  that lack the dtype store the same byte as uint8).
- DeepSeek-V4's routed experts: weight int8 [N, K/2] (packed e2m1), `<name>.scale` e8m0 [N, K/32], one scale per 32
  inputs of a row (vLLM 0.34 `models/deepseek_v4/nvidia/mtp.py` `load_weights` hands them to `Mxfp4MoEMethod`;
  transformers 5.24 `FP8Experts` allocates them with `sf_gran_n=1, sf_gran_k=32`). Its other linears: FP8 e4m3
  [N, K] with an e8m0 `.scale` [ceil(N/128), ceil(K/128)] (`quantization_config.scale_fmt: "ue8m0"`).

The quantisers are the inverses the exporters use to write a checkpoint's own quantisation back: scales are the
smallest power of two at which the block's largest magnitude fits (2^ceil(log2(amax / max))), so nothing clips, and
values round to nearest, ties to even.

What this module does not do: know key names or pick a scheme for a checkpoint (`checkpoint/quant.py`).
"""

from __future__ import annotations

import math

import torch

from mtp2draft.errors import CheckpointError

MX_BLOCK = 32  # OCP MX block: one e8m0 scale per 32 elements along the last dimension
E2M1_MAX = 6.0
FP8_MAX = 448.0  # float8_e4m3fn
# the 16 e2m1 codes, sign bit 3: 0..7 positive magnitudes, 8..15 their negatives
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
# Rows dequantised at once: bounds the int64 index and fp32 scratch to a slice of the output.
_ROW_CHUNK = 1024


def e8m0_to_float(scale: torch.Tensor, name: str = "an e8m0 scale") -> torch.Tensor:
    """fp32 2^(b - 127) of e8m0 scales stored as `float8_e8m0fnu` or as their raw uint8 bytes (255 -> NaN).
    name: the stored tensor, named by the refusal of any other dtype."""
    if scale.dtype == torch.uint8:
        out = torch.exp2(scale.float() - 127.0)
        return out.masked_fill(scale == 255, float("nan"))
    if scale.dtype == getattr(torch, "float8_e8m0fnu", None):
        return scale.float()
    raise CheckpointError(f"{name} is stored as {scale.dtype}: an e8m0 scale must be float8_e8m0fnu or uint8")


def float_to_e8m0(scale: torch.Tensor) -> torch.Tensor:
    """Powers of two (fp32) -> `float8_e8m0fnu` bytes; exponents clamp to e8m0's range [-127, 127]."""
    exponent = torch.log2(scale.float()).round().clamp(-127, 127)
    return (exponent + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] int8/uint8 -> fp32 [..., K]: element 2i from the low nibble of byte i, 2i+1 from the high one."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise CheckpointError(f"packed FP4 must be int8 or uint8, not {packed.dtype}")
    u8 = packed.view(torch.uint8)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    pairs = torch.stack((lut[(u8 & 0xF).long()], lut[(u8 >> 4).long()]), dim=-1)  # [..., K/2, 2]
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """fp32 values -> their nearest e2m1 codes (uint8 0..15), ties to even, saturating at +-6."""
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32)
    mag = values.float().abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(mag, mids)  # mag == mids[i] -> i, the code below the tie
    tie = (mag == mids[idx.clamp(max=len(_E2M1_MIDPOINTS) - 1)]) & (idx % 2 == 1)
    code = (idx + tie.long()).to(torch.uint8)
    return code | (torch.signbit(values.float()).to(torch.uint8) << 3)


def pack_e2m1(values: torch.Tensor) -> torch.Tensor:
    """fp32 [..., K] (K even) -> uint8 [..., K/2], the inverse of `unpack_e2m1` on e2m1-representable values."""
    if values.shape[-1] % 2:
        raise CheckpointError(f"FP4 packs two values per byte; the last dimension {values.shape[-1]} is odd")
    codes = e2m1_codes(values).reshape(*values.shape[:-1], values.shape[-1] // 2, 2)
    return codes[..., 0] | (codes[..., 1] << 4)


def _check_grouped_scale(name: str, data_shape: tuple[int, ...], k: int, scale: torch.Tensor, group: int) -> None:
    want = (*data_shape[:-1], math.ceil(k / group))
    if tuple(scale.shape) != want:
        raise CheckpointError(
            f"{name} has shape {list(scale.shape)}, expected {list(want)} for {k} inputs per row in groups of {group}"
        )


def dequantize_fp4_grouped(
    packed: torch.Tensor, scale: torch.Tensor, group: int, key: str = "weight", scale_key: str | None = None
) -> torch.Tensor:
    """Packed e2m1 [..., K/2] times fp32 `scale` [..., ceil(K/group)] (already decoded), one per `group` inputs ->
    fp32 [..., K]. Row by row, so the scratch stays a slice of the output. The NVFP4 and MX readers both end here."""
    k = 2 * packed.shape[-1]
    _check_grouped_scale(scale_key or f"the scale of {key}", tuple(packed.shape), k, scale, group)
    rows_p = packed.reshape(-1, packed.shape[-1])
    rows_s = scale.reshape(-1, scale.shape[-1]).float()
    out = torch.empty((rows_p.shape[0], k), dtype=torch.float32)
    for r in range(0, rows_p.shape[0], _ROW_CHUNK):
        chunk = slice(r, r + _ROW_CHUNK)
        out[chunk] = unpack_e2m1(rows_p[chunk]) * rows_s[chunk].repeat_interleave(group, dim=-1)[:, :k]
    return out.reshape(*packed.shape[:-1], k)


def dequantize_fp4_e8m0(
    packed: torch.Tensor, scale: torch.Tensor, block: int = MX_BLOCK, key: str = "weight", scale_key: str | None = None
) -> torch.Tensor:
    """FP4 e2m1 with e8m0 block scales (DeepSeek-V4 experts, MXFP4) -> fp32.

    packed: [..., K/2] int8/uint8 (low nibble first); scale: [..., ceil(K/block)] float8_e8m0fnu or uint8;
    W[..., j] = e2m1(packed)[..., j] * 2^(scale[..., j // block] - 127)."""
    name = scale_key or f"{key}'s e8m0 scale"
    return dequantize_fp4_grouped(packed, e8m0_to_float(scale, name), block, key, name)


def quantize_fp4_e8m0(weight: torch.Tensor, block: int = MX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `dequantize_fp4_e8m0`: fp [..., K] -> (int8 [..., K/2] packed e2m1, float8_e8m0fnu
    [..., ceil(K/block)]), scale 2^ceil(log2(amax / 6)) per block (no value clips), values rounded to nearest even.
    int8 is the dtype DeepSeek-V4 stores packed experts in."""
    k = weight.shape[-1]
    groups = math.ceil(k / block)
    w = weight.float()
    padded = torch.nn.functional.pad(w, (0, groups * block - k)).reshape(*w.shape[:-1], groups, block)
    amax = padded.abs().amax(dim=-1)  # [..., groups]
    scale = torch.exp2(torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-127, 127))
    q = (padded / scale.unsqueeze(-1)).reshape(*w.shape[:-1], groups * block)[..., :k]
    return pack_e2m1(q).view(torch.int8), float_to_e8m0(scale)


def dequantize_fp8_e8m0(
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    key: str = "weight",
    scale_key: str | None = None,
) -> torch.Tensor:
    """FP8 e4m3 [M, N] with e8m0 block scales [ceil(M/bm), ceil(N/bn)] (DeepSeek-V4's `.scale`) -> fp32
    W[i, j] * 2^(scale[i // bm, j // bn] - 127)."""
    from mtp2draft.checkpoint.fp8 import dequantize_fp8

    scales = e8m0_to_float(scale, scale_key or f"{key}'s e8m0 scale")
    return dequantize_fp8(weight, scales, block, key=key, scale_key=scale_key)


def quantize_fp8_e8m0(weight: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `dequantize_fp8_e8m0`: fp [M, N] -> (float8_e4m3fn [M, N], float8_e8m0fnu [ceil(M/bm),
    ceil(N/bn)]), scale 2^ceil(log2(amax / 448)) per block."""
    m, n = weight.shape
    bm, bn = block
    rows, cols = math.ceil(m / bm), math.ceil(n / bn)
    w = weight.float()
    padded = torch.nn.functional.pad(w, (0, cols * bn - n, 0, rows * bm - m))
    amax = padded.reshape(rows, bm, cols, bn).abs().amax(dim=(1, 3))  # [rows, cols]
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127))
    full = scale.repeat_interleave(bm, 0)[:m].repeat_interleave(bn, 1)[:, :n]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, float_to_e8m0(scale)
