"""Work around vLLM CPU-build bugs that make it compute something other than the model; runs under vLLM's Python.

The drivers call `apply()` at import, so vLLM's spawned workers (which re-import the driver) get the same fixes.
Each fix is asked for through the environment by mtp2draft's side (`mtp2draft.engines.vllm_launch.vllm_environment`),
applies only on the CPU platform, and is reported in the driver's reply, so a figure always says what ran.

- `MTP2DRAFT_VLLM_NATIVE_ROPE=1`: vLLM 0.32.0's CPU rotary op (`RotaryEmbedding.forward_cpu`, `ops.rotary_embedding`)
  rotates a query shaped [T, H, R], and the strided q_pe / k_pe views DeepSeek's MLA passes it, wrongly, and writes
  outside k_pe (benchmarks/vllm-repro/repro_vllm_cpu_rope.py). The layer's own PyTorch code (`forward_native`) is used instead;
  with it vLLM equals transformers on MLA targets to ~1e-5 in every log-probability (docs/engines.md). Asked for
  for MLA targets only; other models keep vLLM's own op.
- `MTP2DRAFT_VLLM_NATIVE_EXPAND=1`: vLLM 0.32.0's CPU stand-in for the rejection sampler's `expand_kernel`
  (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) converts the output tensor to int64 (`_ensure_int64`,
  a copy for a float32 one) and never copies the result back, so `expand_batch_to_tokens` returns uninitialised
  memory for the float temperature (and top_p) it expands per draft token; with temperature > 0 the target's
  probabilities in rejection sampling are then those of logits divided by garbage (0, negative or denormal numbers),
  and argmax proposals are accepted ~0.001 of the time instead of with probability p(x) (benchmarks/vllm-repro/repro_vllm_cpu_expand.py).
  `rejection_sampler.expand_batch_to_tokens` is replaced by the same thing in PyTorch (`repeat_interleave`).
  Asked for on every target: it changes nothing at temperature 0 (that path never expands).
- The MLA attention backend (asked for with the rotary fix, MLA targets only): on an x86 CPU with AMX tiles vLLM 0.32
  picks `AMX_MLA` (`platforms/cpu.py`, `get_attn_backend_cls`), whose weight packing refuses float32
  (`amx_mla.py:303`, "expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8"), so a float32 MLA target
  does not start there. `engine_options()` asks for the reference `CPU_MLA` backend, the one a CPU without AMX gets,
  for the target and the draft, so a figure does not depend on which CPU ran it.

What it does not do: change vLLM's files, or anything on a GPU build.
"""

from __future__ import annotations

import os

NATIVE_ROPE = "MTP2DRAFT_VLLM_NATIVE_ROPE"
NATIVE_EXPAND = "MTP2DRAFT_VLLM_NATIVE_EXPAND"


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from: int = 0, replace_to: int = 0):
    """vLLM's `rejection_sampler.expand_batch_to_tokens` in PyTorch: x [batch] repeated by the counts that
    cu_num_tokens [batch] (cumulative) gives, values equal to replace_from replaced by replace_to; [num_tokens]."""
    import torch

    cu = cu_num_tokens.to(device=x.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    out = x.new_zeros(num_tokens)
    expanded = torch.repeat_interleave(x, counts)
    n = min(num_tokens, expanded.shape[0])
    out[:n] = expanded[:n]
    return out


def engine_options(speculative_config: dict | None = None) -> dict:
    """The `vllm.LLM` arguments for attention and speculation (the drivers pass exactly these): `speculative_config`
    as given, and on the CPU platform for an MLA target the reference MLA backend for the target and for the draft.
    The draft needs it in its own config: vLLM 0.32 never gives a draft the target's backend
    (`v1/spec_decode/llm_base_proposer.py`, "Never inherit the attention backend from base"), so an MTP draft left
    to choose takes AMX_MLA beside the target's CPU_MLA, and no KV block size suits both ("No common block size for
    128 (CPU_MLA: [16]; AMX_MLA: [MultipleOf(32)])")."""
    out: dict = {"speculative_config": speculative_config}
    if os.environ.get(NATIVE_ROPE) != "1":
        return out
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return out
    out["attention_config"] = {"backend": "CPU_MLA"}
    if speculative_config is not None:
        out["speculative_config"] = {"attention_backend": "CPU_MLA", **speculative_config}
    return out


def apply() -> list[str]:
    """Apply the fixes the environment asks for; the names of those applied."""
    applied: list[str] = []
    rope, expand = os.environ.get(NATIVE_ROPE) == "1", os.environ.get(NATIVE_EXPAND) == "1"
    if not (rope or expand):
        return applied
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return applied
    if rope:
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

        RotaryEmbedding.forward_cpu = RotaryEmbedding.forward_native
        applied.append(
            "rotary embedding: forward_native instead of the CPU op (benchmarks/vllm-repro/repro_vllm_cpu_rope.py)"
        )
    if expand:
        from vllm.v1.sample import rejection_sampler

        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
        applied.append(
            "rejection sampler: expand_batch_to_tokens in PyTorch instead of the CPU expand op, which leaves float "
            "outputs (temperature, top_p) unwritten (benchmarks/vllm-repro/repro_vllm_cpu_expand.py)"
        )
    return applied
