#!/usr/bin/env python3
"""Benchmark one `distill` step: throughput, fraction of the bf16 FLOP peak, and the overhead of the training loop
over a bare forward + backward of the same draft on the same batch.

Two timings on the same draft, batch and TTT unroll (K steps over B x T tokens, offline-style teacher: top-k ids and
log-probs, as `distill --hidden-states` reads them):
- bare: the K unrolled draft forwards (`ttt_logits`), a trivial loss, backward;
- step: what the distill loop does: `ttt_forward` with the KL loss against the teacher, backward, gradient clipping,
  AdamW step, zero_grad.
Prints tokens/s (B x T per step), the model FLOPs per step (6 per trainable weight a token passes through, 4 for the
frozen head: forward + input gradient; attention scores not counted), the fraction of the device's bf16 dense peak
(CUDA only: from --peak-tflops or the device name), and step / bare (goal <= 1.3).

The draft: `--draft DIR` (any converted draft), `--config CONFIG.json` for a native MTP layer at a real family's
dimensions built from a target's config alone (random weights made on the device, e.g. DeepSeek-V3's from
examples/configs/deepseek-v3.json; `--override` replaces config fields, for tiny dry runs), else a synthetic EAGLE-3
draft of `--hidden` width (Llama-8B-sized at --hidden 4096), or `--tiny` for the bundled tiny-mimo target's native MTP
layer. `--train-subset` freezes what `distill --train-subset` freezes. Beside the timings: the memory plan
`distill --plan` prints for the same run (offline teacher, one rank) and, on CUDA, the measured peak of allocated
memory over the whole run (the plan's own scope: weights, gradients, optimizer state, target tensors, activations).

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

from mtp2draft.draft.build import converted_config  # noqa: E402
from mtp2draft.draft.disk import build_draft, load_draft, read_draft_config
from mtp2draft.family.spec import find_spec  # noqa: E402
from mtp2draft.target.hidden import Features  # noqa: E402
from mtp2draft.train.memory import plan as memory_plan  # noqa: E402
from mtp2draft.train.parallel import freeze_subset  # noqa: E402
from mtp2draft.train.settings import DistillConfig  # noqa: E402
from mtp2draft.train.subsets import TRAIN_SUBSETS  # noqa: E402
from mtp2draft.train.ttt import draft_target_ids, ttt_forward, ttt_logits  # noqa: E402

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
    """6 x the trainable weights a token passes through (routed experts: top-k of them), 4 x the frozen ones (forward
    and input gradient: a frozen subset, the target's head)."""
    top_k = int(getattr(draft.config, "num_experts_per_tok", None) or 1)
    flops = 0.0
    for module in draft.modules():
        for p in module.parameters(recurse=False):
            per = 6 if p.requires_grad else 4
            if p.dim() == 2:
                flops += per * p.numel()
            elif p.dim() == 3:
                flops += per * top_k * p[0].numel()
    head = getattr(draft, "head_weight", None)
    if head is not None:
        flops += 4 * head.numel()
    return flops


def config_draft(path: Path, override: str | None, device: str) -> tuple[dict, torch.nn.Module]:
    """(draft config, draft) of the native MTP layer a target config.json describes, its weights made on `device`
    (normal(0, 0.02) matrices, unit norms, zero biases): no checkpoint is read or written."""
    target = json.loads(path.read_text())
    target.update(json.loads(override) if override else {})
    cfg = converted_config(find_spec(target), target, 0)
    with torch.device(device):
        draft = build_draft(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    return cfg, draft


def timed(fn, iters: int, device: str, warmup: int = 2) -> tuple[float, float]:
    """(seconds per call, seconds of the `warmup` untimed calls before: compilation shows there)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync()
    warm = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters, warm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--draft", type=Path, help="a converted draft directory")
    ap.add_argument("--tiny", action="store_true", help="the bundled tiny-mimo target's native MTP layer")
    ap.add_argument("--config", type=Path, help="a target config.json: its native MTP layer, random weights")
    ap.add_argument("--override", help="with --config: JSON object of config fields to replace (tiny dry runs)")
    ap.add_argument("--train-subset", choices=list(TRAIN_SUBSETS), default="all")
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
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls before each timing (compilation)")
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

    draft_cfg = None
    if args.draft:
        draft, draft_cfg = load_draft(args.draft), read_draft_config(args.draft)
    elif args.config:
        draft_cfg, draft = config_draft(args.config, args.override, device)
    elif args.tiny:
        from mtp2draft.conversion import convert

        tmp = Path(tempfile.mkdtemp()) / "d"
        root = Path(__file__).resolve().parents[1]
        convert(str(root / "examples" / "targets" / "tiny-mimo"), tmp, dtype="float32")
        draft, draft_cfg = load_draft(tmp), read_draft_config(tmp)
    else:
        hidden = args.hidden or (4096 if gpu else 512)
        vocab = args.vocab if gpu or args.hidden else 32000
        draft_cfg = eagle3_config(hidden, vocab, min(args.draft_vocab, vocab))
        draft = build_draft(draft_cfg)
    v, h = draft.vocab_size, draft.hidden_size
    # the target's embedding and head in the compute dtype, as the memory plan counts them (a bf16 online target)
    shared = torch.bfloat16 if precision == "bf16" else torch.float32
    embed = torch.randn(v, h, device=device, dtype=shared) * 0.02
    draft.attach_target(embed, torch.randn(v, h, device=device, dtype=shared) * 0.02)
    draft = draft.to(device)
    freeze_subset(draft, args.train_subset)
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
    params = [p for p in draft.trainable_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95))
    autocast = (
        (lambda: torch.autocast(torch.device(device).type, dtype=torch.bfloat16))
        if precision == "bf16"
        else contextlib.nullcontext
    )
    weights = [0.8**s for s in range(k)]

    def bare() -> None:
        with autocast():
            logits = ttt_logits(draft, feats, ids, k)
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

    # `distill --plan` for this run (one rank, offline top-k teacher), to set beside what CUDA measures
    run_cfg = DistillConfig(batch_size=b, max_length=t, ttt_steps=k, train_subset=args.train_subset)
    mem = memory_plan(draft_cfg, run_cfg, precision=precision, online_logits=False)
    figures = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "draft": draft.kind,
        "parameters": sum(p.numel() for p in draft.parameters()),
        "trainable_params": sum(p.numel() for p in params),
        "train_subset": args.train_subset,
        "precision": precision,
        "compile": args.compile,
        "batch": b,
        "length": t,
        "ttt_steps": k,
    }
    draft.train()
    try:
        t_bare, warm_bare = timed(bare, args.iters, device, args.warmup)
        t_step, warm_step = timed(step, args.iters, device, args.warmup)
    except torch.OutOfMemoryError as exc:  # the plan said it fits, the device disagreed: that is a finding too
        figures["error"] = f"out of memory: {str(exc).splitlines()[0]}"
        t_bare = t_step = None
    tokens = b * t
    flops = model_flops_per_token(draft) * tokens * k
    peak = args.peak_tflops
    if peak is None and gpu:
        name = torch.cuda.get_device_name()
        peak = next((p for key, p in PEAKS.items() if key in name), None)
    if t_step is not None:
        figures.update(
            {
                "warmup_s": round(warm_bare + warm_step, 2),
                "bare_fwd_bwd_s": round(t_bare, 4),
                "distill_step_s": round(t_step, 4),
                "step_over_bare": round(t_step / t_bare, 3),
                "tokens_per_s": round(tokens / t_step, 1),
                "model_tflops_per_step": round(flops / 1e12, 3),
                "achieved_tflops": round(flops / t_step / 1e12, 3),
                "fraction_of_bf16_peak": round(flops / t_step / 1e12 / peak, 4) if peak else None,
            }
        )
    figures["bf16_peak_tflops"] = peak
    figures["plan_bytes"] = mem.bytes
    figures["plan_total_bytes"] = mem.total
    figures["measured_peak_bytes"] = torch.cuda.max_memory_allocated() if gpu else None
    figures["measured_over_plan"] = round(figures["measured_peak_bytes"] / mem.total, 3) if gpu else None
    for key, value in figures.items():
        print(f"{key:24s} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if t_step is None:
        return 3
    verdict = "meets" if figures["step_over_bare"] <= 1.3 else "misses"
    print(f"distill step / bare fwd+bwd = {figures['step_over_bare']} ({verdict} the <= 1.3 goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
