"""FP8 block quantisation as DeepSeek-style checkpoints store it: a `float8_e4m3fn` weight [M, N] with an fp32
`<name>_scale_inv` sibling of shape [ceil(M/b), ceil(N/b)], W = W_fp8[i, j] * scale_inv[i // b, j // b].

A weight stored pre-sharded in `chunks` row chunks (MiMo-V2.5's fused `qkv_proj`, one chunk per tensor-parallel
rank) may tile its scales per chunk: chunk c's rows [c*M/chunks, (c+1)*M/chunks) have their own
ceil(M/chunks/b) scale rows, so the grid has chunks * ceil(M/chunks/b) rows (vLLM 0.34 `mimo_v2.py`
`_shard_fp8_qkv_proj` reads either that or the one continuous grid; both are read and written here).

The one place the block size default lives (`fp8_block_size`): config.json's `quantization_config.weight_block_size`,
else 128 x 128 as the releases use.

What this module does not do: read checkpoints or choose which tensors are FP8 (`checkpoint/tensors.py`, the exporters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from mtp2draft.errors import CheckpointError

SCALE_SUFFIX = "_scale_inv"
DEFAULT_FP8_BLOCK = (128, 128)


def fp8_block_size(config: Mapping[str, Any]) -> tuple[int, int]:
    """The FP8 block (rows, columns) of a checkpoint from its config.json: `quantization_config` at the top or, as
    `checkpoint.quant.quant_method` finds it, in a nested text config (DeepSeek-V4.1 uses [32, 32])."""
    nested = (v.get("quantization_config") for v in config.values() if isinstance(v, Mapping))
    quant = config.get("quantization_config") or next((q for q in nested if q), None) or {}
    block = quant.get("weight_block_size") or DEFAULT_FP8_BLOCK
    return int(block[0]), int(block[1])


def dequantize_fp8(
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = DEFAULT_FP8_BLOCK,
    key: str = "weight",
    scale_key: str | None = None,
    chunks: int = 1,
) -> torch.Tensor:
    """`W[i, j] * scale_inv[i // bm, j // bn]` in fp32, ragged edge blocks included.

    weight: [M, N] float8; scale_inv: [ceil(M/bm), ceil(N/bn)] (fp32, or e8m0 power-of-two scales), or with
    `chunks` > 1 the per-chunk grid [chunks * ceil(M/chunks/bm), ceil(N/bn)] (see the module docstring).
    """
    if weight.dim() != 2:
        raise CheckpointError(f"FP8 weight {key} has {weight.dim()} dimensions; block scales need 2")
    m, n = weight.shape
    bm, bn = block
    if chunks > 1 and tuple(scale_inv.shape) != (math.ceil(m / bm), math.ceil(n / bn)):
        rows = chunk_rows(m, chunks, key)
        per = math.ceil(rows / bm)
        if tuple(scale_inv.shape) != (chunks * per, math.ceil(n / bn)):
            raise CheckpointError(
                f"{scale_key or key + SCALE_SUFFIX} has shape {list(scale_inv.shape)}, expected "
                f"{[chunks * per, math.ceil(n / bn)]} ({chunks} chunks of {per} block rows) or "
                f"{[math.ceil(m / bm), math.ceil(n / bn)]} (one grid) for a [{m}, {n}] weight"
            )
        parts = [
            dequantize_fp8(weight[c * rows : (c + 1) * rows], scale_inv[c * per : (c + 1) * per], block, key)
            for c in range(chunks)
        ]
        return torch.cat(parts)
    want = (math.ceil(m / bm), math.ceil(n / bn))
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(
            f"{scale_key or key + SCALE_SUFFIX} has shape {list(scale_inv.shape)}, expected {list(want)} for a "
            f"[{m}, {n}] weight"
        )
    scale = scale_inv.float()
    # Expand the block scales to full size row-block by row-block to keep peak memory near one fp32 copy of W.
    out = torch.empty((m, n), dtype=torch.float32)
    for r in range(want[0]):
        rows = slice(r * bm, min((r + 1) * bm, m))
        full = scale[r].repeat_interleave(bn)[:n]
        out[rows] = weight[rows].float() * full
    return out


def chunk_rows(m: int, chunks: int, key: str) -> int:
    """Rows of each of `chunks` row chunks of a weight with `m` rows; one line when they do not divide it."""
    if chunks < 1 or m % chunks:
        raise CheckpointError(f"{key} has {m} rows, which {chunks} pre-sharded chunks do not divide")
    return m // chunks


def quantize_fp8(
    weight: torch.Tensor, block: tuple[int, int] = DEFAULT_FP8_BLOCK, chunks: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `dequantize_fp8`: per block scale = amax / 448, W_fp8 = W / scale, scale_inv = scale; with
    `chunks` > 1 each row chunk is quantised on its own grid and the grids stacked (the per-chunk tiling)."""
    if chunks > 1:
        rows = chunk_rows(weight.shape[0], chunks, "weight")
        pairs = [quantize_fp8(weight[c * rows : (c + 1) * rows], block) for c in range(chunks)]
        return torch.cat([q for q, _ in pairs]), torch.cat([s for _, s in pairs])
    m, n = weight.shape
    bm, bn = block
    rows, cols = math.ceil(m / bm), math.ceil(n / bn)
    w = weight.float()
    scale = torch.empty((rows, cols), dtype=torch.float32)
    q = torch.empty((m, n), dtype=torch.float8_e4m3fn)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for r in range(rows):
        for c in range(cols):
            blk = w[r * bm : (r + 1) * bm, c * bn : (c + 1) * bn]
            s = blk.abs().max().clamp(min=1e-12) / fmax
            scale[r, c] = s
            q[r * bm : (r + 1) * bm, c * bn : (c + 1) * bn] = (blk / s).clamp(-fmax, fmax).to(torch.float8_e4m3fn)
    return q, scale
