#!/usr/bin/env python3
"""Benchmark one `distill` step: throughput, fraction of the bf16 FLOP peak, and the overhead of the training loop
over a bare forward + backward of the same draft on the same batch.

Two timings on the same draft, batch and TTT unroll (K steps over B x T tokens, offline-style teacher: top-k ids and
log-probs, as `distill --hidden-states` reads them):
- bare: the K unrolled draft forwards (`ttt_forward(..., return_logits=True)`), a trivial loss, backward;
- step: what the distill loop does: `ttt_forward` with the KL loss against the teacher, backward, gradient clipping,
  AdamW step, zero_grad.
Prints tokens/s (B x T per step), the model FLOPs per step (6 per trainable weight a token passes through, 4 for the
frozen head: forward + input gradient; attention scores not counted), the fraction of the device's bf16 dense peak
(CUDA only: from --peak-tflops or the device name), and step / bare (goal <= 1.3).

The draft: `--draft DIR` (any converted draft), else a synthetic EAGLE-3 draft of `--hidden` width (Llama-8B-sized
at --hidden 4096) built from its config alone, or `--tiny` for the bundled tiny-mimo target's native MTP layer.

Usage: `python scripts/bench_distill.py [--device cuda] [--hidden 4096] [--batch 4] [--length 2048] [--compile]`.
Without a GPU it runs on the CPU with small defaults (--device cpu) and prints the same figures, without the peak
fraction; `--device cuda` without a GPU prints a skip line and exits 0. What it does not do: load a target model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtp2draft.draft.modules import build_draft, load_draft  # noqa: E402
from mtp2draft.target.hidden import Features  # noqa: E402
from mtp2draft.train.ttt import draft_target_ids, ttt_forward  # noqa: E402

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity), from the vendors' data sheets.
PEAKS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "B200": 2250.0}


def eagle3_config(hidden: int, vocab: int, draft_vocab: int) -> dict:
    heads = max(hidden // 128, 1)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(hidden * 3.5),
        "num_attention_heads": heads,
        "num_key_value_heads": max(heads // 4, 1),
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "target_hidden_size": hidden,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28], "use_aux_hidden_state": True},
    }


def model_flops_per_token(draft) -> float:
    """6 x the trainable weights a token passes through (routed experts: top-k of them) + 4 x the frozen head."""
    top_k = int(getattr(draft.config, "num_experts_per_tok", None) or 1)
    flops = 0.0
    for module in draft.modules():
        for p in module.parameters(recurse=False):
            if p.dim() == 2:
                flops += 6 * p.numel()
            elif p.dim() == 3:
                flops += 6 * top_k * p[0].numel()
    head = getattr(draft, "head_weight", None)
    if head is not None:
        flops += 4 * head.numel()
    return flops


def timed(fn, iters: int, device: str) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()  # warm-up (and compilation)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--draft", type=Path, help="a converted draft directory")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny-mimo target's native MTP layer")
    ap.add_argument("--hidden", type=int, default=None, help="synthetic EAGLE-3 width (default 4096 GPU, 512 CPU)")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--length", type=int, default=None)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--topk", type=int, default=20, help="teacher top-k kept per position (offline files)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and not cuda:
        print("skipped: --device cuda but no CUDA device is visible")
        return 0
    gpu = device.startswith("cuda")
    precision = args.precision or ("bf16" if gpu else "fp32")
    b = args.batch or (4 if gpu else 2)
    t = args.length or (2048 if gpu else 128)
    k = args.ttt_steps
    torch.manual_seed(0)

    if args.draft:
        draft = load_draft(args.draft)
    elif args.tiny:
        from mtp2draft.conversion import convert

        tmp = Path(tempfile.mkdtemp()) / "d"
        root = Path(__file__).resolve().parents[1]
        convert(str(root / "examples" / "targets" / "tiny-mimo"), tmp, dtype="float32")
        draft = load_draft(tmp)
    else:
        hidden = args.hidden or (4096 if gpu else 512)
        vocab = args.vocab if gpu or args.hidden else 32000
        draft = build_draft(eagle3_config(hidden, vocab, min(args.draft_vocab, vocab)))
    v, h = draft.vocab_size, draft.hidden_size
    draft.attach_target(torch.randn(v, h) * 0.02, torch.randn(v, h) * 0.02)
    draft = draft.to(device)
    if args.compile:
        (getattr(draft, "block", None) or draft.midlayer).compile()

    width = draft.fc.in_features if draft.kind == "eagle3" else h
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (b, t), generator=gen).to(device)
    mask = torch.ones(b, t, dtype=torch.bool, device=device)
    step0 = torch.randn(b, t, width, generator=gen).to(device)
    logp = torch.randn(b, t, args.topk, generator=gen).log_softmax(-1).sort(-1, descending=True).values
    feats = Features(
        final=step0 if draft.kind == "mtp" else None,
        aux=step0 if draft.kind == "eagle3" else None,
        topk_logprobs=logp.to(device),
        topk_ids=torch.randint(0, v, (b, t, args.topk), generator=gen).to(device),
    )
    vocab_ids = draft_target_ids(draft)
    params = draft.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))
    autocast = (
        (lambda: torch.autocast(torch.device(device).type, dtype=torch.bfloat16))
        if precision == "bf16"
        else contextlib.nullcontext
    )
    weights = [0.8**s for s in range(k)]

    def bare() -> None:
        with autocast():
            logits = ttt_forward(draft, feats, ids, mask, k, weights, return_logits=True)
            loss = sum(x.float().mean() for x in logits)
        loss.backward()
        for p in params:
            p.grad = None

    def step() -> None:
        with autocast():
            stats = ttt_forward(draft, feats, ids, mask, k, weights, vocab_ids)
        opt.zero_grad(set_to_none=True)
        stats.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()

    draft.train()
    t_bare = timed(bare, args.iters, device)
    t_step = timed(step, args.iters, device)
    tokens = b * t
    flops = model_flops_per_token(draft) * tokens * k
    peak = args.peak_tflops
    if peak is None and gpu:
        name = torch.cuda.get_device_name()
        peak = next((p for key, p in PEAKS.items() if key in name), None)
    figures = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "draft": draft.kind,
        "trainable_params": sum(p.numel() for p in params),
        "precision": precision,
        "compile": args.compile,
        "batch": b,
        "length": t,
        "ttt_steps": k,
        "bare_fwd_bwd_s": round(t_bare, 4),
        "distill_step_s": round(t_step, 4),
        "step_over_bare": round(t_step / t_bare, 3),
        "tokens_per_s": round(tokens / t_step, 1),
        "model_tflops_per_step": round(flops / 1e12, 3),
        "achieved_tflops": round(flops / t_step / 1e12, 3),
        "fraction_of_bf16_peak": round(flops / t_step / 1e12 / peak, 4) if peak else None,
    }
    for key, value in figures.items():
        print(f"{key:24s} {value}")
    verdict = "meets" if figures["step_over_bare"] <= 1.3 else "misses"
    print(f"distill step / bare fwd+bwd = {figures['step_over_bare']} ({verdict} the <= 1.3 goal)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
