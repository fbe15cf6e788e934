"""Releases that lost their draft, measured on the bundled tiny DeepSeek-V3 (docs/releases.md):

- quantised: a W4A16 re-release (every attention / MLP linear int4 per 32, compressed-tensors pack-quantized, its MTP
  layer int4 too): the int4 head (`convert` of the release) vs the base's bf16 head grafted as is vs that head
  realigned (`distill --target` the release, its trunk dequantised as the engines read it);
- fine-tuned: the trunk trained further on another corpus (`examples/data/domain.jsonl`, the held-out packages'
  other files) with its MTP layer dropped: the base head grafted as is vs realigned.

Each also carries a control: the base head distilled with the same recipe against the original (base) target, then
grafted. Distillation improves a raw head on any trunk, so the realigned head's gain over the grafted one mixes two
effects; its gain over the control is what realigning to the release's own trunk adds.

The recipe was fixed before any figure was seen: `distill` on `examples/data/train.jsonl` with its defaults but
`--steps 40` (the defaults' 300 steps ran at ~27 s a step on the shared 2-core machine; cut to 40 before any
acceptance was measured); `evaluate` on the first 32 held-out prompts, 32 new tokens, k = 4, greedy, CPU fp32, with
`--baseline` for the paired bootstrap interval; the fine-tune: 200 AdamW steps (lr 3e-4, batch 8 x 128 tokens,
seed 0) on domain.jsonl, all parameters. One recipe, no variant tried.

    python benchmarks/bench_releases.py WORK [quantised|finetuned]

Writes WORK/<variant>/evaluation.json (evaluate --json) and prints each command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the release builders are the test suite's support code (tests/support/re_releases.py), not the package's
sys.path.insert(0, str(REPO / "tests"))

from support.re_releases import release_variant  # noqa: E402

from mtp2draft.pipeline import BUNDLED_TARGET  # noqa: E402

MTP = "model.layers.8."
DATA = REPO / "examples" / "data"
EVAL = ["--data", str(DATA / "heldout.jsonl"), "--max-prompts", "32", "--max-new-tokens", "32", "-k", "4", "--json"]
DISTILL = ["--data", str(DATA / "train.jsonl"), "--steps", "40"]


def run(*args: str, out: Path | None = None) -> None:
    print("$ mtp2draft " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "mtp2draft", *args], check=True, capture_output=out is not None)
    if out is not None:
        out.write_bytes(done.stdout)


def fine_tuned_trunk(work: Path) -> dict:
    """The bundled trunk trained further on domain.jsonl (see the module doc); its tensors by checkpoint key."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(BUNDLED_TARGET))
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_TARGET), dtype=torch.float32)
    ids = []
    for line in (DATA / "domain.jsonl").read_text().splitlines():
        ids += tok(json.loads(line)["text"])["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor(ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model.train()
    for step in range(200):
        starts = torch.randint(0, len(ids) - 129, (8,))
        batch = torch.stack([ids[s : s + 129] for s in starts])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 50 == 0:
            print(f"fine-tune step {step}: loss {loss.item():.3f}", flush=True)
    model.save_pretrained(work / "ft-trunk")
    tensors = {}
    for shard in sorted((work / "ft-trunk").glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def control(work: Path) -> Path:
    """The base head distilled against the base target (the module doc's control), made once for both variants."""
    out = work.parent / "distilled-on-base"
    if not (out / "config.json").exists():
        run("convert", str(BUNDLED_TARGET), "--out", str(work.parent / "base-head-for-control"))
        run("distill", str(work.parent / "base-head-for-control"), "--target", str(BUNDLED_TARGET), *DISTILL,
            "--out", str(out))  # fmt: skip
    return out


def quantised(work: Path) -> None:
    release = release_variant(BUNDLED_TARGET, work / "w4a16", MTP, scheme="int4")
    run("convert", str(release), "--out", str(work / "int4-head"))
    run("convert", str(BUNDLED_TARGET), "--out", str(work / "base-head"))
    run("distill", str(work / "base-head"), "--target", str(release), *DISTILL, "--out", str(work / "realigned"))
    run("evaluate", str(work / "realigned"), "--target", str(release), *EVAL, "--baseline", str(work / "int4-head"),
        "--baseline", str(work / "base-head"), "--baseline", str(control(work)),
        out=work / "evaluation.json")  # fmt: skip


def finetuned(work: Path) -> None:
    trained = fine_tuned_trunk(work)

    def edit(tensors: dict) -> dict:
        return {k: trained[k].to(v.dtype) if k in trained else v for k, v in tensors.items()}

    release = release_variant(BUNDLED_TARGET, work / "ft", MTP, mtp="drop", trunk_edit=edit)
    run("convert", str(BUNDLED_TARGET), "--out", str(work / "base-head"))
    run("distill", str(work / "base-head"), "--target", str(release), *DISTILL, "--out", str(work / "realigned"))
    run("evaluate", str(work / "realigned"), "--target", str(release), *EVAL, "--baseline", str(work / "base-head"),
        "--baseline", str(control(work)), out=work / "evaluation.json")  # fmt: skip


if __name__ == "__main__":
    root, which = Path(sys.argv[1]), sys.argv[2:] or ["quantised", "finetuned"]
    for name in which:
        (root / name).mkdir(parents=True, exist_ok=True)
        {"quantised": quantised, "finetuned": finetuned}[name](root / name)
