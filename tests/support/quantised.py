"""Quantised re-releases of a checkpoint, as the quantising tools lay them out: ModelOpt NVFP4, compressed-tensors
MXFP4 and pack-quantized int4. Each quantiser is written here from its format's rule (independently of
`mtp2draft/checkpoint/`), so a conversion of the re-release tests the reader against the format, not against
itself.

Which tensors are quantised: every 2-D linear `*_proj.weight` (attention, experts, shared experts, the MTP layer's
`eh_proj`), as NVFP4 / W4A16 releases of DeepSeek-style models do; norms, router gates, embeddings and heads stay.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from support.fixtures import write_checkpoint

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
QUANTISED = re.compile(r"_proj\.weight$")


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Codes (0..15) of the nearest e2m1 values, ties to the even code (OCP MX 1.0 round-to-nearest-even)."""
    mag = x.abs().clamp(max=6.0)
    dist = (mag.unsqueeze(-1) - E2M1_GRID).abs()  # [..., 8]
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    # among the nearest grid points prefer the even code
    even = torch.arange(8) % 2 == 0
    code = torch.where((ties & even).any(-1), (ties & even).float().argmax(-1), ties.float().argmax(-1))
    return code.to(torch.uint8) | ((x < 0).to(torch.uint8) << 3)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Element 2i in the low nibble, 2i+1 in the high nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def nvfp4_modelopt(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4: weight_scale_2 = amax / (448 * 6); per 16 inputs scale = amax_16 / 6 / scale_2 in e4m3;
    values = w / (scale * scale_2) rounded to e2m1."""
    w = w.float()
    scale_2 = w.abs().max() / (448.0 * 6.0)
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = (blocks.abs().amax(-1) / 6.0 / scale_2).to(torch.float8_e4m3fn)  # [N, K/16]
    eff = scale.float().clamp(min=2**-9) * scale_2
    codes = e2m1_round(blocks / eff.unsqueeze(-1)).reshape(w.shape)
    return {
        "weight": pack_nibbles(codes),
        "weight_scale": scale,
        "weight_scale_2": scale_2.reshape(()),
        "input_scale": torch.tensor(1.0),
    }


def mxfp4_compressed_tensors(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors mxfp4-pack-quantized: e8m0 scale per 32 inputs, 2^ceil(log2(amax / 6)), stored as its
    exponent byte (uint8); values rounded to e2m1, packed two per uint8."""
    w = w.float()
    blocks = w.reshape(w.shape[0], -1, 32)
    exponent = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp(min=2**-126) / 6.0))
    codes = e2m1_round(blocks / torch.exp2(exponent).unsqueeze(-1)).reshape(w.shape)
    return {"weight_packed": pack_nibbles(codes), "weight_scale": (exponent + 127).to(torch.uint8)}


