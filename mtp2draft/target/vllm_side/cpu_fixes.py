"""Work around vLLM CPU-build bugs that make it compute something other than the model; runs under vLLM's Python.

The drivers call `apply()` at import, so vLLM's spawned workers (which re-import the driver) get the same fixes.
Each fix is asked for through the environment by mtp2draft's side (`mtp2draft.target.engine.vllm_environment`),
applies only on the CPU platform, and is reported in the driver's reply, so a figure always says what ran.

- `MTP2DRAFT_VLLM_NATIVE_ROPE=1`: vLLM 0.32.0's CPU rotary op (`RotaryEmbedding.forward_cpu`, `ops.rotary_embedding`)
  rotates a query shaped [T, H, R], and the strided q_pe / k_pe views DeepSeek's MLA passes it, wrongly, and writes
  outside k_pe (scripts/repro_vllm_cpu_rope.py). The layer's own PyTorch code (`forward_native`) is used instead;
  with it vLLM equals transformers on MLA targets to ~1e-5 in every log-probability (docs/benchmarks.md). Asked for
  for MLA targets only; other models keep vLLM's own op.

What it does not do: change vLLM's files, or anything on a GPU build.
"""

from __future__ import annotations

import os

NATIVE_ROPE = "MTP2DRAFT_VLLM_NATIVE_ROPE"


def apply() -> list[str]:
    """Apply the fixes the environment asks for; the names of those applied."""
    applied: list[str] = []
    if os.environ.get(NATIVE_ROPE) != "1":
        return applied
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return applied
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    RotaryEmbedding.forward_cpu = RotaryEmbedding.forward_native
    applied.append("rotary embedding: forward_native instead of the CPU op (scripts/repro_vllm_cpu_rope.py)")
    return applied
