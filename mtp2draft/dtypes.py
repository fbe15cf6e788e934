"""The floating-point dtypes mtp2draft reads, writes and runs models in, by name: one list for every `--dtype`
(convert, export, evaluate, distill's online target). Torch-free, so that the CLI can list the choices without
loading torch; the torch dtypes are looked up by the same names where torch is loaded (`torch_dtypes`).

What this module does not do: check a value against the list (each command does, with its option's name).
"""

from __future__ import annotations

DTYPE_NAMES = ("bfloat16", "float16", "float32")


def torch_dtypes() -> dict:
    """{name: torch dtype} for DTYPE_NAMES."""
    import torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES}
