"""A checkpoint opened (`Checkpoint`): its weight map, the safetensors header of each shard it reads, and only the
tensors asked for, fetched by byte range (adjacent ones coalesced per shard) from local files or cached Hub ranges
(`checkpoint/sources.py`).

FP8 block weights (`float8_e4m3fn` with an fp32 `<name>_scale_inv` sibling of shape [ceil(M/b), ceil(N/b)]) are
dequantised as `W[i, j] * scale_inv[i // b, j // b]` in fp32 by `read_weights` (the arithmetic is in `checkpoint/fp8.py`).
The other schemes (DeepSeek-V4's FP4 / e8m0, NVFP4, MXFP4, compressed-tensors int4 / int8) are picked from config.json
by `checkpoint/quant.py`: callers ask for logical keys (`...q_proj.weight`), the checkpoint fetches the stored parts and
yields the dequantised weight.

What this module does not do: resolve a SOURCE into a checkpoint (`checkpoint/reader.py`), know anything about MTP
layers or families (`family/`, `conversion/`), or download whole shards.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from mtp2draft.checkpoint.fp8 import (
    SCALE_SUFFIX,
    dequantize_fp8,
    fp8_block_size,
)
from mtp2draft.checkpoint.quant import QuantMethod, QuantView, QuantWeight, TensorScheme, quant_method
from mtp2draft.checkpoint.sources import HubFiles, LocalFiles
from mtp2draft.dtypes import ST_DTYPES
from mtp2draft.errors import CheckpointError

# Files some releases keep their MTP layers in without naming them in the index (MiMo-V2.5, Nemotron-3 Nano:
# `model_mtp.safetensors`): top-level files matching this are found by listing the repo's files (the Hub call that
# resolves the commit already lists them) or the directory, and read with the same range reads.
UNINDEXED_MTP_FILES = "*mtp*.safetensors"

# Gap (bytes) up to which two needed tensors of one shard are fetched with a single range request.
COALESCE_GAP = 4096
# Largest range fetched (and held) at once when reading runs of adjacent tensors.
MAX_RUN_BYTES = 16 << 20


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: shard file, dtype, shape and absolute byte range in the file."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ---- the checkpoint -----------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A resolved SOURCE with its config, index and (lazily) shard headers."""

    source: str
    files: LocalFiles | HubFiles
    config: dict[str, Any]
    weight_map: dict[str, str]
    revision: str | None = None
    commit: str | None = None
    file_sizes: dict[str, int | None] = field(default_factory=dict)
    read_headers: dict[str, dict[str, TensorInfo]] = field(default_factory=dict, repr=False)
    quant_method: QuantMethod = field(init=False, repr=False)
    _view: QuantView | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.quant_method = quant_method(self.config)  # an unknown scheme is refused here, in one line

    @property
    def quant(self) -> QuantView:
        """The index seen through the config's quantisation (logical keys; built on first use, from names)."""
        if self._view is None:
            self._view = QuantView(self.quant_method, self.weight_map)
        return self._view

    unindexed: dict[str, int] = field(default_factory=dict)
    """Files the index does not name whose tensors were added to `weight_map` (`UNINDEXED_MTP_FILES`): file -> count."""
    fp8_row_chunks: dict[str, int] = field(default_factory=dict)
    """FP8 weights stored pre-sharded in row chunks, whose scales may be tiled per chunk (`fp8.py`): key -> chunks;
    set by the layer plan from the spec (a fused qkv_proj's geometry)."""

    @property
    def is_local(self) -> bool:
        return isinstance(self.files, LocalFiles)

    @property
    def bytes_fetched(self) -> int:
        return self.files.bytes_fetched if isinstance(self.files, HubFiles) else self.files.bytes_read

    def total_bytes(self) -> int:
        """Size of all shards named by the index (the whole checkpoint's weights)."""
        return sum(self.file_sizes.get(f) or 0 for f in set(self.weight_map.values()))

    # -- headers --
    def header(self, file: str) -> dict[str, TensorInfo]:
        if file not in self.read_headers:
            self.read_headers[file] = self._read_header(file)
        return self.read_headers[file]

    def _read_header(self, file: str) -> dict[str, TensorInfo]:
        size = self.files.size(file)
        if size is None:
            raise CheckpointError(f"shard {file} is named in the index but is missing from {self.files.describe()}")
        if size < 8:
            raise CheckpointError(f"{file}: truncated safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", self.files.read(file, 0, 8))
        if n == 0 or 8 + n > size or n > 100 * 2**20:
            raise CheckpointError(f"{file}: corrupt safetensors header (declares {n} header bytes, file has {size})")
        raw = self.files.read(file, 8, 8 + n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{file}: corrupt safetensors header (not JSON: {exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{file}: corrupt safetensors header (not a JSON object)")
        base = 8 + n
        infos = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (a, b) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{file}: corrupt header entry for {name}: {entry!r}") from exc
            if dtype not in ST_DTYPES:
                raise CheckpointError(f"{file}: tensor {name} has unsupported dtype {dtype}")
            if b - a != math.prod(shape) * ST_DTYPES[dtype][1] or base + b > size or a < 0:
                raise CheckpointError(
                    f"{file}: header entry for {name} is inconsistent (offsets {a}-{b}, shape {list(shape)}, "
                    f"dtype {dtype}, file size {size})"
                )
            infos[name] = TensorInfo(name, file, dtype, shape, base + a, base + b)
        return infos

    # -- lookup --
    def has(self, key: str) -> bool:
        return key in self.weight_map or key in self.quant.weights

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Logical keys under `prefix`: a quantised weight's parts appear as the one weight they make up."""
        return [
            k for k in self.quant.visible(k for k in self.weight_map if k.startswith(prefix)) if k.startswith(prefix)
        ]

    def quantised(self, key: str) -> QuantWeight | None:
        return self.quant.weights.get(key)

    def scheme_of(self, key: str) -> TensorScheme | None:
        """The scheme a quantised logical key is stored in (from its data part's dtype), None for other keys."""
        weight = self.quantised(key)
        return weight.scheme(self.info(weight.data).dtype) if weight else None

    def shape_of(self, key: str) -> tuple[int, ...]:
        """The shape `read_weights` yields for `key` (a quantised weight's dequantised shape), from headers only."""
        scheme = self.scheme_of(key)
        if scheme is None:
            self.check_readable(key)
            return self.info(key).shape
        names = self.quant.weights[key].names
        params = self.quant_method.params_for(key)
        return tuple(scheme.shape({r: self.info(n).shape for r, n in names.items()}, params))

    def weight_dtype(self, key: str) -> torch.dtype:
        """The dtype `read_weights` yields before any cast: fp32 for quantised and FP8 weights, else as stored."""
        if self.quantised(key) or self.scale_key(key):
            return torch.float32
        return ST_DTYPES[self.info(key).dtype][0]

    def check_readable(self, key: str) -> None:
        """One line for a tensor that is a quantised weight's data without the parts that make it readable."""
        if self.quantised(key):
            return
        foreign = self.quant.foreign(key)
        if foreign:
            raise CheckpointError(foreign)
        if key not in self.weight_map:
            return
        dtype = self.info(key).dtype
        if key + SCALE_SUFFIX in self.weight_map or (
            ST_DTYPES[dtype][0].is_floating_point and dtype not in ("F8_E4M3", "F8_E5M2")
        ):
            return
        from mtp2draft.checkpoint.quant import SCHEMES

        for name in self.quant_method.schemes:
            scheme = SCHEMES[name]
            stem = scheme.stem_of(key)
            if stem is not None and scheme.data_template.format(stem) == key and dtype in scheme.data_dtypes:
                missing = [t.format(stem) for _, t in scheme.parts[1:] if t.format(stem) not in self.weight_map]
                if dtype.startswith("F8"):  # block FP8 reads either scale
                    raise CheckpointError(
                        f"FP8 weight {key} has no {key + SCALE_SUFFIX} (nor {' / '.join(missing)}) in the checkpoint: "
                        "cannot dequantise it"
                    )
                raise CheckpointError(
                    f"{key} is stored as {dtype} ({scheme.name}) but {' / '.join(missing)} is missing from the "
                    "checkpoint: cannot dequantise it"
                )

    def info(self, key: str) -> TensorInfo:
        file = self.weight_map.get(key)
        if file is None:
            raise CheckpointError(f"tensor {key} is not in the checkpoint index")
        header = self.header(file)
        if key not in header:
            raise CheckpointError(f"the index maps {key} to {file}, but that shard's header does not contain it")
        return header[key]

    def scale_key(self, key: str) -> str | None:
        """The `_scale_inv` sibling of an FP8 weight; error when a 1-byte float weight has none."""
        if self.quantised(key):
            return None
        info = self.info(key)
        if info.dtype not in ("F8_E4M3", "F8_E5M2"):
            return None
        scale = key + SCALE_SUFFIX
        if not self.has(scale):
            raise CheckpointError(f"FP8 weight {key} has no {scale} in the checkpoint: cannot dequantise it")
        return scale

    def fp8_block_size(self) -> tuple[int, int]:
        return fp8_block_size(self.config)

    # -- reading --
    def iter_raw(self, keys: Iterable[str], max_run_bytes: int = MAX_RUN_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """(key, tensor as stored) in file order, fetched with one range request per run of adjacent tensors
        (runs capped at `max_run_bytes` unless a single tensor is larger), so memory holds one run at a time."""
        infos = sorted((self.info(k) for k in dict.fromkeys(keys)), key=lambda i: (i.file, i.start))
        for run in _coalesce(infos, max_run_bytes):
            start, end = run[0].start, max(i.end for i in run)
            data = memoryview(self.files.read(run[0].file, start, end))
            for info in run:
                yield info.name, _decode(data[info.start - start : info.end - start], info)
            del data

    def read_raw(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """Tensors as stored (no dequantisation)."""
        return dict(self.iter_raw(keys))

    def needed_keys(self, keys: Iterable[str]) -> list[str]:
        """The stored tensors behind logical `keys`: each key, its `_scale_inv` sibling, or a quantised weight's
        parts."""
        out = []
        for key in keys:
            if self.quantised(key):
                out += self.quant.needed(key)
                continue
            out.append(key)
            scale = self.scale_key(key)
            if scale:
                out.append(scale)
        return out

    def iter_weights(
        self, keys: Iterable[str], dtype: torch.dtype = torch.float32, max_run_bytes: int = MAX_RUN_BYTES
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(key, tensor) in file order: FP8 block and quantised weights dequantised (each as soon as its last stored
        part has arrived), floating tensors cast to `dtype`, others unchanged."""
        parts_of = {key: self.needed_keys([key]) for key in dict.fromkeys(keys)}
        owner = {name: key for key, names in parts_of.items() for name in names}
        waiting: dict[str, dict[str, torch.Tensor]] = {}  # key -> the stored parts that have arrived
        for name, tensor in self.iter_raw(owner, max_run_bytes):
            key = owner[name]
            got = waiting.setdefault(key, {})
            got[name] = tensor
            if len(got) < len(parts_of[key]):
                continue
            del waiting[key]
            yield key, self._assemble(key, got, dtype)

    def _assemble(self, key: str, got: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The weight under `key` from its stored tensors `got` (name -> tensor as stored)."""
        scheme = self.scheme_of(key)
        if scheme is not None:
            names = self.quant.weights[key].names
            params = {**self.quant_method.params_for(key), "scale_key": names.get("scale")}
            tensor = scheme.dequant({r: got[n] for r, n in names.items()}, params, key)
            return check_finite(key, tensor).to(dtype)
        scale = self.scale_key(key)
        if scale is not None:
            chunks = self.fp8_row_chunks.get(key, 1)
            tensor = dequantize_fp8(got[key], got[scale], self.fp8_block_size(), key=key, chunks=chunks)
            return check_finite(key, tensor).to(dtype)
        tensor = got[key]
        return check_finite(key, tensor).to(dtype) if tensor.is_floating_point() else tensor

    def read_weights(self, keys: Iterable[str], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Tensors by key (see `iter_weights`)."""
        keys = list(dict.fromkeys(keys))
        got = dict(self.iter_weights(keys, dtype))
        return {k: got[k] for k in keys}

    def bytes_for(self, keys: Iterable[str]) -> int:
        return sum(self.info(k).nbytes for k in self.needed_keys(keys))


def check_finite(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or a CheckpointError when it holds NaN / Inf: a damaged weight would otherwise convert "exactly" and
    poison every draft made from it."""
    from mtp2draft.checkpoint.tensor_checks import nonfinite_counts

    counts = nonfinite_counts(tensor)
    if counts is not None:
        nan, inf = counts
        raise CheckpointError(
            f"{key} holds non-finite values ({nan} NaN, {inf} Inf of {tensor.numel()}): the checkpoint is damaged"
        )
    return tensor


def _coalesce(infos: list[TensorInfo], max_bytes: int = 1 << 62) -> Iterator[list[TensorInfo]]:
    run: list[TensorInfo] = []
    for info in infos:
        if run and (
            info.file != run[-1].file
            or info.start - max(i.end for i in run) > COALESCE_GAP
            or info.end - run[0].start > max_bytes
        ):
            yield run
            run = []
        run.append(info)
    if run:
        yield run


def _decode(data: bytes | bytearray | memoryview, info: TensorInfo) -> torch.Tensor:
    """A tensor viewing `data` (no copy; it keeps the buffer alive)."""
    dtype, _ = ST_DTYPES[info.dtype]
    if not len(data):
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(info.shape)
