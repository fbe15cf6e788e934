"""Train the small benchmark targets: a trunk and its MTP layer, jointly, as DeepSeek-V3 trains its MTP module.

Nothing can be downloaded here, so the project's acceptance figures come from targets trained by this script on the
Python standard library's own source. For each family in `FAMILIES` it

1. splits the stdlib `*.py` files (sorted, site-packages excluded) by file into train and held-out (a file is
   held out when the sha256 of its relative path is 0 mod 20: about 5 %, the same on every machine with the same
   Python), and trains a byte-level BPE tokenizer (vocab 4096, `<|endoftext|>` as bos/eos/pad, `<|im_start|>` /
   `<|im_end|>` with a ChatML chat template) on the train files;
2. builds the trunk with transformers' own class from a config dict written with the family's real config.json
   field names, and the MTP layer with `NativeMtpDraft(spec, config)`;
3. trains both at once: loss = next-token CE of the trunk + 0.3 * t+2 CE of the MTP layer, the MTP layer reading the
   trunk's hidden state at t (before or after the final norm, as the spec's `layer.hidden` says) and the embedding
   of token t+1, through the trunk's own (trainable) embedding and lm_head. MoE routers get DeepSeek-V3's
   auxiliary-loss-free balancing (`e_score_correction_bias += gamma * sign(mean load - load)` after each step);
4. writes the family's exact hub layout (trunk keys as transformers' save_pretrained writes them, MTP keys via
   `native_to_checkpoint`, bf16 except the router's fp32 `e_score_correction_bias`, >= 2 shards + index), the
   tokenizer files, `generation_config.json` and `training.json`;
5. reloads what it wrote (transformers for the trunk, `load_native` for the MTP layer) and measures it on held-out
   files: next-token loss / perplexity / top-1, MTP t+2 loss / top-1, a unigram baseline, greedy-continuation
   statistics and how often the raw MTP head's t+2 guess equals the trunk's own greedy t+2 (the step-1 acceptance
   of greedy speculative decoding with the untouched head, which the project tries to beat).

It also writes the data files later stages use (`--data-out`): `train.jsonl` (text chunks of train files, for
distillation), `heldout.jsonl` (prompts from held-out files only, for evaluation) and `chat.jsonl` (user: a function's
signature and docstring, assistant: its body; from train files). A few such chat-formatted functions from train files
are mixed into the training stream so the targets know the chat tokens.

What it does not do: use a GPU, resume, or train anything but these two tiny families (their configs are data in
`FAMILIES`); it never prints tokens or decoded text. Runs are reproducible from the defaults on the same machine
(`--steps` fixes the run; `--minutes` adds a wall-clock cap, which makes a run depend on the machine's speed).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import math
import platform
import random
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtp2draft.draft.layout import load_native, native_to_checkpoint
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.family.spec import Spec, get_spec
from mtp2draft.io import atomic_output_dir, check_output_dir, write_json
from mtp2draft.testing.family_configs import DEEPSEEK_V3, MIMO
from mtp2draft.testing.fixtures import hub_tensors, write_checkpoint

# ---- the two targets --------------------------------------------------------------------------------------------
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
# steps (about 6 minutes of training each on 2 free CPU cores) and whether bf16 autocast pays: measured on this machine
# (AVX512-BF16), 1.5x faster for the dense Qwen2 trunk, no faster for DeepSeek's MoE (small per-expert matmuls), so
# DeepSeek trains in fp32.
FAMILIES: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        "dir": "tiny-deepseek-v3",
        "trunk": ("deepseek_v3", "DeepseekV3ForCausalLM"),
        "steps": 240,
        "autocast": False,
        "config": {
            **copy.deepcopy(DEEPSEEK_V3),
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
        },
    },
    "mimo": {
        "dir": "tiny-mimo",
        "trunk": ("qwen2", "Qwen2ForCausalLM"),
        "steps": 400,
        "autocast": True,
        "config": {
            **copy.deepcopy(MIMO),
            **COMMON,
            "intermediate_size": 640,
            "num_key_value_heads": 2,
            "max_window_layers": 8,
            "sliding_window": 2048,
        },
    },
}

MTP_WEIGHT = 0.3  # DeepSeek-V3's lambda for the first 10T tokens
BIAS_UPDATE = 1e-2  # router bias speed gamma: 10x DeepSeek-V3 (0.001), too slow to balance a 500-step run
EXPERTS = "eager"  # MoE experts: the fastest on CPU (grouped_mm / batched_mm take slow fallback paths here)
HELDOUT_MOD = 20  # held out: sha256(relative path) % 20 == 0
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

EXAMPLES = """examples:
  # both targets with the defaults (about 15 minutes on 2 CPU cores), plus examples/data/*.jsonl
  python scripts/train_target.py --family all --out examples/targets
  # one target, capped at 5 minutes of training
  python scripts/train_target.py --family mimo --out /tmp/targets --minutes 5
  # a smoke run in seconds
  python scripts/train_target.py --family all --out /tmp/t --data-out /tmp/d --steps 3 --max-files 12 \\
      --batch-size 2 --eval-windows 2 --gen-prompts 2 --gen-tokens 4
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- corpus -----------------------------------------------------------------------------------------------------
def path_hash(rel: str) -> int:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16)


