"""Accelerator facts the speed model needs, as cited data: HBM bandwidth and dense (non-sparse) bf16 and fp8 tensor
peaks, per device, from each vendor's own datasheet.

The figures are the datasheets' headline numbers, not measured ones (the one exception, `cpu`, is this
project's 2-core CI machine, which no datasheet describes: its bandwidth and bf16 peak are measured by
benchmarks/measure_cpu.py, so the engine timings taken there have a prediction beside them): the model divides bytes by `hbm_bytes_per_s`
and FLOPs by a peak, and leaves what no kernel reaches to its one fitted latency constant (`cost.py`). Vendors quote
tensor peaks "with sparsity"; the dense figure (half of it) is what dense decoding can use, and is what is stored.

What this module does not do: model interconnects (NVLink / Infinity Fabric bandwidth is not an input of the model)
or look anything up at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class Accelerator:
    """One device. Bandwidth in bytes/s, peaks in FLOP/s (dense), memory in bytes."""

    name: str
    description: str
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    memory_bytes: float
    source: str

    def peak_flops(self, weight_bytes_per_param: float) -> float:
        """The tensor peak a forward runs at: fp8 for 1-byte weights (FP8 checkpoints compute in fp8), else bf16."""
        return self.fp8_flops if weight_bytes_per_param <= 1 else self.bf16_flops


# name, description, HBM TB/s, dense bf16 / fp8 TFLOPS, memory GB: the datasheets' figures, their sparsity peaks halved
# (H100 / H200: 1,979 / 3,958 TFLOPS with sparsity; HGX B200: 64 TB/s and 36 / 72 PFLOPS with sparsity per 8 GPUs;
# MI300X: 2,614.9 / 5,229.8 TFLOPS with sparsity)
_FIGURES = (
    ("h100", "NVIDIA H100 SXM5 80 GB", 3.35, 989, 1979, 80),
    ("h200", "NVIDIA H200 SXM 141 GB", 4.8, 989, 1979, 141),
    ("b200", "NVIDIA B200 (HGX B200, per GPU) 180 GB", 8.0, 2250, 4500, 180),
    ("mi300x", "AMD Instinct MI300X 192 GB", 5.3, 1307.4, 2614.9, 192),
    # measured, not a datasheet's (see _SOURCES): this project's CI machine, where the engine timings are taken;
    # no fp8 units, so its fp8 "peak" is the bf16 one
    ("cpu", "2 shared AMD EPYC cores (the project's CI machine; measured)", 0.0281, 0.220, 0.220, 24),
)
_SOURCES = {
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column), https://www.nvidia.com/en-us/data-center/h100/",
    "h200": "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/",
    "b200": "NVIDIA HGX B200 datasheet (per-system figures divided by 8), https://www.nvidia.com/en-us/data-center/hgx/",
    "mi300x": "AMD Instinct MI300X accelerator datasheet, https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
    "cpu": "measured by benchmarks/measure_cpu.py on 2026-12-01 12:47 UTC, torch 2.13.0+cpu, 2 threads, 1-minute load "
    "average 3.0 (a shared machine): stream copy 28.1 GB/s (read + written), 2048^2 matmul 220 GFLOP/s in bf16 "
    "(52 in fp32); no datasheet describes a shared slot of 2 server cores",
}
ACCELERATORS: dict[str, Accelerator] = {
    name: Accelerator(name, about, hbm * TERA, bf16 * TERA, fp8 * TERA, gb * 1e9, _SOURCES[name])
    for name, about, hbm, bf16, fp8, gb in _FIGURES
}


def get_accelerator(name: str) -> Accelerator:
    """The accelerator registered under `name` (case-insensitive); OptionError naming the choices otherwise."""
    from mtp2draft.errors import OptionError

    try:
        return ACCELERATORS[name.lower()]
    except KeyError:
        raise OptionError(f"unknown --gpu {name!r}: choose one of {', '.join(ACCELERATORS)}") from None


__all__ = ["ACCELERATORS", "Accelerator", "get_accelerator"]
