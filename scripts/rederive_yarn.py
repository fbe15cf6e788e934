"""Give a bundled DeepSeek-V3-family tiny target its release's YaRN `rope_scaling` without retraining it.

With a YaRN block, transformers' DeepseekV3Attention (and vLLM's / SGLang's MLA) multiply the softmax scale by
yarn_get_mscale(factor, mscale_all_dim) ** 2 (transformers' `yarn_apply_mscale`); YaRN's cos/sin factor is
mscale(factor, mscale) / mscale(factor, mscale_all_dim), 1 for DeepSeek's block. Dividing every `q_b_proj` weight
(the query of every layer, the MTP layer's included) by that square leaves q . k and so every attention score as
trained; what remains is YaRN's change to the RoPE frequencies: pairs whose wavelength exceeds
original_max_position_embeddings / beta_fast rotate more slowly (by up to `factor`).

    python scripts/rederive_yarn.py examples/targets/tiny-deepseek-v3 [--check PROMPTS.jsonl]

It also sets max_position_embeddings to factor x original_max_position_embeddings, as the release has it. It rewrites
the directory's config.json and shards in place (run it once, on a bundled target) and prints, with
--check, the logit change on the first prompts of PROMPTS.jsonl.

What this script does not do: train anything, or apply to a target whose attention is not MLA with a q LoRA.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# DeepSeek-V3's published rope_scaling (deepseek-ai/DeepSeek-V3 config.json; V3.1, V3.2, R1 and Kimi-K2 alike)
DEEPSEEK_V3_YARN = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}


def _logits(target: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0] for p in prompts]


def _prompts(target: Path, path: Path, count: int = 8, length: int = 256) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    lines = path.read_text().splitlines()[:count]
    return [tok(json.loads(line)["text"])["input_ids"][:length] for line in lines]


def rederive(target: Path) -> float:
    """Rewrite `target` in place; returns the query scale applied (1 / mscale ** 2)."""
    from transformers.modeling_rope_utils import yarn_get_mscale

    config = json.loads((target / "config.json").read_text())
    if config.get("rope_scaling"):
        raise SystemExit(f"{target} already has a rope_scaling: {config['rope_scaling']}")
    scale = 1.0 / yarn_get_mscale(DEEPSEEK_V3_YARN["factor"], DEEPSEEK_V3_YARN["mscale_all_dim"]) ** 2
    for shard in sorted(target.glob("model-*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        for key in [k for k in tensors if k.endswith("self_attn.q_b_proj.weight")]:
            stored = tensors[key].dtype  # scaled in fp32, stored back in the shard's dtype
            tensors[key] = (tensors[key].float() * scale).to(stored)
        save_file(tensors, str(shard), metadata)
    config["rope_scaling"] = dict(DEEPSEEK_V3_YARN)
    # the release's context: factor x the pretraining length (163840, as DeepSeek-V3 states it); transformers warns
    # when the two disagree, and nothing computes with it at these lengths
    config["max_position_embeddings"] = (
        DEEPSEEK_V3_YARN["factor"] * DEEPSEEK_V3_YARN["original_max_position_embeddings"]
    )
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--check", type=Path, help="a jsonl of {'text': ...} records: report the logit change")
    args = parser.parse_args()
    prompts = _prompts(args.target, args.check) if args.check else []
    before = _logits(args.target, prompts) if prompts else []
    scale = rederive(args.target)
    print(f"q_b_proj scaled by {scale:.6f}; rope_scaling = DeepSeek-V3's", file=sys.stderr)
    if prompts:
        after = _logits(args.target, prompts)
        diff = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
        same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(after, before, strict=True))
        total = sum(len(p) for p in prompts)
        print(json.dumps({"prompts": len(prompts), "tokens": total, "max_abs_logit_change": diff,
                          "top1_agreement": same / total}))  # fmt: skip


if __name__ == "__main__":
    main()