def stdlib_files(max_files: int | None) -> tuple[Path, list[tuple[str, str]], list[tuple[str, str]]]:
    """(stdlib root, train files, held-out files) as (relative path, text), each list in hash order (a fixed
    shuffle). Files that are empty or not UTF-8 are skipped; `max_files` keeps the first N in hash order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "site-packages" not in p.relative_to(root).parts and p.is_file()
    )
    files = []
    for rel in sorted(rels, key=lambda r: (path_hash(r), r)):
        try:
            text = (root / rel).read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append((rel, text))
        if max_files and len(files) >= max_files:
            break
    if len(files) < 2:
        raise SystemExit(f"found fewer than two usable .py files under {root}")
    heldout = [f for f in files if path_hash(f[0]) % HELDOUT_MOD == 0] or files[:1]  # tiny subsets: the first
    held = {rel for rel, _ in heldout}
    train = [f for f in files if f[0] not in held]
    return root, train, heldout


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
    ):
        with open(out / name, "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
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
    return [torch.tensor([*enc.ids, EOS_ID]) for enc in tok.encode_batch(docs)]


def pack(encoded: list[torch.Tensor], width: int) -> torch.Tensor:
    """All documents back to back, cut into windows: [N, width] (the tail shorter than a window is dropped)."""
    flat = torch.cat(encoded)
    n = flat.numel() // width
    if n == 0:
        raise SystemExit(f"the corpus holds {flat.numel()} tokens, fewer than one window of {width}")
    return flat[: n * width].view(n, width)


def batches(n: int, size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices [size] of successive batches: each epoch a fresh seeded permutation (its tail dropped)."""
    if n < size:
        raise SystemExit(f"{n} training windows cannot fill a batch of {size}")
    while True:
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n - size + 1, size):
            yield perm[i : i + size]


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
def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json (+ whatever else transformers writes) loadable by AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[0],
        extra_special_tokens=list(SPECIAL_TOKENS[1:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=COMMON["max_position_embeddings"],
    )
    probe = chat_messages("def f(x):\n    'Doc.'", "    return x")
    if fast.apply_chat_template(probe, tokenize=False) != render_chat(probe):
        raise RuntimeError("chat template and render_chat disagree")
    fast.save_pretrained(str(out))
    # Spelled so transformers 4.x (which serving engines may pin) loads it too: the generic fast class, the template
    # inside tokenizer_config.json, and the older name of the extra special tokens list. transformers 5 reads all.
    cfg_file = out / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("extra_special_tokens", None)
    cfg.update(
        tokenizer_class="PreTrainedTokenizerFast",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        chat_template=CHAT_TEMPLATE,
    )
    (out / "chat_template.jinja").unlink(missing_ok=True)
    write_json(cfg_file, cfg)


# ---- model ------------------------------------------------------------------------------------------------------
def build_trunk(family: str) -> nn.Module:
    import transformers
    from transformers import AutoConfig

    row = FAMILIES[family]
    cfg_dict = {k: v for k, v in row["config"].items() if k not in ("architectures", "model_type")}
    cfg = AutoConfig.for_model(row["trunk"][0], **cfg_dict)
    cfg._attn_implementation = "sdpa"
    model = getattr(transformers, row["trunk"][1])(cfg)
    model.set_experts_implementation(EXPERTS)
    return model


def init_mtp(module: NativeMtpDraft, std: float) -> None:
    """The trunk's init for the MTP layer: N(0, std) matrices (experts included), unit norms, zero biases/buffers."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.normal_(0.0, std)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


class PreNorm:
    """Captures the trunk's last hidden state before the final norm ([B, T, H]) with a forward hook."""

    def __init__(self, model: nn.Module) -> None:
        self.value: torch.Tensor | None = None
        model.model.norm.register_forward_hook(self._hook)

    def _hook(self, _module, args, _output) -> None:
        self.value = args[0]


def trunk_forward(model: nn.Module, pre: PreNorm, spec: Spec, ids: torch.Tensor):
    """ids [B, T] -> (post-norm hidden [B, T, H], the hidden the MTP layer reads [B, T, H])."""
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


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- evaluation -------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(
    model: nn.Module, mtp: NativeMtpDraft, spec: Spec, held: torch.Tensor, unigram: torch.Tensor, args
) -> dict[str, Any]:
    """Teacher-forced held-out metrics and greedy-continuation agreement, on the model as written to disk.

    held: [N, T+1] held-out windows; unigram: [V] train token counts."""
    pre = PreNorm(model)
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
        mtp_logits, _ = mtp(x[:, 1:t], hidden[:, : t - 1], pos)  # [b, T-1, V]: token t+2 from (h_t, x_{t+1})
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
    out["greedy"] = greedy_agreement(model, mtp, spec, pre, held, probs, args)
    return out


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
    mtp_logits, _ = mtp(seq[:, 1:], hidden[:, :-1], pos)  # [P, L-1, V]
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
def hub_state(model: nn.Module, mtp: NativeMtpDraft, spec: Spec, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Trunk + MTP tensors under the family's hub key names: bf16, buffers (router biases) fp32."""
    keep = set()  # leaf names of persistent buffers, e.g. e_score_correction_bias
    for m in (model, mtp):
        state = m.state_dict()
        keep |= {n.rsplit(".", 1)[-1] for n, _ in m.named_buffers() if n in state}

    def cast(key: str, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        return t.float() if key.rsplit(".", 1)[-1] in keep else t.to(torch.bfloat16)

    tensors = {k: cast(k, v) for k, v in hub_tensors(model).items()}
    mtp_state = {k: cast(k, v.detach()) for k, v in mtp.state_dict().items()}
    tensors.update(native_to_checkpoint(spec, config, 0, mtp_state))
    comp = spec.component_keys(config, 0)
    for name, target in (("embed", spec.keys.target_embed), ("head", spec.keys.target_head)):
        if name in comp:  # copies some releases keep inside the MTP layer (DeepSeek-V3 does)
            tensors[comp[name]] = tensors[spec.key(target, config, 0)].clone()
    return tensors


def train_family(
    family: str, args, tok, data: torch.Tensor, heldout, out_root: Path, provenance: dict
) -> dict[str, Any]:
    """Train, write and measure one target. data: [N, T+1] packed training windows."""
    import transformers

    row = FAMILIES[family]
    spec = get_spec(family)
    config = copy.deepcopy(row["config"])
    out_dir = out_root / row["dir"]
    check_output_dir(out_dir, args.overwrite)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = build_trunk(family)  # transformers' init, from the seeded global RNG
    mtp = NativeMtpDraft(spec, config)
    init_mtp(mtp, std=config["initializer_range"])
    model.train()
    mtp.train()
    params = {"trunk": count(model), "mtp_layer": count(mtp), "total": count(model) + count(mtp)}
    log(f"[{family}] parameters: trunk {params['trunk']:,}, MTP layer {params['mtp_layer']:,} (shares embed/head)")

    pre = PreNorm(model)
    balance = RouterBalance(list(model.modules()) + list(mtp.modules()))
    decay = [p for m in (model, mtp) for p in m.parameters() if p.dim() >= 2]
    no_decay = [p for m in (model, mtp) for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    seq = args.seq_len
    batch_rows = batches(data.shape[0], args.batch_size, torch.Generator().manual_seed(args.seed))
    unigram = torch.zeros(VOCAB)
    pos = torch.arange(seq - 1).expand(args.batch_size, -1)  # MTP position of (h_t, x_{t+1}) is t
    budget = args.minutes * 60 if args.minutes else None
    steps = args.steps if args.steps else (row["steps"] if budget is None else 10**9)
    autocast = row["autocast"] if args.autocast is None else args.autocast
    losses: list[tuple[float, float]] = []
    tokens = 0
    t0 = time.perf_counter()
    step = 0
    worst = 0.0
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / steps, elapsed / budget if budget else 0.0)
        if progress >= 1.0:
            break
        lr = args.lr * lr_factor(max((step + 1) / steps, elapsed / budget if budget else 0.0))
        for group in opt.param_groups:
            group["lr"] = lr
        x = data[next(batch_rows)]  # [B, T+1]
        unigram += torch.bincount(x[:, 1:].flatten(), minlength=VOCAB).float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            post, hidden = trunk_forward(model, pre, spec, x[:, :seq])  # [B, T, H] each
            logits = model.lm_head(post)  # [B, T, V]
            embeds = model.model.embed_tokens(x[:, 1:seq])  # [B, T-1, H]: token t+1 for t = 0..T-2
            mtp_post, _ = mtp.layer_forward(embeds, hidden[:, : seq - 1], pos)  # [B, T-1, H]
            mtp_logits = model.lm_head(mtp_post)  # [B, T-1, V]: token t+2
        loss_next = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss_mtp = F.cross_entropy(mtp_logits.float().flatten(0, 1), x[:, 2:].flatten())
        loss = loss_next + MTP_WEIGHT * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(decay + no_decay, args.clip)
        opt.step()
        worst = balance.step()
        step += 1
        tokens += x[:, :seq].numel()
        losses.append((loss_next.item(), loss_mtp.item()))
        if step % args.log_every == 0 or step == 1:
            el = time.perf_counter() - t0
            log(
                f"[{family}] step {step} loss {loss_next.item():.3f} mtp {loss_mtp.item():.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} gnorm {float(grad_norm):.2f}"
                + (f" moe max/mean load {worst:.2f}" if balance.routers else "")
                + f" tok/s {tokens / el:.0f} elapsed {el:.0f}s"
            )
    wall = time.perf_counter() - t0
    tail = losses[-20:]
    log(f"[{family}] trained {step} steps, {tokens:,} tokens in {wall:.0f}s ({tokens / wall:.0f} tok/s)")

    model.eval()
    mtp.eval()
    with atomic_output_dir(out_dir, overwrite=args.overwrite) as tmp:
        write_checkpoint(tmp, config, hub_state(model, mtp, spec, config), shards=2)
        save_tokenizer(tok, tmp)
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
        held = heldout_windows(tok, heldout, seq + 1, args.eval_windows)  # [N, T+1]
        t_eval = time.perf_counter()
        metrics = evaluate(saved, saved_mtp, spec, held, unigram, args)
        routers = [m for m in saved.modules() if isinstance(getattr(m, "e_score_correction_bias", None), torch.Tensor)]
        report = {
            "family": family,
            "spec": spec.name,
            "parameters": params,
            "seed": args.seed,
            "steps": step,
            "batch_size": args.batch_size,
            "seq_len": seq,
            "tokens_seen": tokens,
            "wall_time_s": round(wall, 1),
            "tokens_per_s": round(tokens / wall, 1),
            "final_train_loss": sum(a for a, _ in tail) / len(tail),
            "final_train_mtp_loss": sum(b for _, b in tail) / len(tail),
            "heldout": metrics,
            "eval_time_s": round(time.perf_counter() - t_eval, 1),
            "router_bias_abs_max": max((float(r.e_score_correction_bias.abs().max()) for r in routers), default=None),
            "optimizer": {
                "name": "AdamW",
                "lr": args.lr,
                "betas": [0.9, 0.95],
                "weight_decay": args.weight_decay,
                "schedule": "linear warm-up 5 %, cosine to 10 %",
                "grad_clip": args.clip,
                "minutes_cap": args.minutes,
            },
            "mtp_loss_weight": MTP_WEIGHT,
            "router_bias_update": BIAS_UPDATE if routers else None,
            "bf16_autocast": autocast,
            "mtp_hidden": spec.layer.hidden,
            **provenance,
        }
        write_json(tmp / "training.json", report)
    log(
        f"[{family}] held-out next-token loss {metrics['next_token_loss']:.3f} "
        f"(ppl {metrics['next_token_perplexity']:.1f}) top-1 {metrics['next_token_top1']:.3f}; "
        f"MTP t+2 top-1 {metrics['mtp_t2_top1']:.3f}; unigram top-1 {metrics['unigram_top1_next']:.3f}; "
        f"MTP vs trunk greedy t+2 {metrics['greedy']['mtp_vs_trunk_greedy_t2']:.3f} -> {out_dir}"
    )
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
    default_steps = ", ".join(f"{k} {v['steps']}" for k, v in FAMILIES.items())
    ap.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default: {default_steps})")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training (the schedule follows)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument(
        "--autocast", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: per family)"
    )
    ap.add_argument("--max-files", type=int, default=None, help="use only the first N stdlib files (hash order)")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows of seq-len tokens to score")
    ap.add_argument("--gen-prompts", type=int, default=16, help="held-out prompts for greedy continuation")
    ap.add_argument("--gen-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 when the cores are shared: spinning threads stall)"
    )
    ap.add_argument("--overwrite", action="store_true", help="replace existing target directories")
    args = ap.parse_args(argv)
    if args.gen_prompts > args.eval_windows:
        ap.error("--gen-prompts must not exceed --eval-windows")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tokenizers
    import transformers

    torch.set_num_threads(args.threads)
    families = list(FAMILIES) if args.family == "all" else [args.family]
    for family in families:  # fail before any work
        check_output_dir(args.out / FAMILIES[family]["dir"], args.overwrite)
    t0 = time.perf_counter()
    root, train, heldout = stdlib_files(args.max_files)
    log(f"corpus: {len(train)} train / {len(heldout)} held-out files from {root}")
    tok = train_tokenizer([t for _, t in train])
    log(f"tokenizer: {tok.get_vocab_size()} tokens in {time.perf_counter() - t0:.1f}s")
    data = write_data(args.data_out, train, heldout)
    skip = {tuple(x) for x in data.pop("chat_used")}
    t1 = time.perf_counter()
    windows = pack(encode(tok, training_docs(train, skip)), args.seq_len + 1)  # [N, T+1]
    data["train_windows"] = windows.shape[0]
    log(f"training windows: {windows.shape[0]:,} x {args.seq_len + 1} tokens ({time.perf_counter() - t1:.0f}s)")
    script = Path(__file__).read_bytes()
    provenance = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "script_sha256": hashlib.sha256(script).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
        "data": {
            "source": "Python standard library *.py (site-packages excluded)",
            "python": platform.python_version(),
            "stdlib": str(root),
            "train_files": len(train),
            "heldout_files": len(heldout),
            "heldout_rule": f"sha256(relative path) % {HELDOUT_MOD} == 0",
            "heldout_list_sha256": hashlib.sha256("\n".join(r for r, _ in heldout).encode()).hexdigest(),
            "files_written": data,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }
    for family in families:
        train_family(family, args, tok, windows, heldout, args.out, provenance)
    log(f"done in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
