"""Accelerator facts the speed model needs, as cited data: HBM bandwidth and dense (non-sparse) bf16 and fp8 tensor
peaks, per device, from each vendor's own datasheet.

The figures are the datasheets' headline numbers, not measured ones: the model divides bytes by `hbm_bytes_per_s`
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


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            name="h100",
            description="NVIDIA H100 SXM5 80 GB",
            hbm_bytes_per_s=3.35 * TERA,
            bf16_flops=989 * TERA,  # 1,979 TFLOPS with sparsity
            fp8_flops=1979 * TERA,  # 3,958 TFLOPS with sparsity
            memory_bytes=80e9,
            source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column), https://www.nvidia.com/en-us/data-center/h100/",
        ),
        Accelerator(
            name="h200",
            description="NVIDIA H200 SXM 141 GB",
            hbm_bytes_per_s=4.8 * TERA,
            bf16_flops=989 * TERA,  # 1,979 TFLOPS with sparsity
            fp8_flops=1979 * TERA,  # 3,958 TFLOPS with sparsity
            memory_bytes=141e9,
            source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/",
        ),
        Accelerator(
            name="b200",
            description="NVIDIA B200 (HGX B200, per GPU) 180 GB",
            hbm_bytes_per_s=8.0 * TERA,  # 64 TB/s per 8-GPU HGX B200
            bf16_flops=2250 * TERA,  # 36 PFLOPS per HGX B200 with sparsity = 4.5 per GPU, half dense
            fp8_flops=4500 * TERA,  # 72 PFLOPS per HGX B200 with sparsity = 9 per GPU, half dense
            memory_bytes=180e9,
            source="NVIDIA HGX B200 datasheet (per-system figures divided by 8), https://www.nvidia.com/en-us/data-center/hgx/",
        ),
        Accelerator(
            name="mi300x",
            description="AMD Instinct MI300X 192 GB",
            hbm_bytes_per_s=5.3 * TERA,
            bf16_flops=1307.4 * TERA,  # 2,614.9 TFLOPS with sparsity
            fp8_flops=2614.9 * TERA,  # 5,229.8 TFLOPS with sparsity
            memory_bytes=192e9,
            source="AMD Instinct MI300X accelerator datasheet, https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        ),
    )
}


def get_accelerator(name: str) -> Accelerator:
    """The accelerator registered under `name` (case-insensitive); OptionError naming the choices otherwise."""
    from mtp2draft.errors import OptionError

    try:
        return ACCELERATORS[name.lower()]
    except KeyError:
        raise OptionError(f"unknown --gpu {name!r}: choose one of {', '.join(ACCELERATORS)}") from None


__all__ = ["ACCELERATORS", "Accelerator", "get_accelerator"]
