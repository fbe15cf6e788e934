"""A quantised release's trunk as the engines compute it, runnable by transformers on CPU or GPU: a copy of the
checkpoint with every quantised weight dequantised by mtp2draft's readers (`checkpoint/quant.py`, `fp4.py`, `fp8.py`:
W = the format's values times their scales, exact in fp32) and rounded once to the release's float dtype
(`torch_dtype`, bf16 on every release we know), the dtype the engines' kernels dequantise into and compressed-tensors'
own `decompress` returns (the scales' dtype), with `quantization_config` removed, so `from_pretrained` builds a plain
model and none of transformers' GPU-only quantisers is involved.

Methods dequantised here (`DEQUANTISED_METHODS`): ModelOpt NVFP4 / FP8, compressed-tensors (pack-quantized int4 /
int8, NVFP4, MXFP4), gpt-oss MXFP4. Block FP8 (`quant_method: fp8`) stays with transformers' own loading, as before.

What is not emulated: activation quantisation. A W4A16 / W8A16 release (compressed-tensors int weights, no input
quantisation) computes as here up to the engine's matmul rounding; a W4A4 NVFP4 release also rounds each linear's
input to FP4 per 16 values (its `input_scale`), and a W8A8 FP8 one rounds inputs to FP8 per token or tensor: those
activation roundings are not applied, so the trunk here is the release's weights with full-precision activations.

What this module does not do: run the model (`target/hidden.py`) or write into the release (the copy is a
temporary directory the caller owns).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from mtp2draft.checkpoint.quant import ACTIVATION_SUFFIXES
from mtp2draft.checkpoint.reader import INDEX_FILE, open_checkpoint
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

DEQUANTISED_METHODS = ("modelopt", "compressed-tensors", "mxfp4")
NOT_EMULATED = (
    "activation quantisation (NVFP4 W4A4 inputs rounded to FP4 per 16, FP8 W8A8 inputs per token / tensor) is not "
    "emulated: the trunk runs the release's dequantised weights on full-precision activations"
)


def quant_method_name(config: dict) -> str:
    q = config.get("quantization_config")
    if q is None:
        q = next((v.get("quantization_config") for v in config.values() if isinstance(v, dict)), None)
    return str((q or {}).get("quant_method") or "").lower() if isinstance(q, dict) else ""


def needs_dequantised_view(config: dict) -> bool:
    """True for a config whose quantisation transformers would load with a GPU-only quantiser (see module doc)."""
    return quant_method_name(config) in DEQUANTISED_METHODS


def _without_quantisation(config: dict) -> dict:
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    for key, value in out.items():
        if isinstance(value, dict) and "quantization_config" in value:
            out[key] = {k: v for k, v in value.items() if k != "quantization_config"}
    return out


def release_dtype(config: dict) -> torch.dtype:
    """The float dtype the release computes in: its `torch_dtype` / `dtype` where a 16/32-bit float, else bf16."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    name = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    dtype = TORCH_DTYPES.get(str(name))
    return dtype if dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16


def _data_of(ckpt, key: str) -> str | None:
    weight = ckpt.quantised(key) if key else None
    return weight.data if weight else None


def dequantised_view(path: Path, out: Path) -> Path:
    """Write into `out` checkpoint `path` with its quantised weights dequantised (fp32) under their logical keys,
    activation scales dropped, the other tensors and files as they are; returns `out`. Shard by shard, so peak
    memory is one shard's dequantised weights."""
    ckpt = open_checkpoint(str(path))
    view = ckpt.quant
    dtype = release_dtype(ckpt.config)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for file in sorted(set(ckpt.weight_map.values())):
        stored = [k for k, f in ckpt.weight_map.items() if f == file]
        # a quantised weight goes where its data part is (its scales may sit in another shard)
        logical = sorted(
            {view.part_of.get(k, k) for k in stored if k not in view.part_of or _data_of(ckpt, view.part_of[k]) == k}
            - {""}
        )
        logical = [k for k in logical if k.rsplit(".", 1)[-1] not in ACTIVATION_SUFFIXES]
        quantised = [k for k in logical if ckpt.quantised(k)]
        tensors = ckpt.read_weights(quantised, dtype) if quantised else {}
        plain = [k for k in logical if k not in tensors]
        tensors.update(ckpt.read_raw(plain))
        save_tensors(out / file, {k: v.contiguous() for k, v in tensors.items()}, {"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    write_json(out / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})
    config = json.loads((path / "config.json").read_text())
    write_json(out / "config.json", _without_quantisation(config))
    for item in path.iterdir():  # tokenizer, generation config: as the release ships them
        if item.is_file() and item.suffix != ".safetensors" and item.name not in ("config.json", INDEX_FILE):
            shutil.copyfile(item, out / item.name)
    return out
