"""vLLM 0.32.0's CPU rotary-embedding op rotates a 3-D query wrongly: the minimal reproduction.

Runs in vLLM's venv (`$(mtp2draft engine install vllm) benchmarks/vllm-repro/repro_vllm_cpu_rope.py`; no model, no mtp2draft import). It
applies one `RotaryEmbedding` (DeepSeek's: 64 rotary dims, GPT-J style, theta 10000) three ways and compares each
with the layer's own `forward_native`:

- query [T, H*R] (flattened), key [T, R]: what most models pass; the CPU op agrees;
- query [T, H, R] contiguous: the CPU op's query differs (every head);
- query and key as the strided views DeepSeek's MLA passes (`q[..., nope:]` of [T, H, nope + R], `k_pe` of
  [T, kv_lora_rank + R]): both differ, and the op writes into the key's `kv_c` part, outside the view.

That is why vLLM's CPU build decodes DeepSeek-V2/V3-style (MLA) checkpoints differently from transformers:
`vllm/model_executor/layers/mla.py` hands the strided q_pe / k_pe to `rotary_emb`, which on CPU dispatches to
`RotaryEmbedding.forward_cpu` (`ops.rotary_embedding`, in place). Position 0 (a rotation by zero) is unaffected, so the
first generated token's distribution still agrees; later positions do not.

Prints the three maximum differences; exits 1 when the op disagrees with forward_native (the bug is present).
"""

from __future__ import annotations

import sys

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope


def main() -> int:
    T, H, P, R, L = 8, 4, 32, 64, 512  # tokens, heads, nope dims, rope dims, kv_lora_rank (DeepSeek-V3's R and L)
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            R, max_position=2048, is_neox_style=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
    torch.manual_seed(0)
    pos = torch.arange(T)
    q_full, kv_full = torch.randn(T, H, P + R), torch.randn(T, L + R)
    q, k = q_full[..., P:], kv_full[..., L:].unsqueeze(1)  # [T, H, R] and [T, 1, R], strided
    q_ref, k_ref = rope.forward_native(pos, q.clone(), k.clone())

    flat_q, flat_k = q.reshape(T, H * R).clone(), k.reshape(T, R).clone()
    rope.forward_cpu(pos, flat_q, flat_k)
    flat = max(float((flat_q.view(T, H, R) - q_ref).abs().max()), float((flat_k.view(T, 1, R) - k_ref).abs().max()))

    dense_q, dense_k = q.clone(), k.clone()
    rope.forward_cpu(pos, dense_q, dense_k)
    dense = float((dense_q - q_ref).abs().max())

    qs, kvs = q_full.clone(), kv_full.clone()
    rope.forward_cpu(pos, qs[..., P:], kvs[..., L:].unsqueeze(1))
    strided = max(float((qs[..., P:] - q_ref).abs().max()), float((kvs[..., L:].unsqueeze(1) - k_ref).abs().max()))
    outside = not torch.equal(kvs[..., :L], kv_full[..., :L])

    print(f"query [T, H*R], key [T, R]:        max |cpu - native| = {flat:.3g}")
    print(f"query [T, H, R] contiguous:        max |cpu - native| = {dense:.3g}")
    print(f"strided q_pe / k_pe (DeepSeek MLA): max |cpu - native| = {strided:.3g}; wrote outside k_pe: {outside}")
    return 1 if max(dense, strided) > 1e-4 or outside else 0


if __name__ == "__main__":
    sys.exit(main())
