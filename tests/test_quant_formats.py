"""The quantised-weight arithmetic (FP4 e2m1, e8m0, NVFP4, MXFP4, compressed-tensors int4/int8), each against a
reference written here from the format's published rule and, where the quantising library installs, its own
dequantiser."""

from __future__ import annotations

import math

import pytest
import torch

from mtp2draft.checkpoint.fp4 import (
    E2M1_VALUES,
    dequantize_fp4_e8m0,
    dequantize_fp8_e8m0,
    e8m0_to_float,
    float_to_e8m0,
    pack_e2m1,
    quantize_fp4_e8m0,
    quantize_fp8_e8m0,
    unpack_e2m1,
)
from mtp2draft.errors import CheckpointError


# ---- references from the specs (plain Python, element by element) ---------------------------------------------------
def spec_e2m1(code: int) -> float:
    """OCP MX 1.0, 5.3.3: FP4 E2M1, bias 1; exponent 0 is subnormal (0.m x 2^0), no inf/NaN."""
    sign, exp, man = code >> 3 & 1, code >> 1 & 3, code & 1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return -mag if sign else mag


def spec_e8m0(byte: int) -> float:
    """OCP MX 1.0, 5.4.1: E8M0, bias 127, 0xFF is NaN."""
    return math.nan if byte == 255 else math.ldexp(1.0, byte - 127)


def spec_fp4_rows(packed: list[list[int]], scale: list[list[int]], block: int) -> list[list[float]]:
    """Byte i of a row holds elements 2i (low nibble) and 2i+1 (high nibble); element j has scale byte j // block."""
    out = []
    for prow, srow in zip(packed, scale, strict=True):
        row = []
        for i, byte in enumerate(prow):
            for j, code in ((2 * i, byte & 0xF), (2 * i + 1, byte >> 4)):
                row.append(spec_e2m1(code) * spec_e8m0(srow[j // block]))
        out.append(row)
    return out


def test_the_e2m1_table_is_the_specs() -> None:
    assert list(E2M1_VALUES) == [spec_e2m1(c) for c in range(16)]


def test_e8m0_decodes_every_byte_as_the_spec_says() -> None:
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = torch.tensor([spec_e8m0(b) for b in range(256)], dtype=torch.float32)
    for scale in (raw, raw.view(torch.float8_e8m0fnu)):
        got = e8m0_to_float(scale)
        assert torch.equal(got[:255], want[:255]) and got[255].isnan()
    assert torch.equal(float_to_e8m0(want[:255]).view(torch.uint8), raw[:255])


@pytest.mark.parametrize("rows,cols,block", [(3, 64, 32), (5, 96, 32), (2, 40, 32), (4, 32, 16)])
def test_fp4_e8m0_dequantisation_equals_the_spec(rows: int, cols: int, block: int) -> None:
    gen = torch.Generator().manual_seed(rows * cols)
    packed = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(110, 140, (rows, math.ceil(cols / block)), generator=gen, dtype=torch.int32).to(torch.uint8)
    want = torch.tensor(spec_fp4_rows(packed.tolist(), scale.tolist(), block))
    for p, s in ((packed, scale), (packed.view(torch.int8), scale.view(torch.float8_e8m0fnu))):
        assert torch.equal(dequantize_fp4_e8m0(p, s, block), want)


def test_fp4_e8m0_dequantisation_equals_transformers_own() -> None:
    """transformers 5.24's `Fp8Dequantize._dequantize_one` is what it runs on DeepSeek-V4's FP4 experts (int8
    weight, e8m0 scale grid [N, K/32]) when it dequantises a checkpoint on load."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    gen = torch.Generator().manual_seed(3)
    packed = torch.randint(-128, 128, (6, 128), generator=gen, dtype=torch.int32).to(torch.int8)
    scale = torch.randint(115, 135, (6, 8), generator=gen, dtype=torch.int32).to(torch.uint8).view(torch.float8_e8m0fnu)
    theirs = Fp8Dequantize(None)._dequantize_one(packed, scale, output_dtype=torch.float32)
    assert torch.equal(dequantize_fp4_e8m0(packed, scale), theirs)
    # 3-D (fused experts [E, N, K/2]) dequantises slice by slice the same way
    both = dequantize_fp4_e8m0(torch.stack([packed, packed.flip(0)]), torch.stack([scale, scale.flip(0)]))
    assert torch.equal(both[1], dequantize_fp4_e8m0(packed.flip(0), scale.flip(0)))


def test_fp8_e8m0_dequantisation_equals_transformers_own() -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    gen = torch.Generator().manual_seed(4)
    w = (torch.randn(256, 384, generator=gen) * 50).to(torch.float8_e4m3fn)
    scale = torch.randint(110, 130, (2, 3), generator=gen, dtype=torch.int32).to(torch.uint8).view(torch.float8_e8m0fnu)
    theirs = Fp8Dequantize(None)._dequantize_one(w, scale, output_dtype=torch.float32)
    assert torch.equal(dequantize_fp8_e8m0(w, scale), theirs)


def test_e2m1_packing_inverts_unpacking_on_every_byte() -> None:
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    assert torch.equal(pack_e2m1(unpack_e2m1(every)), every)


def test_e2m1_rounds_to_nearest_with_ties_to_even() -> None:
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 9.0, -0.75, -2.6])
    got = unpack_e2m1(pack_e2m1(torch.cat([x, torch.zeros(1)])))[:-1]
    assert got.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -3.0]


@pytest.mark.parametrize("shape", [(7, 64), (3, 4, 96), (2, 50)])
def test_fp4_e8m0_quantisation_round_trip_is_within_half_a_step(shape: tuple[int, ...]) -> None:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(5)) * 0.02
    packed, scale = quantize_fp4_e8m0(w)
    assert packed.dtype == torch.int8 and scale.dtype == torch.float8_e8m0fnu
    assert packed.shape == (*shape[:-1], shape[-1] // 2) and scale.shape == (*shape[:-1], math.ceil(shape[-1] / 32))
    back = dequantize_fp4_e8m0(packed, scale)
    # the coarsest e2m1 step is 2 (between 4 and 6): error <= 1 x scale, and no value clips (scale >= amax / 6)
    step = e8m0_to_float(scale).repeat_interleave(32, dim=-1)[..., : shape[-1]]
    assert ((back - w).abs() <= step * 1.0 + 1e-12).all()
    assert (back.abs().amax() <= w.abs().amax() * 1.34 + 1e-12).item()
    # an already-representable tensor survives exactly
    assert torch.equal(dequantize_fp4_e8m0(*quantize_fp4_e8m0(back)), back)


def test_fp8_e8m0_quantisation_round_trip_is_close_and_idempotent() -> None:
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(6))
    q, s = quantize_fp8_e8m0(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu and s.shape == (3, 2)
    back = dequantize_fp8_e8m0(q, s)
    assert ((back - w).abs() <= w.abs() * 2**-4 + e8m0_to_float(s).max() * 2**-9).all()
    assert torch.equal(dequantize_fp8_e8m0(*quantize_fp8_e8m0(back)), back)


def test_a_tampered_fp4_scale_shape_is_one_line() -> None:
    packed = torch.zeros(4, 32, dtype=torch.int8)
    with pytest.raises(CheckpointError, match=r"^w.scale has shape \[4, 3\], expected \[4, 2\]") as err:
        dequantize_fp4_e8m0(packed, torch.zeros(4, 3, dtype=torch.uint8), key="w", scale_key="w.scale")
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match="must be float8_e8m0fnu or uint8"):
        dequantize_fp4_e8m0(packed, torch.zeros(4, 2))
