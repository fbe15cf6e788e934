"""Does vLLM compute the same next-token distribution as transformers for a checkpoint? A minimal reproduction.

Runs in vLLM's venv (`mtp2draft engine install vllm` prints its python; it holds vLLM and the transformers it pins), with no
mtp2draft import, so an engine maintainer can run it as it is:

    $(mtp2draft engine install vllm) benchmarks/vllm-repro/repro_vllm_logits.py CHECKPOINT_DIR [--variant KEY=JSON ...] [--prompts N]

For each prompt (token ids of the checkpoint's own tokenizer over lines of a JSONL file, or fixed ids) it compares
vLLM's prompt log-probabilities (top 5 per position, fp32, eager) with transformers' log_softmax of the same
checkpoint in fp32: the largest difference of a log-probability both report, and how often the two argmaxes differ.
`--variant` reruns both sides on a copy of the checkpoint whose config.json has KEY set to the JSON value (the weights
are links to the same files), to find which part of the computation differs: e.g. `n_group=1 topk_group=1` (the
routing without groups), `norm_topk_prob=false`, `num_experts_per_tok=8` (every expert).

With REPRO_NATIVE_ROPE=1 in the environment, vLLM's CPU rotary op is replaced by the layer's own PyTorch code
(`forward_native`) in every vLLM process: the check that the CPU op is what differs (benchmarks/vllm-repro/repro_vllm_cpu_rope.py
shows it on one layer).

Prints one JSON line per variant. What it does not do: change vLLM's files, or judge which side is right.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

if os.environ.get("REPRO_NATIVE_ROPE") == "1":  # at import: vLLM's spawned workers re-import this file
    # the workaround for vLLM 0.32's CPU rotary op (benchmarks/vllm-repro/repro_vllm_cpu_rope.py): rotate with the layer's own
    # PyTorch code instead of `ops.rotary_embedding`
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    RotaryEmbedding.forward_cpu = RotaryEmbedding.forward_native


def parse_variant(text: str) -> dict:
    """'a=1 b=x' -> {'a': 1, 'b': 'x'} (values read as JSON where they parse)."""
    out = {}
    for item in text.split():
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def variant_dir(base: Path, changes: dict, root: Path) -> Path:
    """A copy of `base` with config.json edited; `num_hidden_layers` also drops the layers past it (and the MTP
    layers) from the weights, which both loaders then accept."""
    if not changes:
        return base
    d = Path(tempfile.mkdtemp(dir=root))
    config = json.loads((base / "config.json").read_text())
    config.update(changes)
    keep = changes.get("num_hidden_layers")
    for f in base.iterdir():
        if f.name == "config.json" or (keep is not None and f.name.endswith((".safetensors", ".index.json"))):
            continue
        os.symlink(f.resolve(), d / f.name)
    if keep is not None:
        import re

        from safetensors.torch import load_file, save_file

        config["num_nextn_predict_layers"] = 0
        tensors = {}
        for shard in sorted(base.glob("*.safetensors")):
            for name, t in load_file(str(shard)).items():
                m = re.match(r"model\.layers\.(\d+)\.", name)
                if m is None or int(m.group(1)) < keep:
                    tensors[name] = t
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(config))
    return d


def hf_logprobs(model_dir: Path, prompts: list[list[int]]) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0].float()  # [T, V]: position i predicts token i + 1
            out.append(torch.log_softmax(logits, dim=-1))
    del model
    return out


def vllm_logprobs(model_dir: Path, prompts: list[list[int]]) -> list:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype="float32", seed=0, max_model_len=1024, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=5)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    found = [[{t: lp.logprob for t, lp in (pos or {}).items()} for pos in o.prompt_logprobs] for o in outs]
    ranks = [[{lp.rank: t for t, lp in (pos or {}).items()} for pos in o.prompt_logprobs] for o in outs]
    with contextlib.suppress(Exception):  # best effort: the engine core also exits with its parent
        llm.llm_engine.engine_core.shutdown()
    return list(zip(found, ranks, strict=True))


def compare(hf: list, vl: list) -> dict:
    """The largest log-probability difference (overall, and at the first predicted position, where attention has
    one key: a difference there is outside the attention scores), and argmax disagreements."""
    worst, first, positions, differ = 0.0, 0.0, 0, 0
    for lp, (found, ranks) in zip(hf, vl, strict=True):
        for i in range(1, len(found)):  # vLLM's entry i: log p(token i | tokens < i); transformers' row i - 1
            row = lp[i - 1]
            gap = max((abs(float(row[t]) - value) for t, value in found[i].items()), default=0.0)
            worst = max(worst, gap)
            first = max(first, gap) if i == 1 else first
            top = ranks[i].get(1)
            if top is not None:
                positions += 1
                differ += int(int(row.argmax()) != top)
    return {
        "max_abs_logprob_diff": round(worst, 6),
        "first_position_max_diff": round(first, 6),
        "positions": positions,
        "argmax_differs": differ,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", type=Path, help="JSONL with a 'text' field per line (default: fixed token ids)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--length", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--variant", action="append", default=[], help="'KEY=JSON ...': a config edit to rerun with")
    args = ap.parse_args()
    if args.data:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.checkpoint)
        lines = [json.loads(x)["text"] for x in args.data.read_text().splitlines()[: args.prompts]]
        prompts = [tok(text)["input_ids"][: args.length] for text in lines]
    else:
        vocab = json.loads((args.checkpoint / "config.json").read_text())["vocab_size"]
        prompts = [[(97 * n + 13 * i) % vocab for i in range(args.length)] for n in range(args.prompts)]
    root = Path(tempfile.mkdtemp(prefix="repro-vllm-"))
    try:
        for variant in ["", *args.variant]:
            row: dict = {"variant": variant or "as shipped"}
            try:
                d = variant_dir(args.checkpoint, parse_variant(variant), root)
                row |= compare(hf_logprobs(d, prompts), vllm_logprobs(d, prompts))
            except Exception as exc:  # noqa: BLE001 - one variant failing does not end the comparison
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":  # vLLM's CPU engine spawns workers that re-import this file
    sys.exit(main())
