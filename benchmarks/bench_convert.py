#!/usr/bin/env python3
"""Benchmark `convert` on a synthetic DeepSeek-V3-style FP8 checkpoint served by the loopback Hub, or
(`--family deepseek_v4`) on a hub-layout DeepSeek-V4 checkpoint in the release's own quantisation: routed experts FP4
(int8 pairs, e8m0 `.scale` per 32 inputs), the other linears FP8 e4m3 with e8m0 `.scale` per 128 x 128 block, at a
size where the experts dominate the MTP layer (each group is dequantised as it streams in).

The checkpoint's MTP layer shares its shards with large trunk tensors (as DeepSeek-V3's last shards do), so a
converter that downloads whole shards, or reads more than it needs, shows up in the figures. Prints:
- bytes served for safetensors files / bytes of the tensors the conversion needs (goal <= 1.05);
- peak RSS of the converting process above the RSS of a process that only imports the same modules, as a multiple
  of the largest tensor group the layer has (goal <= 1.5 for both `--to mtp` and `--to eagle3`: memory follows one
  group, not the layer);
- wall time; and the same for a second run (should fetch nothing: the range cache).
Ends with one line per draft kind giving that ratio.

Usage: `python benchmarks/bench_convert.py [--family deepseek_v3|deepseek_v4] [--experts 32] [--hidden 1024]
[--to mtp|eagle3|both] [--keep DIR]` (DeepSeek-V4 converts `--to mtp` only: it has no EAGLE-3 conversion).
Runs on CPU in about two minutes with the defaults (docs/results.md records `--family deepseek_v4 --hidden 1024
--experts 128`, where the expert group is 1.5x the import baseline). What it does not do: train or evaluate anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the fixtures' configs and the loopback Hub are the test suite's support code (tests/support/), not the package's
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.fixtures import fixture_config  # noqa: E402
from support.hub_server import HubServer  # noqa: E402

from mtp2draft.checkpoint.fp8 import quantize_fp8
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.conversion import MIN_EAGLE3_LAYERS, plan_mtp_layer  # noqa: E402
from mtp2draft.family.spec import get_spec  # noqa: E402
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

MB = 1 << 20


def synthetic_config(hidden: int, experts: int, layers: int) -> dict:
    cfg, fp8 = fixture_config("deepseek_v3"), fixture_config("deepseek_v3_fp8")["quantization_config"]
    cfg.update(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        moe_intermediate_size=hidden,
        n_routed_experts=experts,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=hidden // 2,
        kv_lora_rank=hidden // 4,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        num_hidden_layers=layers,
        first_k_dense_replace=1,
        vocab_size=16384,
        quantization_config=fp8,
        rope_scaling=None,
    )
    return cfg


def build(out: Path, hidden: int, experts: int, layers: int) -> dict:
    """Weights with the right names and shapes (values random: the benchmark measures I/O and memory, not quality).

    Trunk layers get the same block shapes as the MTP layer (via the native module's shapes)."""
    from mtp2draft.draft.layout import native_to_checkpoint
    from mtp2draft.draft.modules import NativeMtpDraft

    cfg = synthetic_config(hidden, experts, layers)
    spec = get_spec("deepseek_v3")
    gen = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in NativeMtpDraft(spec, cfg).state_dict().items()}

    def block_tensors(layer: int) -> dict[str, torch.Tensor]:
        state = {}
        for k, (shape, dtype) in shapes.items():
            state[k] = (torch.randn(shape, generator=gen) * 0.02).to(
                torch.float32 if dtype == torch.float32 else torch.bfloat16
            )
        return native_to_checkpoint(spec, {**cfg, "num_hidden_layers": layer}, 0, state)

    tensors: dict[str, torch.Tensor] = {}
    v, h = cfg["vocab_size"], hidden
    tensors["model.embed_tokens.weight"] = (torch.randn(v, h, generator=gen) * 0.02).to(torch.bfloat16)
    tensors["lm_head.weight"] = (torch.randn(v, h, generator=gen) * 0.02).to(torch.bfloat16)
    tensors["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    for layer in range(1, layers + 1):  # trunk layers 1..N-1 (MoE) and the MTP layer N, identical block shapes
        for k, t in block_tensors(layer).items():
            if layer < layers and any(s in k for s in ("enorm", "hnorm", "eh_proj", "shared_head")):
                continue
            tensors[k] = t
    # FP8 like the release: every linear weight of attention and MLP blocks, not embeddings / norms / router / eh_proj
    final = {}
    for k, t in tensors.items():
        if (
            t.dim() == 2
            and "embed" not in k
            and "head" not in k
            and "norm" not in k
            and "mlp.gate." not in k
            and "eh_proj" not in k
        ):
            q, s = quantize_fp8(t.float())
            final[k], final[k + "_scale_inv"] = q, s
        else:
            final[k] = t
    # shards: keys in natural order, cut by size, so the MTP layer shares its shards with trunk tensors
    keys = sorted(final, key=lambda k: [int(x) if x.isdigit() else x for x in k.replace(".", " . ").split()])
    total = sum(final[k].numel() * final[k].element_size() for k in keys)
    n_shards = 4
    weight_map, shards, acc = {}, [dict() for _ in range(n_shards)], 0
    for k in keys:
        idx = min(int(acc * n_shards / total), n_shards - 1)
        shards[idx][k] = final[k]
        weight_map[k] = f"model-{idx + 1:05d}-of-{n_shards:05d}.safetensors"
        acc += final[k].numel() * final[k].element_size()
    out.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(shards):
        save_tensors(out / f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors", shard, {"format": "pt"})
    write_json(out / "config.json", cfg)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return cfg


def build_v4(out: Path, hidden: int, experts: int) -> dict:
    """DeepSeek-V4 as shipped (tests/support's `deepseek_v4_fp4` fixture row: the release's names and quantisation)
    widened so the routed experts dominate: `experts` experts of hidden x hidden, one trunk layer.

    The fixture is built with 2 routed experts per layer (its FP4 quantiser rounds value by value, minutes per expert
    at these sizes on a busy CPU); experts 2.. are then random FP4 bytes (int8 [I, H/2]) with e8m0 `.scale`s
    (2^-8 .. 2^-4, [I, H/32]) in the release's layout, and the router (`ffn.gate.weight` [E, H], `.bias` [E]) is
    resized. Values are random anyway: the benchmark measures bytes and memory."""
    from safetensors.torch import load_file
    from support.fixtures import build_fixture, write_checkpoint

    small = out.parent / f"{out.name}-2-experts"
    build_fixture("deepseek_v4_fp4", small, shards=1, hidden_size=hidden, moe_intermediate_size=hidden,
                  n_routed_experts=2, num_hidden_layers=1, num_hash_layers=0, compress_ratios=[0, 0],
                  q_lora_rank=hidden // 2, o_lora_rank=hidden // 4, head_dim=128, qk_rope_head_dim=64,
                  num_attention_heads=8, vocab_size=16384)  # fmt: skip
    config = {**json.loads((small / "config.json").read_text()), "n_routed_experts": experts}
    tensors = {k: v for f in sorted(small.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    shutil.rmtree(small)
    gen = torch.Generator().manual_seed(0)
    first = re.compile(r"^(?P<p>.*\.ffn\.experts\.)0\.(?P<rest>w[123]\.(?P<part>weight|scale))$")
    for key, t in list(tensors.items()):
        if m := first.match(key):
            for e in range(2, experts):
                if m["part"] == "weight":  # two e2m1 codes per byte: every byte is a valid pair
                    new = torch.randint(-128, 128, t.shape, dtype=torch.int8, generator=gen)
                else:
                    new = torch.randint(119, 124, t.shape, dtype=torch.uint8, generator=gen).view(t.dtype)
                tensors[f"{m['p']}{e}.{m['rest']}"] = new
        elif key.endswith((".ffn.gate.weight", ".ffn.gate.bias")):
            tensors[key] = (torch.randn((experts, *t.shape[1:]), generator=gen) * 0.02).to(t.dtype)
    write_checkpoint(out, config, tensors, shards=4)
    return config


CHILD = """
import importlib, json, sys, time
from mtp2draft.conversion import convert
t = time.perf_counter()
if sys.argv[1] != "--baseline":
    r = convert(sys.argv[1], sys.argv[2], to=sys.argv[3])
else:  # baseline: the same imports (mtp2draft, torch, the family's transformers modules), no data
    importlib.import_module(sys.argv[2])
# VmHWM, not ru_maxrss: Linux carries the parent's high-water mark into a forked child's ru_maxrss
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": time.perf_counter() - t, "peak_mb": int(hwm.split()[1]) / 1024}))
"""


def run_child(args: list[str], env: dict) -> dict:
    """Convert in a fresh interpreter (nothing else in its memory); its wall time and peak RSS."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["deepseek_v3", "deepseek_v4"], default="deepseek_v3")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument(
        "--layers",
        type=int,
        default=MIN_EAGLE3_LAYERS,
        help=f"trunk layers (the MTP layer comes after them; --to eagle3 needs {MIN_EAGLE3_LAYERS} or more)",
    )
    parser.add_argument("--to", choices=["mtp", "eagle3", "both"], default="both")
    parser.add_argument("--keep", type=Path, help="keep the synthetic checkpoint here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    ckpt = args.keep or work / "ckpt"
    t = time.perf_counter()
    v4 = args.family == "deepseek_v4"
    if v4:
        build_v4(ckpt, args.hidden, args.experts)
    else:
        build(ckpt, args.hidden, args.experts, args.layers)
    local = open_checkpoint(str(ckpt))
    spec = get_spec(args.family)
    plan = plan_mtp_layer(local, spec, 0)
    needed = local.needed_keys(plan.checkpoint_keys)
    need_bytes = sum(local.info(k).nbytes for k in needed)
    largest = max(
        torch.Size(plan.expected[g.module_key]).numel() * (4 if g.module_key in plan.buffers else 2)
        for g in plan.groups
    )
    shard_files = sorted(set(local.weight_map.values()))
    print(
        f"synthetic checkpoint: {local.total_bytes() / MB:.0f} MB in {len(shard_files)} shards, MTP layer "
        f"{need_bytes / MB:.0f} MB ({'FP4 experts + FP8' if v4 else 'FP8'}) in "
        f"{len({local.weight_map[k] for k in needed})} of them; "
        f"built in {time.perf_counter() - t:.0f} s"
    )

    with HubServer() as hub:
        repo = f"bench/synthetic-{args.family}"
        hub.add_repo(repo, ckpt)
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.endpoint,
            "HF_TOKEN": "hf_test_token",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(work / "hf"),
            "MTP2DRAFT_CACHE": str(work / "ranges"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        }
        module = f"transformers.models.{args.family}.modeling_{args.family}"
        baseline = run_child(["--baseline", module], env)["peak_mb"]
        print(f"baseline RSS of a process that imports mtp2draft, torch and {module}: {baseline:.0f} MB")
        kinds = ["mtp"] if v4 else ["mtp", "eagle3"] if args.to == "both" else [args.to]
        ratios: dict[str, float] = {}
        for kind in kinds:
            for attempt in ("first run", "second run (cached)"):
                hub.reset_counters()
                out = work / f"out-{kind}-{attempt[:5]}"
                result = run_child([repo, str(out), kind], env)
                peak = result["peak_mb"]
                served = sum(hub.bytes_served_for(f) for f in shard_files)
                ratio = served / need_bytes
                print(f"\n--to {kind}, {attempt}:")
                print(
                    f"  bytes served (safetensors) {served / MB:9.1f} MB   needed tensors {need_bytes / MB:.1f} MB"
                    f"   ratio {ratio:.4f}  (goal <= 1.05)"
                )
                ratio = (peak - baseline) / (largest / MB)
                ratios[kind] = max(ratios.get(kind, 0.0), ratio)
                print(
                    f"  peak RSS {peak:9.0f} MB   largest tensor group {largest / MB:.0f} MB   "
                    f"(peak - baseline) / group = {ratio:.2f}  (goal <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})"
                )
                print(f"  wall time {result['seconds']:.1f} s")
        print()
        for kind, ratio in ratios.items():
            print(f"peak memory above the import baseline, --to {kind}: {ratio:.2f} x the largest tensor group")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
