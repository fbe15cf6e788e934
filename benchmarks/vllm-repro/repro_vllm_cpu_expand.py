"""vLLM 0.32.0 CPU build: speculative decoding at temperature > 0 verifies drafts against garbage target probabilities.

Run with the vLLM venv's Python (no model, no mtp2draft import):
    ~/.cache/mtp2draft/vllm-venv/bin/python repro.py
(in mtp2draft: `$(mtp2draft engine install vllm) benchmarks/vllm-repro/repro_vllm_cpu_expand.py`)

Cause. Without a Triton CPU backend (HAS_TRITON False), `CpuPlatform.register_triton_kernel_overrides`
(vllm/platforms/cpu.py l. 670-720, called by vllm/v1/worker/worker_base.py l. 282) replaces
`rejection_sampler.expand_kernel` with `vllm/utils/cpu_triton_utils.py::_expand_kernel_impl` (l. 390-404), which
calls the C++ op with `_ensure_int64(output)` and `_ensure_int64(input_val)`. For a float32 `output` that is a
*copy* (`t.to(torch.int64)`, l. 37-38); the op writes into the copy and nothing is copied back (the other wrappers
in that file do copy back). So `rejection_sampler.expand_batch_to_tokens` (vllm/v1/sample/rejection_sampler.py
l. 581-619; its output is `x.new_empty(num_tokens)`, l. 611) returns uninitialised memory whenever x is not int64:
the per-draft-token temperature in `apply_sampling_constraints` (l. 550-558, then `logits.div_(temperature)`), and
top_k / top_p (l. 561-574). (The int64 cast of the input would also truncate temperature 0.7 -> 0 -> replaced by 1,
top_p 0.9 -> 0.)

Greedy requests never reach this code (`all_greedy` returns early, l. 546), so greedy speculative decoding is
right, while every request with temperature > 0 is verified with target_probs = softmax(logits / garbage): zeros
give inf/NaN (always rejected), negative values invert the distribution (argmax proposals ~never accepted),
denormals make it one-hot; which of these a run gets depends on what the allocator hands back (in an engine on a
tiny MTP target, position-1 acceptance fell to ~0.02 against ~0.3 expected; in this script it usually rises
instead). The recovered (resampled) tokens come from the same wrong probabilities, so the output is not a sample of
the target either.

What it shows:
1. expand_batch_to_tokens on a float32 temperature returns values that are not the temperatures; a pre-filled output
   buffer passed to `_expand` is left untouched (deterministic proof that the op never writes it).
2. rejection_sample + apply_sampling_constraints at temperature 1 with argmax proposals: the position-1 acceptance
   rate is far from its expectation E[p(argmax)] (above or below, by the memory's
   contents), and matches it when expand_batch_to_tokens is done in PyTorch.
Exits 1 if the bug is present.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()  # what every vLLM CPU worker does (worker_base.py ~l. 282)
from vllm.triton_utils import HAS_TRITON  # noqa: E402 (after the overrides, as a worker imports it)
from vllm.v1.sample import rejection_sampler as rs  # noqa: E402


def native_expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def acceptance(steps: int, B: int, K: int, V: int) -> tuple[float, float]:
    """Position-1 acceptance of argmax proposals at temperature 1 over `steps` verify steps; and E[p(argmax)]."""
    g = torch.Generator().manual_seed(0)
    md = SimpleNamespace(
        all_greedy=False, all_random=True, temperature=torch.ones(B), top_k=None, top_p=None, generators={}
    )
    cu = torch.arange(1, B + 1, dtype=torch.int32) * K
    accepted = expected = 0.0
    torch.manual_seed(0)
    for _ in range(steps):
        logits = torch.randn(B * K, V, generator=g) * 3.0  # a peaked target: p(argmax) ~ 0.3-0.5
        draft = logits.argmax(-1).to(torch.int32)  # argmax proposals, no draft probs (as MTP's greedy proposer)
        expected += logits.softmax(-1).max(-1).values.view(B, K)[:, 0].sum().item()
        target_logits = rs.apply_sampling_constraints(logits.clone(), cu, md)
        out = rs.rejection_sample(draft, [K] * B, K, cu, None, target_logits, torch.zeros(B, 1, dtype=torch.int64), md)
        accepted += (out[:, 0] == draft.view(B, K)[:, 0]).sum().item()
    n = steps * B
    return accepted / n, expected / n


def main() -> int:
    import vllm

    print(f"vllm {vllm.__version__}, HAS_TRITON={HAS_TRITON}, expand_kernel -> {type(rs.expand_kernel).__name__}")
    temp = torch.tensor([1.0, 0.7, 1.0, 0.0])
    cu = torch.tensor([4, 8, 12, 16], dtype=torch.int32)
    got = rs.expand_batch_to_tokens(temp, cu, 16, replace_from=0, replace_to=1)
    want = native_expand(temp, cu, 16, replace_from=0, replace_to=1)
    print("temperature per request        :", temp.tolist())
    print("expand_batch_to_tokens (vLLM)  :", [f"{v:.3g}" for v in got.tolist()])
    print("expected                       :", [f"{v:.3g}" for v in want.tolist()])
    buf = torch.full((16,), -7.0)
    rs._expand(buf, temp, cu, 0, 1)
    untouched = bool((buf == -7.0).all())
    print("_expand into a buffer of -7.0  :", f"untouched={untouched}", buf[:6].tolist())

    B, K, V = 4, 4, 1000
    bad, expect = acceptance(300, B, K, V)
    orig = rs.expand_batch_to_tokens
    rs.expand_batch_to_tokens = native_expand
    good, _ = acceptance(300, B, K, V)
    rs.expand_batch_to_tokens = orig
    print(f"position-1 acceptance, T=1, argmax proposals, {300 * B} drafts: expected E[p(argmax)] = {expect:.3f}")
    print(f"  vLLM CPU path as shipped                    : {bad:.3f}")
    print(f"  same, expand_batch_to_tokens in PyTorch     : {good:.3f}")
    broken = untouched or not torch.allclose(got, want) or abs(bad - expect) > 0.05
    print("BUG PRESENT" if broken else "ok")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
