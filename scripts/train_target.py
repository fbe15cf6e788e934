"""Train the small benchmark targets: a trunk and its MTP layer, jointly, as DeepSeek-V3 trains its MTP module.

Nothing can be downloaded here, so the project's acceptance figures come from targets trained by this script on
Python source that is on the machine anyway. For each family in `FAMILIES` it

1. reads the corpus (`corpus_files`): the standard library's `*.py` and those of every installed package in the
   running interpreter's site-packages (pip skipped: it vendors copies of other packages), each source capped in
   characters, files in sha256-of-path order, byte-identical copies dropped. Whole packages are held out
   (`HELDOUT_PACKAGES`: huggingface_hub, also the unseen corpus of docs/notes/eagle3-from-mtp.md, and pytest's `_pytest` /
   `pytest`); no train file comes from them. The tokenizer is the committed one (examples/targets/<dir>/
   tokenizer.json: byte-level BPE, vocab 4096, `<|endoftext|>` as bos/eos/pad, ChatML `<|im_start|>` /
   `<|im_end|>`), reused unchanged so the data files and the tests keep their token ids;
2. builds the trunk with transformers' own class from a config dict written with the family's real config.json
   field names, and the MTP layer with `native_draft(spec, config)` (for DeepSeek-V4 the multi-stream layer, which
   reads the trunk's last-layer residual streams [B, T, 4, H] before its `hc_head`);
3. trains both at once: loss = next-token CE of the trunk + `--mtp-weight` (0.3, DeepSeek-V3's) * t+2 CE of the MTP
   layer, the MTP layer reading the trunk's hidden state at t (before or after the final norm, as the spec's
   `layer.hidden` says) and the embedding of token t+1, through the trunk's own (trainable) embedding and lm_head.
   MoE routers get DeepSeek-V3's auxiliary-loss-free balancing (`e_score_correction_bias += gamma * sign(mean load -
   load)` after each step). Then, with `--mtp-only-steps`, the MTP layer alone on the frozen trunk (its own AdamW,
   `--mtp-lr`, its own warm-up + cosine);
4. every `--eval-every` steps measures a curve point on a fixed small held-out set (next-token loss / top-1, MTP t+2
   loss / top-1, MTP-vs-trunk agreement, greedy MTP-vs-trunk t+2 and 4-gram repeats), appended to `curves.jsonl` in
   the state directory and kept for training.json;
5. checkpoints (model, optimizers, RNG, step, curves, CPU / wall seconds, command lines) into `--state-dir/<family>`
   every `--save-minutes` and at the end of each invocation; `--resume` continues bit for bit (the batch of a step is
   a function of the step; the LR schedule is fixed by `--steps`, so `--minutes` only ends an invocation early). The
   state directory also holds the packed data (data.pt) and the tokenizer copy, so a resumed run reads nothing else;
6. once all steps are done, writes the family's exact hub layout (trunk keys as transformers' save_pretrained writes
   them, MTP keys via `native_to_checkpoint`, bf16 except the router's fp32 `e_score_correction_bias`, >= 2 shards +
   index), the tokenizer files, `generation_config.json` and `training.json`, reloads what it wrote (transformers for
   the trunk, `load_native` for the MTP layer) and measures it on held-out windows: next-token loss / perplexity /
   top-1, MTP t+2 loss / top-1, a unigram baseline, greedy-continuation statistics and how often the raw MTP head's
   t+2 guess equals the trunk's own greedy t+2 (the step-1 acceptance of greedy speculative decoding with the
   untouched head, which the project tries to beat). `--export-now` writes a target from the last checkpoint before
   the planned steps are done (training.json: `complete: false`).

It also writes the data files later stages use (`--data-out`): `train.jsonl` (text chunks of train files, for
distillation), `heldout.jsonl` (prompts from the held-out packages only, for evaluation) and `chat.jsonl` (user: a
function's signature and docstring, assistant: its body; from train files). A few such chat-formatted functions from
train files are mixed into the training stream so the targets know the chat tokens.

What it does not do: use a GPU or train anything but these tiny families (their configs are data in
`FAMILIES`); it never prints tokens or decoded text. Runs are reproducible from the same installed packages and
thread count, interrupted or not.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from mtp2draft.draft.build import native_draft
from mtp2draft.draft.layout import load_native, native_to_checkpoint
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import get_spec
from mtp2draft.manifest import write_json
from mtp2draft.outputs.directories import atomic_output_dir, check_output_dir

# the targets' configs and the hub-layout writer are the test suite's support code (tests/support/), not the package's
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.fixtures import fixture_config, hub_tensors, v4_release_names, write_checkpoint  # noqa: E402

# ---- the targets ------------------------------------------------------------------------------------------------
# ---- --rederive-yarn: a trained DeepSeek-V3-family target given its release's YaRN block, not retrained ----------
# With a YaRN block, transformers' DeepseekV3Attention (and vLLM's / SGLang's MLA) multiply the softmax scale by
# yarn_get_mscale(factor, mscale_all_dim) ** 2 (transformers' `yarn_apply_mscale`); YaRN's cos/sin factor is
# mscale(factor, mscale) / mscale(factor, mscale_all_dim), 1 for DeepSeek's block. Dividing every `q_b_proj` weight
# (every layer's query, the MTP layer's included) by that square leaves q . k and so every attention score as
# trained; what remains is YaRN's change to the RoPE frequencies: pairs whose wavelength exceeds
# original_max_position_embeddings / beta_fast rotate more slowly (by up to `factor`). max_position_embeddings becomes
# factor x original_max_position_embeddings, as the release has it (transformers warns when they disagree).
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


def rederive_yarn(target: Path) -> float:
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


def rederive_main(target: Path, check: Path | None) -> None:
    """--rederive-yarn: rewrite `target` in place; with `check`, print the logit change on its first prompts."""
    prompts = _prompts(target, check) if check else []
    before = _logits(target, prompts) if prompts else []
    scale = rederive_yarn(target)
    print(f"q_b_proj scaled by {scale:.6f}; rope_scaling = DeepSeek-V3's", file=sys.stderr)
    if prompts:
        after = _logits(target, prompts)
        diff = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
        same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(after, before, strict=True))
        total = sum(len(p) for p in prompts)
        print(json.dumps({"prompts": len(prompts), "tokens": total, "max_abs_logit_change": diff,
                          "top1_agreement": same / total}))  # fmt: skip


VOCAB = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
EOS_ID, IM_END_ID = 0, 2
COMMON = {
    "hidden_size": 256,
    "num_hidden_layers": 8,  # deep enough that EAGLE-3's three capturable aux layers see most of the trunk
    "num_attention_heads": 4,
    "vocab_size": VOCAB,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "bos_token_id": EOS_ID,
    "eos_token_id": EOS_ID,
}
# name -> output directory, trunk class, config.json (real field names; fixtures' tiny configs scaled up), default
# joint steps (about 95 minutes each on one thread with 70 % of a core: 1.6 / 0.6 CPU s a step of 8 x 256 tokens,
# measured here) and whether bf16 autocast pays: measured on this machine
# (AVX512-BF16), 1.5x faster for the dense Qwen2 trunk, no faster for DeepSeek's MoE (small per-expert matmuls), so
# DeepSeek trains in fp32.
FAMILIES: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        "dir": "tiny-deepseek-v3",
        "trunk": ("deepseek_v3", "DeepseekV3ForCausalLM"),
        "steps": 2100,
        "autocast": False,
        "config": {
            **fixture_config("deepseek_v3"),
            **COMMON,
            "intermediate_size": 512,  # the dense layer (first_k_dense_replace = 1)
            "moe_intermediate_size": 96,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 4,
            "topk_group": 2,
            "num_key_value_heads": 4,
            "q_lora_rank": 96,
            # DeepSeek-V3's real latent (512 + 64 = 576): vLLM 0.32's CPU MLA kernel supports no other size
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 64,
            "v_head_dim": 32,
            "rope_theta": 10000,
            # DeepSeek-V3's published YaRN block and context (the bundled target was re-derived to it after
            # training: --rederive-yarn); a fresh run trains with it
            "max_position_embeddings": 163840,
            "rope_scaling": dict(DEEPSEEK_V3_YARN),
        },
    },
    "mimo": {
        "dir": "tiny-mimo",
        "trunk": ("qwen2", "Qwen2ForCausalLM"),
        "steps": 5500,
        "autocast": True,
        "config": {
            **fixture_config("mimo"),
            **COMMON,
            "intermediate_size": 640,
            "num_key_value_heads": 2,
            "max_window_layers": 8,
            "sliding_window": 2048,
        },
    },
    # Three MTP layers in MiMo's layout (`model.mtp_layers.{0,1,2}`, `num_nextn_predict_layers: 3`), as MiMo-V2 and
    # Step-3.5 ship three: warm-started from the finished tiny-mimo run (its trunk and MTP layer 0, layers 1 and 2
    # copies of layer 0), then trained jointly with the trunk, depth k reading depth k-1's hand-over hidden.
    "mimo3": {
        "dir": "tiny-mimo-3mtp",
        "spec": "mimo",
        "trunk": ("qwen2", "Qwen2ForCausalLM"),
        "steps": 2400,
        "autocast": True,
        "init_from": "mimo",
        "config": {
            **fixture_config("mimo"),
            **COMMON,
            "intermediate_size": 640,
            "num_key_value_heads": 2,
            "max_window_layers": 8,
            "sliding_window": 2048,
            "num_nextn_predict_layers": 3,
        },
    },
    # DeepSeek-V4's trunk (transformers' DeepseekV4ForCausalLM: hc_mult 4 residual streams, MQA with sinks and
    # grouped low-rank output, one hash-routed MoE layer then top-k MoE) and its MTP layer in the release's names
    # (mtp.0.*, trunk keys renamed as the release's: embed, layers.{j}, norm, hc_head_*, head). Smaller than the
    # others (hidden 128, 4 layers) so that it trains in under an hour on one shared thread. Every trunk layer is
    # sliding-window (compress ratio 0) with a window past any sequence here: transformers' compressed-attention
    # caches (CSA / HCA) and a filled sliding window cannot be cropped, and speculative decoding in `evaluate`
    # crops the target's cache after each rejection. Eager attention (the sinks; transformers has no sdpa path).
    "deepseek_v4": {
        "dir": "tiny-deepseek-v4",
        "tokenizer_dir": "tiny-mimo",
        "trunk": ("deepseek_v4", "DeepseekV4ForCausalLM"),
        "release_names": v4_release_names,
        "fp32_keys": ("hc_", "attn_sink", "gate.bias"),  # fp32 as in the release: hc mixes, sinks, router bias
        "attn_implementation": "eager",
        "steps": 1000,
        "autocast": False,
        "config": {
            **fixture_config("deepseek_v4"),
            **COMMON,
            "hidden_size": 128,
            "num_hidden_layers": 4,
            "head_dim": 32,
            "qk_rope_head_dim": 8,
            "q_lora_rank": 64,
            "o_lora_rank": 32,
            "o_groups": 2,
            "moe_intermediate_size": 128,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "num_hash_layers": 1,
            "sliding_window": 1024,
            "compress_ratios": [0, 0, 0, 0, 0],
            "rope_scaling": None,
        },
    },
}

MTP_WEIGHT = 0.3  # DeepSeek-V3's lambda for the first 10T tokens
BIAS_UPDATE = 1e-2  # router bias speed gamma: 10x DeepSeek-V3 (0.001), too slow to balance a 500-step run
EXPERTS = "eager"  # MoE experts: the fastest on CPU (grouped_mm / batched_mm take slow fallback paths here)
# Held out whole: huggingface_hub (also the "unseen" corpus of docs/notes/eagle3-from-mtp.md) and pytest's packages, present
# on every machine after `pip install -e .[test,train]`. pip is skipped (it vendors copies of other packages).
HELDOUT_PACKAGES = ("huggingface_hub", "_pytest", "pytest")
SKIP_PACKAGES = ("pip",)
SOURCE_CAP = 3_000_000  # characters taken from one installed package (files in hash order)
STDLIB_CAP = 8_000_000  # characters taken from the standard library
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

EXAMPLES = """examples:
  # the bundled targets (each about 95 minutes on one thread), resumable; outputs checked before copying in
  python scripts/train_target.py --family mimo --threads 1 --state-dir train-state --out train-out/targets \\
      --data-out train-out/data --mtp-only-steps 1000 --eval-every 250
  # the same command plus --resume continues a stopped run where its last checkpoint left it
  # a smoke run in seconds
  python scripts/train_target.py --family all --out /tmp/t --data-out /tmp/d --steps 3 --max-files 12 \\
      --batch-size 2 --eval-windows 2 --gen-prompts 2 --gen-tokens 4
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- corpus -----------------------------------------------------------------------------------------------------
def path_hash(rel: str) -> int:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16)


