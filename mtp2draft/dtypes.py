"""Every dtype name mtp2draft knows, defined once: the weight dtypes it writes (`--dtype`, a draft config.json's
`torch_dtype`), the safetensors dtype names checkpoints store and their torch dtypes and sizes, the floating ones
among them, and the bytes per parameter a config's `torch_dtype` means to the speed model.

The name tables are torch-free, so that the CLI lists `--dtype` choices without loading torch. The tables holding
torch dtypes (`TORCH_DTYPES`, `ST_DTYPES`, `TORCH_TO_ST`) are built from the name tables the first time one is
imported, and then kept.

What this module does not do: read or write tensors (`checkpoint/tensors.py`, `outputs/writer.py`), or
decide which dtype a stage writes (the stages' settings records).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# The weight dtypes mtp2draft writes (`convert --dtype`, `export --dtype`, a draft config.json's `torch_dtype`).
DTYPE_NAMES = ("bfloat16", "float16", "float32")

# safetensors dtype name -> torch dtype name; F8_E8M0 only where this torch has it (`ST_DTYPES`).
ST_TORCH_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E8M0": "float8_e8m0fnu",
}
# The floating safetensors dtypes a tensor may be stored in unquantised (a dump's shared tensors: bf16 is fine).
ST_FLOATS = ("F64", "F32", "F16", "BF16")
# Those an engine builds an unquantised linear layer in (release checks: an MTP linear stored so).
ST_LINEAR_FLOATS = ("BF16", "F16", "F32")
# The integer dtypes quantisation schemes pack 4-bit values into (two per byte).
ST_PACKED = ("U8", "I8")
# A floating tensor stored in one of these under a config naming another dtype loads converted, or not at all (fp32
# is allowed anywhere): safetensors name -> the `torch_dtype` that config would name.
ST_NOT_F32 = {st: ST_TORCH_NAMES[st] for st in ("BF16", "F16", "F64")}

# A config's `torch_dtype` -> bytes per parameter, for the speed model (`fp8`: how some configs spell FP8).
CONFIG_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}

_TORCH_TABLES = ("TORCH_DTYPES", "ST_DTYPES", "TORCH_TO_ST")

if TYPE_CHECKING:
    # The written dtype names as torch dtypes: the one map from name to dtype.
    TORCH_DTYPES: dict[str, torch.dtype]
    # safetensors dtype name -> (torch dtype, bytes per element)
    ST_DTYPES: dict[str, tuple[torch.dtype, int]]
    # torch dtype -> safetensors dtype name
    TORCH_TO_ST: dict[torch.dtype, str]


def _torch_tables() -> dict[str, Any]:
    import torch

    st = {k: (getattr(torch, n), getattr(torch, n).itemsize) for k, n in ST_TORCH_NAMES.items() if hasattr(torch, n)}
    return {
        "TORCH_DTYPES": {name: getattr(torch, name) for name in DTYPE_NAMES},
        "ST_DTYPES": st,
        "TORCH_TO_ST": {v[0]: k for k, v in st.items()},
    }


def __getattr__(name: str) -> Any:
    """The torch tables, built on first use (PEP 562) so that importing the name tables never loads torch."""
    if name not in _TORCH_TABLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    tables = _torch_tables()
    globals().update(tables)
    return tables[name]