def int_pack_quantized(w: torch.Tensor, bits: int = 4, group: int = 32) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized, symmetric per group: scale = amax / (2^(b-1) - 1), q = round(w / scale)
    clamped to [-2^(b-1), 2^(b-1) - 1], stored as q + 2^(b-1) in the bit stream of int32 words (element j at bit
    j * b)."""
    w = w.float()
    rows, cols = w.shape
    qmax = 2 ** (bits - 1) - 1
    blocks = w.reshape(rows, -1, group)
    scale = (blocks.abs().amax(-1) / qmax).clamp(min=1e-12)  # [N, K/g]
    q = torch.round(blocks / scale.unsqueeze(-1)).clamp(-qmax - 1, qmax).reshape(rows, cols).to(torch.int64)
    unsigned = q + 2 ** (bits - 1)
    per_word = 32 // bits
    padded = torch.nn.functional.pad(unsigned, (0, math.ceil(cols / per_word) * per_word - cols))
    words = (padded.reshape(rows, -1, per_word) << (bits * torch.arange(per_word))).sum(-1)  # disjoint bits
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return {
        "weight_packed": words,
        "weight_scale": scale.to(torch.bfloat16),
        "weight_shape": torch.tensor([rows, cols]),
    }


def _ct_config(fmt: str, weights: dict[str, Any]) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": fmt}},
        "ignore": ["lm_head"],
    }


def fp8_e8m0_blocks(w: torch.Tensor, block: int = 128) -> dict[str, torch.Tensor]:
    """DeepSeek-V4's other linears: e4m3 `weight` [N, K] with a float8_e8m0fnu `scale` [ceil(N/128), ceil(K/128)],
    each block's scale 2^ceil(log2(amax / 448)) so no value clips (the rule the V4 release's scales follow: every
    one is a power of two)."""
    w = w.float()
    rows, cols = w.shape
    r, c = math.ceil(rows / block), math.ceil(cols / block)
    scale = torch.empty(r, c)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(r):
        for j in range(c):
            blk = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            s = 2.0 ** math.ceil(math.log2(max(blk.abs().max().item(), 2**-120) / 448.0))
            scale[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (blk / s).to(torch.float8_e4m3fn)
    return {"weight": q, "scale": scale.to(torch.float8_e8m0fnu)}


def fp4_e8m0_deepseek_v4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """DeepSeek-V4's expert layout: the same e2m1 pairs and e8m0 bytes, as int8 `weight` and float8_e8m0fnu
    `scale`."""
    parts = mxfp4_compressed_tensors(w)
    return {
        "weight": parts["weight_packed"].view(torch.int8),
        "scale": parts["weight_scale"].view(torch.float8_e8m0fnu),
    }


SCHEMES = {
    "fp4-e8m0": (
        fp4_e8m0_deepseek_v4,
        {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    ),
    "nvfp4": (
        nvfp4_modelopt,
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]},
    ),
    "mxfp4": (
        mxfp4_compressed_tensors,
        _ct_config("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}),
    ),
    "int4": (
        int_pack_quantized,
        _ct_config(
            "pack-quantized",
            {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True},
        ),
    ),
}


# DeepSeek-V4 as released (the dtype column of tests/data/hub_keys/deepseek_v4*.json): routed experts FP4, the
# attention's and shared experts' linears and the MTP layer's e_proj / h_proj FP8, both with e8m0 `.scale`;
# hyper-connection mixes, attention sinks and the router bias fp32; norms, the router weight, embed and head bf16;
# the compressors' linears (trunk only) bf16.
V4_FP4 = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")
V4_FP8 = re.compile(r"(\.attn\.w(q_a|q_b|kv|o_a|o_b)|\.indexer\.wq_b|\.shared_experts\.w[123]|\.[eh]_proj)\.weight$")
V4_FP32 = re.compile(r"(hc_(attn|ffn|head)_(fn|base|scale)|\.attn_sink|\.gate\.bias)$")


def deepseek_v4_release(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A bf16 DeepSeek-V4 checkpoint's tensors in the release's own quantisation (`V4_*` above)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        quantise = fp4_e8m0_deepseek_v4 if V4_FP4.search(key) else fp8_e8m0_blocks if V4_FP8.search(key) else None
        if quantise is not None:
            stem = key[: -len("weight")]
            out.update({stem + part: t for part, t in quantise(tensor).items()})
        else:
            out[key] = tensor.float() if V4_FP32.search(key) else tensor
    return out


def requantise(source: Path, out: Path, scheme: str) -> Path:
    """A re-release of checkpoint `source` in `scheme` ("nvfp4", "mxfp4", "int4"): same config plus the tool's
    quantization_config, every `*_proj.weight` replaced by its parts (`<stem>weight`, `<stem>weight_scale`, ...)."""
    quantise, qconfig = SCHEMES[scheme]
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = qconfig
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        for key, tensor in load_file(shard).items():
            if QUANTISED.search(key) and tensor.dim() == 2 and tensor.shape[1] % 32 == 0:  # whole groups only
                stem = key[: -len("weight")]
                tensors.update({stem + part: t for part, t in quantise(tensor).items()})
            else:
                tensors[key] = tensor
    return write_checkpoint(out, config, tensors)


# Fixture rows' `quantise` (tests/support/fixtures.py): the whole checkpoint in a release's own quantisation.
RELEASE_QUANTISERS = {"deepseek_v4": deepseek_v4_release}