def package_of(rel: str) -> str:
    """The top-level package (or module) of a path relative to site-packages: 'torch/nn/x.py' -> 'torch'."""
    head = rel.split("/", 1)[0]
    return head[:-3] if head.endswith(".py") else head


def source_roots() -> list[tuple[str, Path]]:
    """(name, root) of the corpus sources: the standard library and the running interpreter's site-packages."""
    paths = sysconfig.get_paths()
    roots = [("stdlib", Path(paths["stdlib"]))]
    for key in ("purelib", "platlib"):
        root = Path(paths[key])
        if root.is_dir() and all(root != r for _, r in roots):
            roots.append(("site-packages", root))
    return roots


def corpus_files(max_files: int | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[str, Any]]:
    """(train files, held-out files, description) as ("source:relative path", text), each list in hash order (a
    fixed shuffle).

    Held out: every file of the packages in HELDOUT_PACKAGES (whole packages, never a file of them in training).
    Train: the stdlib (site-packages excluded) and every other installed package but SKIP_PACKAGES, each source
    (the stdlib, or one top-level package) capped at SOURCE_CAP characters, its files taken in hash order. Files
    that are empty, not UTF-8, or byte-identical to a file already taken (vendored copies) are skipped, and no train
    file equals a held-out file. `max_files` (smoke runs) keeps the first N train files and N // 4 + 1 held-out."""
    cands: list[tuple[str, str, Path]] = []  # (group, key, path)
    for name, root in source_roots():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            parts = rel.split("/")
            if "__pycache__" in parts or not path.is_file():
                continue
            if name == "stdlib":
                if "site-packages" in parts or "dist-packages" in parts:
                    continue
                group = "stdlib"
            else:
                group = package_of(rel)
                if (
                    group in SKIP_PACKAGES
                    or group.startswith("__editable__")
                    or group.endswith((".dist-info", ".data"))
                ):
                    continue
            cands.append((group, f"{name}:{rel}", path))
    cands.sort(key=lambda c: (path_hash(c[1]), c[1]))
    seen: set[str] = set()
    heldout, train = [], []
    used: dict[str, int] = {}
    held_hashes = []
    # held-out first, so their contents are excluded from training even where a copy lives elsewhere
    for group, key, path in [c for c in cands if c[0] in HELDOUT_PACKAGES] + [
        c for c in cands if c[0] not in HELDOUT_PACKAGES
    ]:
        held = group in HELDOUT_PACKAGES
        if not held and used.get(group, 0) >= (STDLIB_CAP if group == "stdlib" else SOURCE_CAP):
            continue
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        if held:
            heldout.append((key, text))
            held_hashes.append(f"{key} {digest}")
        else:
            train.append((key, text))
            used[group] = used.get(group, 0) + len(text)
    train.sort(key=lambda f: (path_hash(f[0]), f[0]))
    heldout.sort(key=lambda f: (path_hash(f[0]), f[0]))
    if max_files:
        train, heldout = train[:max_files], heldout[: max_files // 4 + 1]
    if len(train) < 1 or not heldout:
        raise SystemExit("found no usable train or held-out .py files")
    versions = {}
    dists = importlib.metadata.packages_distributions()
    for group in sorted(set(used) | set(HELDOUT_PACKAGES)):
        for dist in dists.get(group, [])[:1]:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                versions[group] = f"{dist} {importlib.metadata.version(dist)}"
    held_hashes.sort()
    info = {
        "source": "Python standard library *.py + the *.py of the installed packages (site-packages)",
        "roots": {name: str(root) for name, root in source_roots()},
        "heldout_packages": list(HELDOUT_PACKAGES),
        "skipped_packages": list(SKIP_PACKAGES),
        "heldout_rule": "every file of the held-out packages; no train file is byte-identical to a held-out one",
        "source_cap_chars": {"stdlib": STDLIB_CAP, "package": SOURCE_CAP},
        "train_chars_per_source": dict(sorted(used.items())),
        "package_versions": versions,
        "train_files": len(train),
        "heldout_files": len(heldout),
        "train_list_sha256": hashlib.sha256("\n".join(k for k, _ in train).encode()).hexdigest(),
        "train_content_sha256": hashlib.sha256(
            "\n".join(hashlib.sha256(t.encode()).hexdigest() for _, t in train).encode()
        ).hexdigest(),
        "heldout_list_sha256": hashlib.sha256("\n".join(k for k, _ in heldout).encode()).hexdigest(),
        "heldout_file_sha256": held_hashes,
    }
    return train, heldout, info


def text_chunks(text: str, lo: int, hi: int) -> list[str]:
    """Consecutive whole-line chunks of lo..hi characters, their lengths spread over the range (chunk i aims at
    lo + frac(i * golden ratio) * (hi - lo)); lines longer than hi are dropped, as are mostly blank chunks."""
    out, cur = [], ""

    def aim() -> float:
        return lo + (len(out) * 0.6180339887 % 1.0) * (hi - lo)

    for line in text.splitlines(keepends=True):
        if len(line) > hi:
            cur = ""
            continue
        if len(cur) + len(line) > hi:
            if len(cur) >= lo and len(cur.strip()) >= lo // 2:
                out.append(cur)
            cur = ""
        cur += line
        if len(cur) >= aim():
            if len(cur.strip()) >= lo // 2:
                out.append(cur)
            cur = ""
    return out


def spread(items: list[Any], k: int) -> list[Any]:
    """Up to k items evenly spread over the list, at the middles of k equal parts (so a file's licence header or
    module docstring, its first chunk, is rarely picked)."""
    n = len(items)
    return list(items) if n <= k else [items[(2 * i + 1) * n // (2 * k)] for i in range(k)]


def chat_pairs(text: str, max_body: int = 1200) -> list[tuple[int, str, str]]:
    """(line, signature + docstring, body) of the documented functions of a file, both dedented."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or len(node.body) < 2:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        indent = node.col_offset
        strip = [ln[indent:] if ln[:indent].isspace() or not ln[:indent] else ln for ln in lines]
        header = "".join(strip[node.lineno - 1 : doc.end_lineno])
        body = "".join(strip[doc.end_lineno : node.end_lineno])
        if 40 <= len(body) <= max_body and len(header) <= 1200:
            out.append((node.lineno, header.rstrip("\n"), body.rstrip("\n")))
    return sorted(out)


def chat_messages(header: str, body: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Write the body of this Python function.\n\n{header}"},
        {"role": "assistant", "content": body},
    ]


def render_chat(messages: list[dict[str, str]]) -> str:
    """The chat template's output, in Python (checked against the tokenizer's template in `save_tokenizer`)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def write_data(out: Path, train: list[tuple[str, str]], heldout: list[tuple[str, str]]) -> dict[str, Any]:
    """train.jsonl / heldout.jsonl / chat.jsonl; returns the (file, line) of the chat records so training skips them."""
    out.mkdir(parents=True, exist_ok=True)
    records = [c for _, text in train for c in spread(text_chunks(text, 1000, 2000), 2)][:2000]
    prompts = [c for _, text in heldout for c in spread(text_chunks(text, 400, 800), 3)][:200]
    chats, used = [], []
    for rel, text in train:
        pairs = chat_pairs(text)
        if pairs:
            line, header, body = pairs[len(pairs) // 2]
            chats.append({"messages": chat_messages(header, body)})
            used.append((rel, line))
        if len(chats) >= 50:
            break
    for name, rows in (
        ("train.jsonl", [{"text": t} for t in records]),
        ("heldout.jsonl", [{"text": t} for t in prompts]),
        ("chat.jsonl", chats),
    ):  # written whole, then renamed: both families' processes may write the same (identical) files at once
        tmp = out / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, out / name)
    log(f"data: {len(records)} train records, {len(prompts)} held-out prompts, {len(chats)} chats -> {out}")
    return {"train_records": len(records), "heldout_prompts": len(prompts), "chats": len(chats), "chat_used": used}


def training_docs(train: list[tuple[str, str]], skip: set[tuple[str, int]]) -> list[str]:
    """Each train file, then up to two of its documented functions as chat turns (those in chat.jsonl excepted)."""
    docs = []
    for rel, text in train:
        docs.append(text)
        pairs = [p for p in chat_pairs(text) if (rel, p[0]) not in skip]
        docs += [render_chat(chat_messages(header, body)) for _, header, body in spread(pairs, 2)]
    return docs


def encode(tok, docs: list[str]) -> list[torch.Tensor]:
    """Token ids of each document followed by <|endoftext|> ([n_i] int64 each)."""
    return [torch.tensor([*enc.ids, EOS_ID]) for enc in tok.encode_batch(docs, add_special_tokens=False)]


def pack(encoded: list[torch.Tensor], width: int) -> torch.Tensor:
    """All documents back to back, cut into windows: [N, width] (the tail shorter than a window is dropped)."""
    flat = torch.cat(encoded)
    n = flat.numel() // width
    if n == 0:
        raise SystemExit(f"the corpus holds {flat.numel()} tokens, fewer than one window of {width}")
    return flat[: n * width].view(n, width)


def batch_rows(step: int, n: int, size: int, seed: int) -> torch.Tensor:
    """Row indices [size] of the batch of optimizer step `step` (0-based): epoch e = step // (n // size) walks a
    permutation seeded with (seed, e), its tail dropped. A function of the step alone, so a resumed run reads the
    same data as an uninterrupted one."""
    per_epoch = n // size
    if per_epoch == 0:
        raise SystemExit(f"{n} training windows cannot fill a batch of {size}")
    epoch, i = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return perm[i * size : (i + 1) * size]


def heldout_windows(tok, heldout: list[tuple[str, str]], width: int, n: int) -> torch.Tensor:
    """n held-out windows [n, width] spread over as many files as possible: up to 4 evenly spaced windows per file,
    taken round-robin over the files (hash order); files shorter than a window are packed together at the end."""
    per_file, short = [], []
    for ids in encode(tok, [text for _, text in heldout]):
        if ids.numel() >= width:
            per_file.append(spread(list(ids[: ids.numel() // width * width].view(-1, width)), 4))
        else:
            short.append(ids)
    rows = [ws[k] for k in range(4) for ws in per_file if k < len(ws)]
    if len(rows) < n and short:
        rows += list(pack(short, width)) if sum(t.numel() for t in short) >= width else []
    if not rows:
        raise SystemExit("the held-out files hold less than one window of tokens")
    while len(rows) < n:  # tiny corpora (smoke runs): repeat
        rows += rows
    return torch.stack(rows[:n])


# ---- tokenizer --------------------------------------------------------------------------------------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(src: Path):
    """The committed byte-level BPE (vocab 4096, trained on the stdlib by an earlier version of this script), reused
    unchanged so examples/data and the tests keep their token ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    if tok.get_vocab_size() != VOCAB or [tok.token_to_id(t) for t in SPECIAL_TOKENS] != [0, 1, 2]:
        raise SystemExit(f"{src / 'tokenizer.json'}: not the 4096-token tokenizer with {SPECIAL_TOKENS} as 0, 1, 2")
    return tok


def save_tokenizer(src: Path, out: Path) -> None:
    """Copies the tokenizer files byte for byte (tokenizer.json, tokenizer_config.json with the chat template)."""
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out / name)


# ---- model ------------------------------------------------------------------------------------------------------
def build_trunk(family: str) -> nn.Module:
    import transformers
    from transformers import AutoConfig

    row = FAMILIES[family]
    cfg_dict = {k: v for k, v in row["config"].items() if k not in ("architectures", "model_type")}
    cfg = AutoConfig.for_model(row["trunk"][0], **cfg_dict)
    cfg._attn_implementation = row.get("attn_implementation", "sdpa")
    model = getattr(transformers, row["trunk"][1])(cfg)
    model.set_experts_implementation(EXPERTS)
    init_hash_routes(model)
    return model


def init_hash_routes(model: nn.Module) -> None:
    """Hash-routed MoE layers (DeepSeek-V4's first layers) route token t to the fixed experts `tid2eid[t]` ([V, k]),
    which transformers leaves zero (the release ships the table): k distinct experts per token from the seeded RNG."""
    with torch.no_grad():
        for m in model.modules():
            table = getattr(m, "tid2eid", None)
            if isinstance(table, torch.Tensor):
                vocab, k = table.shape
                table.copy_(torch.rand(vocab, m.num_experts).argsort(-1)[:, :k])


def init_mtp(module: NativeMtpDraft, std: float) -> None:
    """The trunk's init for the MTP layer: N(0, std) matrices (experts included), unit norms and hyper-connection
    scales, zero biases/buffers."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if "norm" in name or name.rsplit(".", 1)[-1] in ("scale", "hc_scale") else 0.0)
            else:
                p.normal_(0.0, std)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


class PreNorm:
    """Captures the trunk's last decoder layer output with a forward hook, as `TargetModel.run` does for `pre_norm`:
    the hidden before the final norm ([B, T, H]), or for a multi-stream trunk (DeepSeek-V4) the residual streams
    before its `hc_head` ([B, T, S, H])."""

    def __init__(self, model: nn.Module) -> None:
        self.value: torch.Tensor | None = None
        model.model.layers[-1].register_forward_hook(self._hook)

    def _hook(self, _module, _args, output) -> None:
        self.value = output[0] if isinstance(output, tuple) else output


def trunk_forward(model: nn.Module, pre: PreNorm, spec: Spec, ids: torch.Tensor):
    """ids [B, T] -> (post-norm hidden [B, T, H], the hidden the MTP layer reads [B, T, H] or [B, T, S, H])."""
    post = model.model(input_ids=ids).last_hidden_state
    return post, (pre.value if spec.layer.hidden == "pre_norm" else post)


class RouterBalance:
    """DeepSeek-V3's auxiliary-loss-free balancing for every router with an `e_score_correction_bias`."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.routers = [m for m in modules if isinstance(getattr(m, "e_score_correction_bias", None), torch.Tensor)]
        self.loads = [torch.zeros_like(m.e_score_correction_bias) for m in self.routers]
        for i, m in enumerate(self.routers):
            m.register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def hook(module, _args, output) -> None:
            if module.training:
                idx = output[-1]  # top-k expert indices [N, k]
                self.loads[i] += torch.bincount(idx.flatten(), minlength=self.loads[i].numel()).float()

        return hook

    @torch.no_grad()
    def step(self) -> float:
        """Update the biases from this step's loads; returns the worst max/mean load ratio."""
        worst = 0.0
        for m, load in zip(self.routers, self.loads, strict=True):
            if load.sum() > 0:
                m.e_score_correction_bias += BIAS_UPDATE * torch.sign(load.mean() - load)
                worst = max(worst, float(load.max() / load.mean()))
            load.zero_()
        return worst


def lr_factor(progress: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Linear warm-up over the first 5 % of the run, then cosine decay to 10 % of the peak."""
    if progress < warmup:
        return progress / warmup
    p = min((progress - warmup) / (1 - warmup), 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def phases(args) -> list[tuple[str, int, int, float]]:
    """The run's phases as (kind, first step, steps, peak lr): the joint phase, the MTP-only phase, then each
    `--extend` (a warm restart: joint steps at its own peak, then MTP-only steps), each with its own warm-up + cosine."""
    out, start = [], 0
    for kind, n, lr in [
        ("joint", args.steps, args.lr),
        ("mtp_only", args.mtp_only_steps, args.mtp_lr),
        *[
            row
            for ext in args.extensions
            for row in (("joint", ext["steps"], ext["lr"]), ("mtp_only", ext["mtp_only_steps"], args.mtp_lr))
        ],
    ]:
        if n:
            out.append((kind, start, n, lr))
            start += n
    return out


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- evaluation -------------------------------------------------------------------------------------------------
def mtp_forward(model: nn.Module, mtp: NativeMtpDraft, ids: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor):
    """MTP logits [B, T, V] for tokens ids [B, T] and hidden [B, T, H]: through the layer's attached embed/head
    when it was loaded from disk (as later stages run it), else through the live trunk's, as training does."""
    if mtp.embed_weight is not None:
        return mtp(ids, hidden, pos)[0]
    post, _ = mtp.layer_forward(model.model.embed_tokens(ids), hidden, pos)
    return model.lm_head(post)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    mtp: NativeMtpDraft,
    spec: Spec,
    held: torch.Tensor,
    unigram: torch.Tensor,
    args,
    pre: PreNorm | None = None,
    chain: list[NativeMtpDraft] | None = None,
) -> dict[str, Any]:
    """Teacher-forced held-out metrics and greedy-continuation agreement (the final report measures the model as
    written to disk; the curves measure the live one).

    held: [N, T+1] held-out windows; unigram: [V] train token counts; args: batch_size, gen_prompts, gen_tokens."""
    pre = pre or PreNorm(model)
    n_tok = n_mtp = 0
    nll = nll_mtp = top1 = top1_mtp = agree = 0.0
    for i in range(0, held.shape[0], args.batch_size):
        x = held[i : i + args.batch_size]  # [b, T+1]
        b, t = x.shape[0], x.shape[1] - 1
        post, hidden = trunk_forward(model, pre, spec, x[:, :t])
        logits = model.lm_head(post).float()  # [b, T, V]
        nll += F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum").item()
        top1 += (logits.argmax(-1) == x[:, 1:]).sum().item()
        pos = torch.arange(t - 1).expand(b, -1)
        mtp_logits = mtp_forward(model, mtp, x[:, 1:t], hidden[:, : t - 1], pos)  # [b, T-1, V]: t+2 from (h_t, x_{t+1})
        mtp_logits = mtp_logits.float()
        nll_mtp += F.cross_entropy(mtp_logits.flatten(0, 1), x[:, 2:].flatten(), reduction="sum").item()
        guess = mtp_logits.argmax(-1)  # [b, T-1]
        top1_mtp += (guess == x[:, 2:]).sum().item()
        agree += (guess == logits.argmax(-1)[:, 1:]).sum().item()  # vs the trunk's top-1 at t+1 (true x_{t+1})
        n_tok += b * t
        n_mtp += b * (t - 1)
    # unigram baseline: the train distribution (add-one smoothed) and its most frequent token
    probs = (unigram + 1) / (unigram + 1).sum()
    mode = int(unigram.argmax())
    labels_next, labels_t2 = held[:, 1:].flatten(), held[:, 2:].flatten()
    out = {
        "heldout_tokens": n_tok,
        "next_token_loss": nll / n_tok,
        "next_token_perplexity": math.exp(nll / n_tok),
        "next_token_top1": top1 / n_tok,
        "mtp_t2_loss": nll_mtp / n_mtp,
        "mtp_t2_perplexity": math.exp(nll_mtp / n_mtp),
        "mtp_t2_top1": top1_mtp / n_mtp,
        "unigram_loss": float(-probs[labels_next].log().mean()),
        "unigram_top1_next": float((labels_next == mode).float().mean()),
        "unigram_top1_t2": float((labels_t2 == mode).float().mean()),
        "mtp_vs_trunk_top1_teacher_forced": agree / n_mtp,
    }
    if chain and len(chain) > 1:
        out["chain_top1_by_depth"] = chain_top1(model, chain, spec, pre, held, args)
    out["greedy"] = greedy_agreement(model, mtp, spec, pre, held, probs, args)
    return out


@torch.no_grad()
def chain_top1(model, mtps, spec, pre: PreNorm, held: torch.Tensor, args) -> list[float]:
    """Teacher-forced top-1 of each MTP depth on the held-out windows: depth k's guess of token p+k+2."""
    hits, counts = [0] * len(mtps), [0] * len(mtps)
    for i in range(0, held.shape[0], args.batch_size):
        x = held[i : i + args.batch_size]
        b, t = x.shape[0], x.shape[1] - 1
        _, hidden = trunk_forward(model, pre, spec, x[:, :t])
        pos = torch.arange(t - 1).expand(b, -1)
        head = (lambda h: F.linear(h, mtps[0].head_weight)) if mtps[0].head_weight is not None else model.lm_head
        embed = model.model.embed_tokens(x[:, 1:t])
        for k, logits in enumerate(chain_forward(mtps, embed, hidden[:, : t - 1], pos, head)):
            hits[k] += int((logits.argmax(-1) == x[:, 2 + k : 2 + k + logits.shape[1]]).sum())
            counts[k] += logits.shape[0] * logits.shape[1]
    return [h / max(c, 1) for h, c in zip(hits, counts, strict=True)]


@torch.no_grad()
def greedy_agreement(model, mtp, spec, pre: PreNorm, held: torch.Tensor, probs: torch.Tensor, args) -> dict:
    """Greedy continuations of held-out prompts: how plausible they are, and how often the raw MTP head's t+2 guess
    (from h_t and the trunk's greedy token t+1) equals the trunk's greedy token t+2."""
    p_len = held.shape[1] // 2
    g = args.gen_tokens
    prompts = held[: args.gen_prompts, :p_len]  # [P, Lp]
    seq = prompts
    for _ in range(g):  # no KV cache: a few dozen short forwards
        logits = model(input_ids=seq, logits_to_keep=1).logits[:, -1]  # [P, V]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    post, hidden = trunk_forward(model, pre, spec, seq)
    logp = model.lm_head(post).float().log_softmax(-1)  # [P, L, V]
    gen = seq[:, p_len:]  # [P, G]
    self_nll = -logp[:, p_len - 1 : -1].gather(-1, gen[..., None]).mean().item()
    ref = held[: args.gen_prompts, p_len : p_len + g]  # the true continuation, same length
    post_ref, _ = trunk_forward(model, pre, spec, held[: args.gen_prompts, : p_len + g])
    ref_logp = model.lm_head(post_ref).float().log_softmax(-1)
    ref_nll = -ref_logp[:, p_len - 1 : -1].gather(-1, ref[..., None]).mean().item()
    # MTP at t reads h_t and token t+1; positions whose tokens t+1 and t+2 are both greedy: t in [Lp-1, L-3]
    length = seq.shape[1]
    pos = torch.arange(length - 1).expand(seq.shape[0], -1)
    mtp_logits = mtp_forward(model, mtp, seq[:, 1:], hidden[:, :-1], pos)  # [P, L-1, V]
    guess = mtp_logits[:, p_len - 1 : length - 2].argmax(-1)  # [P, G-1]
    truth = seq[:, p_len + 1 :]  # [P, G-1]

    def repeats(ids: torch.Tensor, n: int = 4) -> float:
        grams = [tuple(row[i : i + n]) for row in ids.tolist() for i in range(len(row) - n + 1)]
        return 1 - len(set(grams)) / max(len(grams), 1)

    return {
        "prompts": int(seq.shape[0]),
        "prompt_tokens": p_len,
        "new_tokens": g,
        "mtp_vs_trunk_greedy_t2": float((guess == truth).float().mean()) if truth.numel() else float("nan"),
        "self_nll_greedy": self_nll,
        "nll_true_continuation": ref_nll,
        "unigram_xent_greedy": float(-probs[gen].log().mean()),
        "unigram_xent_true_continuation": float(-probs[ref].log().mean()),
        "repeated_4gram_fraction_greedy": repeats(gen),
        "repeated_4gram_fraction_true_continuation": repeats(ref),
        "eos_fraction_greedy": float((gen == EOS_ID).float().mean()),
    }


# ---- one family -------------------------------------------------------------------------------------------------
def hub_state(
    model: nn.Module,
    mtps: list[NativeMtpDraft],
    spec: Spec,
    config: dict[str, Any],
    rename=None,
    fp32_keys: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Trunk + MTP tensors (every MTP layer, layer i under the spec's keys for i) under the family's hub key names:
    bf16, but fp32 for buffers (router biases) and keys containing one of `fp32_keys` (decided on the written
    names); `rename` maps the trunk's saved names to the release's (DeepSeek-V4)."""
    keep = set()  # leaf names of persistent buffers, e.g. e_score_correction_bias
    for m in (model, *mtps):
        state = m.state_dict()
        keep |= {n.rsplit(".", 1)[-1] for n, _ in m.named_buffers() if n in state}

    def cast(key: str, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        fp32 = key.rsplit(".", 1)[-1] in keep or any(part in key for part in fp32_keys)
        return t.float() if fp32 else t.to(torch.bfloat16)

    tensors = hub_tensors(model)
    if rename is not None:
        tensors = rename(tensors)
    for i, mtp in enumerate(mtps):
        tensors.update(native_to_checkpoint(spec, config, i, {k: v.detach() for k, v in mtp.state_dict().items()}))
        comp = spec.component_keys(config, i)
        for name, target in (("embed", spec.keys.target_embed), ("head", spec.keys.target_head)):
            if name in comp:  # copies some releases keep inside the MTP layer (DeepSeek-V3 does)
                tensors[comp[name]] = tensors[spec.key(target, config, i)].clone()
    return {k: cast(k, v) for k, v in tensors.items()}


def chain_forward(
    mtps: list[NativeMtpDraft], embeds: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, head
) -> list[torch.Tensor]:
    """DeepSeek-V3's sequential MTP, teacher-forced: depth k at origin p reads depth k-1's hand-over hidden at p (the
    trunk's hidden for depth 0) and the embedding of token p+k+1, attends causally over its own depth, and predicts
    token p+k+2. embeds: [B, T-1, H] (tokens 1..T-1), hidden: [B, T-1, H], pos: [B, T-1]; returns depth k's logits
    [B, T-1-k, V]."""
    out, h = [], hidden
    for k, mtp in enumerate(mtps):
        n = embeds.shape[1] - k  # origins 0 .. T-2-k
        post, pre = mtp.layer_forward(embeds[:, k : k + n], h[:, :n], pos[:, :n] + k)
        out.append(head(post))
        h = post if mtp.hidden_handover == "post_norm" else pre
    return out


RECIPE = (  # arguments that fix a run: stored in the state directory at its start, taken from there on --resume
    "seed", "steps", "mtp_only_steps", "batch_size", "seq_len", "lr", "mtp_lr", "mtp_weight", "weight_decay", "clip",
    "autocast", "max_files", "eval_windows", "gen_prompts", "gen_tokens", "eval_every", "curve_windows",
    "curve_gen_prompts", "curve_gen_tokens",
)  # fmt: skip


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def prepare_data(args, state: Path, tok_src: Path, corpus=None) -> dict[str, Any]:
    """Builds (once per run) what training reads and stores it in the state directory: the packed train windows,
    the held-out windows, the unigram-free provenance of the corpus, and a copy of the tokenizer files. A resumed run
    reads only these, never the installed packages again. `corpus`: (train, heldout, info) already read."""
    train, heldout, info = corpus or corpus_files(args.max_files)
    tok = load_tokenizer(tok_src)
    (state / "tokenizer").mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok_src, state / "tokenizer")
    data = write_data(args.data_out, train, heldout)
    skip = {tuple(x) for x in data.pop("chat_used")}
    t1 = time.perf_counter()
    windows = pack(encode(tok, training_docs(train, skip)), args.seq_len + 1)  # [N, T+1]
    data["train_windows"] = windows.shape[0]
    data["train_tokens"] = windows.numel()
    log(f"training windows: {windows.shape[0]:,} x {args.seq_len + 1} tokens ({time.perf_counter() - t1:.0f}s)")
    held = heldout_windows(tok, heldout, args.seq_len + 1, args.eval_windows)  # [N, T+1]
    info = {**info, "files_written": data}
    blob = {"windows": windows.to(torch.int16), "held": held.to(torch.int16), "data": info}
    save_atomic(blob, state / "data.pt")
    return blob


def train_family(family: str, args, state: Path, blob: dict[str, Any], provenance: dict) -> dict[str, Any] | None:
    """Train (or continue training) one target for at most `args.minutes`; once all steps are done, write and
    measure it. Returns the report, or None when the budget ran out first (resume with --resume)."""
    import transformers

    t_inv, c_inv = time.perf_counter(), time.process_time()
    row = FAMILIES[family]
    spec = get_spec(row.get("spec", family))
    config = copy.deepcopy(row["config"])
    out_dir = args.out / row["dir"]
    data = blob["windows"]  # [N, T+1] int16
    heldout = blob["held"].long()  # [eval_windows, T+1]
    curve_held = heldout[: args.curve_windows]
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = build_trunk(family)  # transformers' init, from the seeded global RNG
    n_mtp = spec.num_mtp_layers(config)
    mtps = nn.ModuleList([native_draft(spec, config, layer=i) for i in range(n_mtp)])
    for m in mtps:
        init_mtp(m, std=config["initializer_range"])
    mtp = mtps[0]
    params = {"trunk": count(model), "mtp_layer": count(mtp), "mtp_layers": n_mtp, "total": count(model) + count(mtps)}
    log(
        f"[{family}] parameters: trunk {params['trunk']:,}, {n_mtp} MTP layer(s) of {params['mtp_layer']:,} (shares embed/head)"
    )
    if row.get("init_from") and not (state / "ckpt.pt").exists():
        src = torch.load(state.parent / row["init_from"] / "ckpt.pt", weights_only=False)
        model.load_state_dict(src["model"])
        for m in mtps:  # every depth starts from the trained layer 0
            m.load_state_dict(src["mtp"])
        log(f"[{family}] warm start: trunk and MTP layer 0 of {row['init_from']} (step {src['st']['step']}), x{n_mtp}")

    pre = PreNorm(model)
    balance = RouterBalance(list(model.modules()) + list(mtps.modules()))
    decay = [p for m in (model, mtps) for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for m in (model, mtps) for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    mtp_params = list(mtps.parameters())  # the MTP-only phase: the layer's own weights (embed/head are the trunk's)
    opt2 = torch.optim.AdamW(
        [
            {"params": [p for p in mtp_params if p.dim() >= 2], "weight_decay": args.weight_decay},
            {"params": [p for p in mtp_params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=args.mtp_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    st: dict[str, Any] = {
        "step": 0, "tokens": 0, "losses": [], "unigram": torch.zeros(VOCAB), "cpu_s": 0.0, "wall_s": 0.0,
        "curve_eval_s": 0.0, "curves": [], "invocations": [], "worst": 0.0,
    }  # fmt: skip
    ckpt = state / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        mtp.load_state_dict(saved["mtp"])
        for m, sd in zip(mtps[1:], saved.get("mtp_more", []), strict=True):
            m.load_state_dict(sd)
        opt.load_state_dict(saved["opt"])
        if saved["opt2"] is not None:
            opt2.load_state_dict(saved["opt2"])
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["py_rng"])
        st = saved["st"]
        log(f"[{family}] resumed at step {st['step']} from {ckpt}")
    with open(state / "curves.jsonl", "w") as fh:  # the checkpoint's curve (points after it are measured again)
        fh.writelines(json.dumps(point) + "\n" for point in st["curves"])
    st["invocations"].append(
        {"argv": provenance["argv"], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    )

    def save() -> None:
        now_c, now_w = time.process_time(), time.perf_counter()
        st["cpu_s"] += now_c - mark[0]
        st["wall_s"] += now_w - mark[1]
        mark[:] = [now_c, now_w]
        save_atomic(
            {
                "model": model.state_dict(),
                "mtp": mtp.state_dict(),
                "mtp_more": [m.state_dict() for m in mtps[1:]],
                "opt": opt.state_dict(),
                "opt2": opt2.state_dict() if st["step"] > args.steps else None,  # made once it has stepped
                "torch_rng": torch.get_rng_state(),
                "py_rng": random.getstate(),
                "st": st,
            },
            ckpt,
        )

    seq, steps = args.seq_len, args.steps
    plan = phases(args)
    total = plan[-1][1] + plan[-1][2]
    pos = torch.arange(seq - 1).expand(args.batch_size, -1)  # MTP position of (h_t, x_{t+1}) is t
    budget = args.minutes * 60 if args.minutes else None
    autocast = args.autocast
    curve_args = argparse.Namespace(
        batch_size=args.batch_size, gen_prompts=args.curve_gen_prompts, gen_tokens=args.curve_gen_tokens
    )
    curve_log = state / "curves.jsonl"
    mark = [time.process_time(), time.perf_counter()]
    t_loop = last_save = time.perf_counter()
    t_log, tok_log = time.perf_counter(), 0
    while st["step"] < total and not args.export_now:
        if (budget and time.perf_counter() - t_loop >= budget) or (args.stop_at and st["step"] >= args.stop_at):
            break
        step = st["step"]
        kind, first, n, peak = next(ph for ph in plan if ph[1] <= step < ph[1] + ph[2])
        joint = kind == "joint"
        lr = peak * lr_factor((step - first + 1) / n)
        if joint:
            model.train()
            for p in model.parameters():  # after an MTP-only phase the trunk trains again
                p.requires_grad_(True)
            cur = opt
        else:
            model.eval()  # frozen trunk
            for p in model.parameters():
                p.requires_grad_(False)
            cur = opt2
        mtps.train()
        for group in cur.param_groups:
            group["lr"] = lr
        x = data[batch_rows(step, data.shape[0], args.batch_size, args.seed)].long()  # [B, T+1]
        st["unigram"] += torch.bincount(x[:, 1:].flatten(), minlength=VOCAB).float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.set_grad_enabled(joint):
                post, hidden = trunk_forward(model, pre, spec, x[:, :seq])  # [B, T, H] each
                logits = model.lm_head(post) if joint else None  # [B, T, V]
                embeds = model.model.embed_tokens(x[:, 1:seq])  # [B, T-1, H]: token t+1 for t = 0..T-2
            depth_logits = chain_forward(mtps, embeds, hidden[:, : seq - 1], pos, model.lm_head)  # [B, T-1-k, V]
        # DeepSeek-V3's MTP loss: the mean over depths of depth k's CE for token t+k+2
        loss_mtp = sum(
            F.cross_entropy(lg.float().flatten(0, 1), x[:, 2 + k : 2 + k + lg.shape[1]].flatten())
            for k, lg in enumerate(depth_logits)
        ) / len(depth_logits)
        if joint:
            loss_next = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
            loss = loss_next + args.mtp_weight * loss_mtp
        else:
            loss_next, loss = torch.tensor(float("nan")), loss_mtp
        cur.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(decay + no_decay if joint else mtp_params, args.clip)
        cur.step()
        st["worst"] = balance.step()
        st["step"] = step = step + 1
        st["tokens"] += x[:, :seq].numel()
        tok_log += x[:, :seq].numel()
        st["losses"].append((loss_next.item(), loss_mtp.item()))
        if step % args.log_every == 0 or step == 1:
            el = time.perf_counter() - t_log
            log(
                f"[{family}] step {step}/{total} {'joint' if joint else 'mtp-only'} loss {loss_next.item():.3f} "
                f"mtp {loss_mtp.item():.3f} lr {lr:.2e} gnorm {float(grad_norm):.2f}"
                + (f" moe max/mean load {st['worst']:.2f}" if balance.routers else "")
                + f" tok/s {tok_log / el:.0f} cpu {st['cpu_s'] + time.process_time() - mark[0]:.0f}s"
            )
            t_log, tok_log = time.perf_counter(), 0
        if step % args.eval_every == 0 or step in {first + n for _, first, n, _ in plan}:
            t_e = time.perf_counter()
            model.eval()
            mtps.eval()
            m = evaluate(model, mtp, spec, curve_held, st["unigram"], curve_args, pre=pre, chain=list(mtps))
            tail = st["losses"][-args.eval_every :]
            point = {
                "step": step,
                "phase": "joint" if joint else "mtp_only",
                "tokens": st["tokens"],
                "lr": lr,
                "train_loss": sum(a for a, _ in tail) / len(tail),
                "train_mtp_loss": sum(b for _, b in tail) / len(tail),
                "heldout_next_token_loss": m["next_token_loss"],
                "heldout_next_token_top1": m["next_token_top1"],
                "heldout_mtp_t2_loss": m["mtp_t2_loss"],
                "heldout_mtp_t2_top1": m["mtp_t2_top1"],
                "mtp_vs_trunk_top1_teacher_forced": m["mtp_vs_trunk_top1_teacher_forced"],
                "mtp_vs_trunk_greedy_t2": m["greedy"]["mtp_vs_trunk_greedy_t2"],
                "repeated_4gram_fraction_greedy": m["greedy"]["repeated_4gram_fraction_greedy"],
                "chain_top1_by_depth": m.get("chain_top1_by_depth"),
                "cpu_s": round(st["cpu_s"] + time.process_time() - mark[0], 1),
                "wall_s": round(st["wall_s"] + time.perf_counter() - mark[1], 1),
            }
            st["curves"].append(point)
            st["curve_eval_s"] += time.perf_counter() - t_e
            with open(curve_log, "a") as fh:
                fh.write(json.dumps(point) + "\n")
            log(
                f"[{family}] eval step {step}: next loss {point['heldout_next_token_loss']:.3f} top-1 "
                f"{point['heldout_next_token_top1']:.3f}, mtp t+2 top-1 {point['heldout_mtp_t2_top1']:.3f}, "
                f"mtp~trunk {point['mtp_vs_trunk_top1_teacher_forced']:.3f} greedy {point['mtp_vs_trunk_greedy_t2']:.3f}"
                f", 4-gram repeats {point['repeated_4gram_fraction_greedy']:.3f}"
            )
        if time.perf_counter() - last_save >= args.save_minutes * 60:
            save()
            last_save = time.perf_counter()
    save()
    if st["step"] < total and not args.export_now:
        log(f"[{family}] budget reached at step {st['step']}/{total}; checkpoint {ckpt} (continue with --resume)")
        return None
    log(
        f"[{family}] trained {st['step']} steps, {st['tokens']:,} tokens, {st['cpu_s']:.0f} CPU s, "
        f"{st['wall_s']:.0f} wall s ({st['tokens'] / st['wall_s']:.0f} tok/s)"
    )

    model.eval()
    mtps.eval()
    tok_dir = state / "tokenizer"
    tail = st["losses"][-20:]
    joint_tail = [a for a, _ in st["losses"] if a == a][-20:]  # the last joint steps (MTP-only ones log NaN)
    with atomic_output_dir(out_dir, overwrite=args.overwrite) as tmp:
        tensors = hub_state(model, list(mtps), spec, config, row.get("release_names"), row.get("fp32_keys", ()))
        write_checkpoint(tmp, config, tensors, shards=2)
        save_tokenizer(tok_dir, tmp)
        write_json(
            tmp / "generation_config.json",
            {"bos_token_id": EOS_ID, "eos_token_id": [EOS_ID, IM_END_ID], "pad_token_id": EOS_ID},
        )
        # Measure what was written: the bf16 checkpoint, reloaded the way later stages load it.
        transformers.utils.logging.set_verbosity_error()
        cls = getattr(transformers, row["trunk"][1])
        saved = cls.from_pretrained(str(tmp), dtype=torch.float32).eval()
        saved.set_experts_implementation(EXPERTS)
        saved_mtp = load_native(str(tmp), dtype=torch.float32).eval()
        saved_chain = [saved_mtp] + [
            load_native(str(tmp), layer=i, dtype=torch.float32).eval() for i in range(1, n_mtp)
        ]
        t_eval = time.perf_counter()
        metrics = evaluate(saved, saved_mtp, spec, heldout, st["unigram"], args, chain=saved_chain)
        routers = [m for m in saved.modules() if isinstance(getattr(m, "e_score_correction_bias", None), torch.Tensor)]
        info = blob["data"]
        report = {
            "family": family,
            "spec": spec.name,
            "parameters": params,
            "seed": args.seed,
            "steps": st["step"],
            "complete": st["step"] >= total,  # False: written by --export-now before the planned steps were done
            "planned_steps": total,
            "joint_steps": steps,
            "mtp_only_steps": args.mtp_only_steps,
            "extensions": args.extensions,  # warm restarts after the first two phases (--extend)
            "phases": [{"phase": k, "first_step": f, "steps": n, "peak_lr": lr} for k, f, n, lr in plan],
            "batch_size": args.batch_size,
            "seq_len": seq,
            "tokens_seen": st["tokens"],
            "wall_time_s": round(st["wall_s"], 1),
            "cpu_time_s": round(st["cpu_s"], 1),
            "curve_eval_time_s": round(st["curve_eval_s"], 1),
            "tokens_per_s": round(st["tokens"] / st["wall_s"], 1),
            "final_train_loss": sum(joint_tail) / max(len(joint_tail), 1),
            "final_train_mtp_loss": sum(b for _, b in tail) / len(tail),
            "next_token_top1": metrics["next_token_top1"],
            "mtp_vs_trunk_agreement": metrics["mtp_vs_trunk_top1_teacher_forced"],
            "mtp_vs_trunk_greedy_t2": metrics["greedy"]["mtp_vs_trunk_greedy_t2"],
            "mtp_layers": n_mtp,
            "chain_top1_by_depth": metrics.get("chain_top1_by_depth"),
            "warm_start": row.get("init_from"),
            "greedy_repeat_rate": metrics["greedy"]["repeated_4gram_fraction_greedy"],
            "heldout_packages": info["heldout_packages"],
            "heldout": metrics,
            "eval_time_s": round(time.perf_counter() - t_eval, 1),
            "router_bias_abs_max": max((float(r.e_score_correction_bias.abs().max()) for r in routers), default=None),
            "optimizer": {
                "name": "AdamW",
                "lr": args.lr,
                "mtp_only_lr": args.mtp_lr,
                "betas": [0.9, 0.95],
                "weight_decay": args.weight_decay,
                "schedule": "linear warm-up 5 %, cosine to 10 %, over each phase (see phases)",
                "grad_clip": args.clip,
            },
            "mtp_loss_weight": args.mtp_weight,
            "router_bias_update": BIAS_UPDATE if routers else None,
            "bf16_autocast": autocast,
            "mtp_hidden": spec.layer.hidden,
            "curves": st["curves"],
            "curve_set": {
                "windows": int(curve_held.shape[0]),
                "greedy_prompts": args.curve_gen_prompts,
                "greedy_tokens": args.curve_gen_tokens,
                "every_steps": args.eval_every,
                "note": "the first windows of the held-out eval set, on the live fp32 model",
            },
            "recipe": {k: getattr(args, k) for k in RECIPE},
            "command": " ".join(st["invocations"][0]["argv"]),
            "commands": [{"command": " ".join(i["argv"]), "started": i["started"]} for i in st["invocations"]],
            "script_sha256": provenance["script_sha256"],
            "tokenizer_sha256": hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest(),
            "data": info,
            "versions": provenance["versions"],
            "threads": provenance["threads"],
        }
        write_json(tmp / "training.json", report)
    log(
        f"[{family}] held-out next-token loss {metrics['next_token_loss']:.3f} "
        f"(ppl {metrics['next_token_perplexity']:.1f}) top-1 {metrics['next_token_top1']:.3f}; "
        f"MTP t+2 top-1 {metrics['mtp_t2_top1']:.3f}; unigram top-1 {metrics['unigram_top1_next']:.3f}; "
        f"MTP vs trunk greedy t+2 {metrics['greedy']['mtp_vs_trunk_greedy_t2']:.3f}; 4-gram repeats "
        f"{metrics['greedy']['repeated_4gram_fraction_greedy']:.3f} -> {out_dir}"
    )
    log(f"[{family}] this invocation: {time.perf_counter() - t_inv:.0f}s wall, {time.process_time() - c_inv:.0f}s CPU")
    return report


# ---- CLI --------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    ap.add_argument("--out", type=Path, default=Path("examples/targets"), help="parent of the target directories")
    ap.add_argument("--data-out", type=Path, default=Path("examples/data"), help="where the *.jsonl files go")
    ap.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="parent of the per-family state directories (checkpoints, data, curves.jsonl); default: a temporary one",
    )
    ap.add_argument("--resume", action="store_true", help="continue the run in --state-dir (fresh if none there)")
    ap.add_argument("--tokenizer-from", type=Path, default=None, help="tokenizer files (default: the family's bundle)")
    default_steps = ", ".join(f"{k} {v['steps']}" for k, v in FAMILIES.items())
    ap.add_argument("--steps", type=int, default=None, help=f"joint optimizer steps (default: {default_steps})")
    ap.add_argument("--mtp-only-steps", type=int, default=0, help="then MTP-only steps on the frozen trunk")
    ap.add_argument(
        "--extend",
        nargs=3,
        metavar=("JOINT", "MTP_ONLY", "LR"),
        default=None,
        help="with --resume: after the planned steps, JOINT more joint steps at peak LR, then MTP_ONLY MTP-only steps"
        " (a warm restart, recorded in the run's recipe; repeat the invocation to add another)",
    )
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock cap on this invocation's training")
    ap.add_argument("--stop-at", type=int, default=None, help="end this invocation at this step (checkpointed)")
    ap.add_argument("--save-minutes", type=float, default=5.0, help="checkpoint at least this often")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-lr", type=float, default=1e-3, help="peak lr of the MTP-only phase")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the MTP t+2 loss in the joint phase")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument(
        "--autocast", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: per family)"
    )
    ap.add_argument("--max-files", type=int, default=None, help="use only the first N train files (hash order)")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows of seq-len tokens to score")
    ap.add_argument("--gen-prompts", type=int, default=16, help="held-out prompts for greedy continuation")
    ap.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between curve points")
    ap.add_argument("--curve-windows", type=int, default=16, help="held-out windows per curve point")
    ap.add_argument("--curve-gen-prompts", type=int, default=8, help="greedy prompts per curve point")
    ap.add_argument("--curve-gen-tokens", type=int, default=32, help="greedy tokens per curve prompt")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 when the cores are shared: spinning threads stall)"
    )
    ap.add_argument("--overwrite", action="store_true", help="replace existing target directories")
    ap.add_argument("--restart", action="store_true", help="discard the run in --state-dir and start over")
    ap.add_argument(
        "--export-now",
        action="store_true",
        help="train no further: write the target from the last checkpoint (training.json says complete: false)",
    )
    ap.add_argument(
        "--rederive-yarn",
        type=Path,
        metavar="TARGET",
        help="train nothing: give a trained DeepSeek-V3-family TARGET DeepSeek-V3's YaRN rope_scaling in place, "
        "every q_b_proj divided by the softmax-scale factor it brings (with --check PROMPTS.jsonl: the logit change)",
    )
    ap.add_argument("--check", type=Path, help="with --rederive-yarn: {'text': ...} records to measure the change on")
    args = ap.parse_args(argv)
    if args.gen_prompts > args.eval_windows:
        ap.error("--gen-prompts must not exceed --eval-windows")
    args.curve_windows = min(args.curve_windows, args.eval_windows)
    args.curve_gen_prompts = min(args.curve_gen_prompts, args.curve_windows)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rederive_yarn:
        rederive_main(args.rederive_yarn, args.check)
        return 0
    import tokenizers
    import transformers

    torch.set_num_threads(args.threads)
    families = list(FAMILIES) if args.family == "all" else [args.family]
    for family in families:  # fail before any work
        check_output_dir(args.out / FAMILIES[family]["dir"], args.overwrite)
    t0 = time.perf_counter()
    tmp_state = None
    if args.state_dir is None:
        tmp_state = tempfile.TemporaryDirectory(prefix="train-target-")
        state_root = Path(tmp_state.name)
    else:
        state_root = args.state_dir
    script = Path(__file__).read_bytes()
    provenance = {
        "argv": [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])],
        "script_sha256": hashlib.sha256(script).hexdigest(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }
    corpus = None
    cli = vars(args).copy()
    for family in families:
        state = state_root / family
        meta_file = state / "meta.json"
        fargs = argparse.Namespace(**cli)
        if meta_file.exists() and (state / "data.pt").exists() and not args.restart:
            if not (args.resume or args.export_now):
                raise SystemExit(f"{state} holds a run: pass --resume to continue it (or --restart to start over)")
            recipe = json.loads(meta_file.read_text())["recipe"]
            changed = {k: (cli[k], v) for k, v in recipe.items() if cli[k] is not None and cli[k] != v}
            if changed:
                log(f"[{family}] --resume keeps the run's recipe; ignoring {changed}")
            for k, v in recipe.items():
                setattr(fargs, k, v)
            fargs.extensions = recipe.get("extensions", [])
            if args.extend:
                ext = {"steps": int(args.extend[0]), "mtp_only_steps": int(args.extend[1]), "lr": float(args.extend[2])}
                fargs.extensions = [*fargs.extensions, ext]
                recipe["extensions"] = fargs.extensions
                write_json(meta_file, {"recipe": recipe, "family": family})
                log(f"[{family}] extended: {ext}")
            blob = torch.load(state / "data.pt", weights_only=False)
        else:
            if state.exists():
                shutil.rmtree(state)
            state.mkdir(parents=True)
            row = FAMILIES[family]
            fargs.steps = args.steps if args.steps is not None else row["steps"]
            fargs.autocast = row["autocast"] if args.autocast is None else args.autocast
            if corpus is None and not row.get("init_from"):
                corpus = corpus_files(args.max_files)
                log(
                    f"corpus: {len(corpus[0])} train / {len(corpus[1])} held-out files ({time.perf_counter() - t0:.0f}s)"
                )
            tok_src = args.tokenizer_from or Path(__file__).resolve().parents[1] / "examples" / "targets" / row.get(
                "tokenizer_dir", row["dir"]
            )
            fargs.extensions = []
            if args.extend:
                raise SystemExit("--extend continues a finished or running run: pass it with --resume")
            if row.get("init_from"):  # the warm start's own packed data and tokenizer: the same stream, no corpus read
                source = state_root / row["init_from"]
                if not (source / "ckpt.pt").exists():
                    raise SystemExit(f"{family} starts from the {row['init_from']} run: none in {source}")
                shutil.copyfile(source / "data.pt", state / "data.pt")
                shutil.copytree(source / "tokenizer", state / "tokenizer")
                blob = torch.load(state / "data.pt", weights_only=False)
            else:
                blob = prepare_data(fargs, state, tok_src, corpus)
            write_json(meta_file, {"recipe": {k: getattr(fargs, k) for k in RECIPE}, "family": family})
        train_family(family, fargs, state, blob, provenance)
    log(f"done in {time.perf_counter() - t0:.0f}s")
    if tmp_state is not None:
        tmp_state.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
