"""Measure this machine's memory bandwidth and bf16 / fp32 matmul throughput, as the speed model's accelerator facts.

    python benchmarks/measure_cpu.py [--threads 2] [--seconds 3]

A CPU slot has no datasheet figure (a shared slot of 2 server cores least of all), so the speed model's `cpu-2core`
entry (speed/accelerators.py) holds what this script measures on the project's CI machine: stream bandwidth as
bytes read + written per second by a large tensor copy, and the throughput of square matmuls large enough to be
compute-bound, in bf16 (what vLLM's CPU build runs the bundled targets in) and fp32. Each figure is the best of
several timed repeats (the least disturbed by the other work on a shared machine); the 1-minute load average is
printed beside them, because the machine is shared.

Prints one JSON object. What it does not do: write the figures anywhere (they are copied into accelerators.py by
hand, with the date and the load), or model anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch


def best_rate(work: float, fn, seconds: float) -> float:
    """work / (fastest call of fn) over repeated calls for about `seconds`."""
    fn()  # warm-up: page faults, thread pool
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return work / best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    src = torch.empty(256 * 2**20 // 4, dtype=torch.float32).uniform_()  # 256 MiB, far beyond the caches
    dst = torch.empty_like(src)
    bandwidth = best_rate(2 * src.numel() * 4, lambda: dst.copy_(src), args.seconds)  # bytes read + written
    out = {"threads": args.threads, "stream_bytes_per_s": bandwidth}
    for dtype in (torch.bfloat16, torch.float32):
        n = 2048
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        out[f"{str(dtype).removeprefix('torch.')}_matmul_flops"] = best_rate(
            2 * n**3, lambda a=a, b=b: a @ b, args.seconds
        )
    out["load_average_1min"] = os.getloadavg()[0]
    out["cpu"] = platform.processor() or platform.machine()
    out["torch"] = torch.__version__
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
