"""The safetensors writer: a file whose tensor names, dtypes and shapes are known up front, streamed tensor by tensor
so that peak memory tracks the largest tensor rather than the whole file; `save_tensors` writes a dict through it,
so every file mtp2draft writes has the same byte layout.

What this module does not do: read safetensors (`checkpoint/tensors.py`) or decide where the file goes (the stages
write into an `outputs.directories.atomic_output_dir`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.dtypes import ST_DTYPES, TORCH_TO_ST
from mtp2draft.redact import scrub


class SafetensorsWriter:
    """Write a safetensors file whose tensor names, dtypes and shapes are known up front, one tensor at a time.

    The header is written first from the plan; `write(name, tensor)` then appends data in plan order, so the
    caller never holds more than the tensor it is producing.
    """

    def __init__(self, path: Path, plan: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata=None) -> None:
        self.path = path
        self.plan = plan
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = scrub({str(k): str(v) for k, v in metadata.items()})
        offset = 0
        for name, dtype, shape in plan:
            size = math.prod(shape) * ST_DTYPES[TORCH_TO_ST[dtype]][1]
            header[name] = {"dtype": TORCH_TO_ST[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close() / __exit__
        self._fh.write(struct.pack("<Q", len(raw)) + raw)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want_name, dtype, shape = self.plan[self._next]
        if name != want_name or tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise RuntimeError(
                f"writer expected {want_name} {dtype} {list(shape)}, got {name} {tensor.dtype} {list(tensor.shape)}"
            )
        t = tensor.detach().contiguous().cpu()
        if t.numel():
            self._fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # no copy
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.plan):
            self._fh.close()
            raise RuntimeError(f"writer closed after {self._next} of {len(self.plan)} tensors")
        self._fh.close()

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._fh.close()


def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata=None) -> None:
    """Small helper: write a dict of tensors through the streaming writer (same byte layout everywhere)."""
    plan = [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    with SafetensorsWriter(path, plan, metadata) as writer:
        for key, value in tensors.items():
            writer.write(key, value)
