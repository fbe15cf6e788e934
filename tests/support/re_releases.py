"""Re-releases of a bundled target as people publish them: a quantised export or a fine-tune whose MTP layer is kept,
quantised, left bf16, moved to a separate file (indexed or not) or dropped, with the count field and the exclusion
list as the release wrote them. The quantisers are `support/quantised.py`'s (each written from its format's rule and
checked against compressed-tensors' own compressors in tests/test_quant_formats.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mtp2draft.outputs.writer import save_tensors
from support.fixtures import write_checkpoint
from support.quantised import SCHEMES

# every linear of attention and MLP, MLA's `kv_a_proj_with_mqa` included (a W4A16 export quantises all of them)
QUANTISED = re.compile(r"_proj(_with_mqa)?\.weight$")


def release_variant(
    source: Path,
    out: Path,
    mtp_prefix: str,
    *,
    scheme: str | None = None,
    mtp: str = "keep",
    mtp_file: str | None = None,
    indexed: bool = True,
    count: int | None = None,
    ignore: list[str] | None = None,
    trunk_edit: Any = None,
) -> Path:
    """A re-release of checkpoint `source` in `out`.

    scheme: the trunk's quantisation ("int4", "nvfp4", "mxfp4"; None: as stored). mtp: the MTP layer (keys under
    `mtp_prefix`) "keep" (quantised as the trunk), "bf16" (left unquantised) or "drop". mtp_file: the layer in its
    own file, named in the index when `indexed`. count: num_nextn_predict_layers as the release writes it. ignore:
    extra exclusion patterns. trunk_edit: tensors -> tensors applied to the trunk (a fine-tune)."""
    config = json.loads((source / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(shard))
    layer = {k: tensors.pop(k) for k in [k for k in tensors if k.startswith(mtp_prefix)]}
    if trunk_edit is not None:
        tensors = trunk_edit(tensors)
    if scheme is not None:
        quantise, qconfig = SCHEMES[scheme]
        config["quantization_config"] = json.loads(json.dumps(qconfig))
        tensors = _quantised(tensors, quantise)
        if mtp == "keep":
            layer = _quantised(layer, quantise)
    if ignore:
        q = config["quantization_config"]
        inner = q["quantization"] if isinstance(q.get("quantization"), dict) else q
        field = "exclude_modules" if "exclude_modules" in inner else "ignore"
        inner[field] = [*(inner.get(field) or []), *ignore]
    if count is not None:
        config["num_nextn_predict_layers"] = count
    if mtp == "drop" or mtp_file:
        write_checkpoint(out, config, tensors)
    else:
        write_checkpoint(out, config, {**tensors, **layer})
    if mtp != "drop" and mtp_file:
        save_tensors(out / mtp_file, {k: v.contiguous() for k, v in layer.items()}, {"format": "pt"})
        if indexed:
            index = json.loads((out / "model.safetensors.index.json").read_text())
            index["weight_map"].update(dict.fromkeys(layer, mtp_file))
            (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for path in source.iterdir():  # tokenizer, generation config: the release ships the base's
        if (
            path.is_file()
            and path.suffix != ".safetensors"
            and path.name not in ("config.json",)
            and "index" not in (path.name)
        ):
            shutil.copyfile(path, out / path.name)
    return out


def _quantised(tensors: dict[str, torch.Tensor], quantise: Any) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if QUANTISED.search(key) and tensor.dim() == 2 and tensor.shape[1] % 32 == 0:  # whole groups only
            stem = key[: -len("weight")]
            out.update({stem + part: t for part, t in quantise(tensor).items()})
        else:
            out[key] = tensor
    return out
