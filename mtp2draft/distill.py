"""Stage 2: fine-tune a draft against the frozen target with training-time test (TTT).

One training sequence gives a chain origin at every position p at once (B batch, T tokens, H hidden):
- step 0 reads the target's features at p and the data token x[p+1]; it predicts x[p+2];
- step s reads the draft's OWN step-(s-1) hidden at p and the data token x[p+s+1]; it predicts x[p+s+2];
- attention at step s for origin p sees the step-0 entries of positions <= p (causal) and, for each earlier step r,
  only origin p's own entry: the KV cache holds one block of T entries per step and the mask is a causal block
  followed by s diagonal blocks; the entry of step s stands at RoPE position p + s + 1 (its input token's position).
The hidden a step hands on is the one the serving engine hands on (`draft.hidden_handover`), so what is trained is
what is served. The loss is the forward KL from the target's distribution for x[p+s+2] (restricted to the draft
vocabulary for EAGLE-3), weighted per step; top-1 agreement with the target is reported per step.

`tests/test_distill.py` proves the unrolled computation equals the serving-time chain (`evaluate.draft_chain`).

Both draft kinds go through the same loop; nothing here depends on the family (the spec and the draft module carry
that). The target is never written: its parameters are frozen and no optimizer sees them.

What this module does not do: measure acceptance (`evaluate.py`) or read checkpoints (`checkpoint.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import memory, parallel
from ._version import __version__
from .data import Example, load_tokenizer, read_examples, regenerate
from .draft import (
    CONFIG_FILE,
    PROVENANCE_FILE,
    WEIGHTS_FILE,
    DraftCache,
    Eagle3Draft,
    NativeMtpDraft,
    load_draft,
    read_draft_config,
    vocab_maps,
    without_identity_maps,
)
from .errors import DataError, DraftError, OptionError
from .hidden import Features, OfflineHiddenStates, TargetModel, check_draft_fits, offline_features
from .io import Progress, atomic_output_dir, check_output_dir, save_tensors, write_json
from .kinds import DraftKind
from .parallel import Parallel
from .redact import command_line
from .spec import ENGINES, get_spec


@dataclass
class DistillConfig:
    steps: int = 300
    ttt_steps: int = 3
    lr: float = 1e-4  # SpecForge's EAGLE-3 recipe; tiny targets (tests, demo) want ~1e-3
    batch_size: int = 8
    max_length: int = 256
    draft_vocab_size: int | None = None
    seed: int = 0
    step_weights: list[float] | None = None
    """Loss weight of each TTT step; default 0.8**s (EAGLE-3)."""
    warmup_steps: int | None = None
    """Default: 5 % of the steps."""
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    save_every: int = 50
    log_every: int = 10
    engine: str | None = None
    """Train for what this engine (`spec.ENGINES`) computes with the family: for native MTP drafts its step-0
    hidden, final norm and hand-over (the spec's `[engines.<engine>]`); refused when the engine cannot serve the
    draft's kind for this family. None keeps the draft's setting."""
    hidden_handover: str | None = None
    """Native MTP drafts: the hidden handed to the next step, overriding the engine's (`post_norm` | `pre_norm`).
    None: the engine's, or the draft's setting."""
    precision: str | None = None
    """fp32 or bf16 (see parallel.PRECISIONS); None: bf16 on CUDA, fp32 elsewhere."""
    train_subset: str = "all"
    """Which parameters train (parallel.TRAIN_SUBSETS); the rest stay frozen."""
    activation_checkpointing: bool = False
    """Recompute the block's MLP in backward (saves its activations; the math is unchanged)."""
    compile: bool = False
    """torch.compile the draft's block (GPU runs; the math is unchanged up to kernel rounding)."""

    def __post_init__(self) -> None:
        """Refuse values that would crash later or silently train nothing (one line each, before any work)."""
        for name in ("steps", "ttt_steps", "batch_size", "save_every", "log_every"):
            value = getattr(self, name)
            least = 0 if name == "steps" else 1  # 0 steps: calibrate an EAGLE-3 draft only (distill checks it)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(f"--{name.replace('_', '-')} must be a whole number >= {least}, got {value!r}")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 2:
            raise OptionError(f"--max-length must be a whole number >= 2, got {self.max_length!r}")
        for name in ("lr", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise OptionError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise OptionError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise OptionError(f"--draft-vocab-size must be >= 1, got {self.draft_vocab_size}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise OptionError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.step_weights is not None:
            if len(self.step_weights) != self.ttt_steps:
                raise OptionError(f"--step-weights has {len(self.step_weights)} values for {self.ttt_steps} TTT steps")
            if not all(math.isfinite(w) and w >= 0 for w in self.step_weights) or not any(self.step_weights):
                raise OptionError(f"--step-weights must be finite, >= 0 and not all zero, got {self.step_weights}")

    def weights(self) -> list[float]:
        if self.step_weights:
            return list(self.step_weights)
        return [0.8**s for s in range(self.ttt_steps)]


# ---- the unrolled computation ---------------------------------------------------------------------------------------
def ttt_mask(length: int, step: int, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
    """[1, 1, T, (step+1)*T] additive mask: causal over step-0 entries, diagonal over steps 1..step.

    window: sliding-window attention sees keys less than `window` positions back (the step-s query of origin p sits
    at p + s + 1, the step-0 key of origin j at j + 1)."""
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if window:
        q = torch.arange(length)[:, None] + step
        causal &= torch.arange(length)[None, :] > q - window
    allowed = [causal]
    allowed += [torch.eye(length, dtype=torch.bool)] * step
    mask = torch.zeros(length, (step + 1) * length, dtype=dtype)
    mask.masked_fill_(~torch.cat(allowed, dim=1), torch.finfo(dtype).min)
    return mask[None, None]


def shift(x: torch.Tensor, n: int, fill: int | bool = 0) -> torch.Tensor:
    """x[:, p + n] at index p (filled past the end): [B, T] -> [B, T]."""
    if n == 0:
        return x
    out = torch.full_like(x, fill)
    out[:, : x.shape[1] - n] = x[:, n:]
    return out


def draft_target_ids(draft) -> torch.Tensor | None:
    """Target id of each draft-vocabulary entry [Vd], or None when the draft predicts over the target vocabulary."""
    if isinstance(draft, Eagle3Draft):
        return torch.arange(draft.draft_vocab_size, device=draft.d2t.device) + draft.d2t
    return None


@dataclass
class StepStats:
    loss: torch.Tensor
    per_step_loss: list[float]
    per_step_correct: list[int]
    per_step_count: list[int]
    per_step_sum: list[torch.Tensor] = field(default_factory=list)
    """Un-normalised KL sum of each step (graph tensors): ranks normalise by the global token count."""


def teacher_logprobs(
    features: Features, offset: int, vocab_ids: torch.Tensor | None, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target log-probs for the token at p + offset + 1, given at index p.

    Returns ([B, T, V'] log-probs over the draft vocabulary `vocab_ids` (the target's when None),
    [B, T] the target's own top-1 id over its full vocabulary)."""
    if features.logits is not None:
        logits = shift(features.logits, offset, 0.0)
        top1 = logits.argmax(-1)
        if vocab_ids is not None:
            logits = logits.index_select(-1, vocab_ids)
        return torch.log_softmax(logits.float(), dim=-1), top1
    # Offline files keep the target's top-k only: the teacher is that top-k, renormalised over what the draft can
    # emit (ids outside the draft vocabulary drop out).
    values = shift(features.topk_logprobs, offset, -math.inf)  # [B, T, k]
    ids = shift(features.topk_ids, offset, 0)  # [B, T, k]
    size = vocab_ids.numel() if vocab_ids is not None else vocab_size
    column = (
        torch.arange(vocab_size, device=ids.device)
        if vocab_ids is None
        else torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device).index_copy_(
            0, vocab_ids, torch.arange(size, device=ids.device)
        )
    )
    col = column[ids]  # [B, T, k]: draft-vocabulary column of each top-k id, -1 if absent
    values = values.masked_fill(col < 0, -math.inf)
    dense = torch.full((*ids.shape[:2], size + 1), -math.inf, device=ids.device)
    dense.scatter_(-1, col.masked_fill(col < 0, size), values)  # absent ids land in a spare last column
    logp = torch.log_softmax(dense[..., :size], dim=-1)
    return logp.nan_to_num(nan=-math.inf), ids[..., 0]


def ttt_forward(
    draft,
    features: Features,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    ttt_steps: int,
    step_weights: Sequence[float],
    vocab_ids: torch.Tensor | None = None,
    return_logits: bool = False,
) -> StepStats | list[torch.Tensor]:
    """Unroll `ttt_steps` draft steps over every origin of a batch; loss and per-step top-1 agreement.

    input_ids, loss_mask: [B, T]; features: the target's, for the same [B, T]."""
    b, t = input_ids.shape
    hidden = draft.initial_hidden(features.step0_input(draft.kind))  # [B, T, H]
    dtype = hidden.dtype
    cache = DraftCache()
    positions = torch.arange(t, device=input_ids.device).expand(b, -1)
    total = hidden.new_zeros(())
    losses, correct, counts, all_logits, sums = [], [], [], [], []
    for s in range(ttt_steps):
        tokens = shift(input_ids, s + 1)  # x[p + s + 1]: the token step s reads
        mask = ttt_mask(t, s, dtype, getattr(draft, "attention_window", None)).to(hidden.device)
        logits, hidden = draft(tokens, hidden, positions + s + 1, attention_mask=mask, cache=cache)
        if return_logits:
            all_logits.append(logits)
            continue
        # the predicted token x[p + s + 2] must exist and be a loss token
        valid = shift(loss_mask, s + 2, False)
        teacher, target_top1 = teacher_logprobs(features, s + 1, vocab_ids, draft.vocab_size)  # for x[p + s + 2]
        logq = torch.log_softmax(logits.float(), dim=-1)
        p = teacher.exp()
        kl = (p * (teacher.clamp(min=-1e30) - logq)).sum(-1)  # forward KL(target || draft): [B, T]
        valid = valid & torch.isfinite(teacher).any(-1)  # offline: no top-k id inside the draft vocabulary
        n = valid.sum()
        kl_sum = (kl * valid).sum()
        step_loss = kl_sum / n.clamp(min=1)
        total = total + step_weights[s] * step_loss
        guess = logits.argmax(-1)
        if vocab_ids is not None:
            guess = vocab_ids[guess]
        losses.append(step_loss.item())
        correct.append(int(((guess == target_top1) & valid).sum()))
        counts.append(int(n))
        sums.append(kl_sum)
    if return_logits:
        return all_logits
    return StepStats(total, losses, correct, counts, sums)


# ---- draft vocabulary, calibration -------------------------------------------------------------------------------------
def token_counts(examples: Sequence[Example], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs among the training targets (loss tokens): [vocab_size] int64."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ex in examples:
        ids = torch.tensor(ex.input_ids)[torch.tensor(ex.loss_mask)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def choose_draft_vocab(examples: Sequence[Example], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent target ids among the training targets (loss tokens), sorted ascending."""
    counts = token_counts(examples, vocab_size)
    # ties broken by id so the choice is deterministic
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.int64)


def narrow_vocab(draft: Eagle3Draft, used: torch.Tensor, target_head: torch.Tensor) -> None:
    """Give an EAGLE-3 draft the draft vocabulary `used`: lm_head rows from the target's head, d2t/t2d."""
    d2t, t2d = vocab_maps(used, draft.vocab_size)
    head = torch.nn.Linear(draft.hidden_size, used.numel(), bias=False, dtype=draft.lm_head.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(target_head[used].to(head.weight.dtype))
    draft.lm_head = head
    draft.d2t, draft.t2d = d2t, t2d
    draft.eagle_config["draft_vocab_size"] = int(used.numel())


def calibrate_eagle3(
    draft: Eagle3Draft,
    features: Features,
    mask: torch.Tensor | None = None,
    native: NativeMtpDraft | None = None,
    input_ids: torch.Tensor | None = None,
    iterations: int = 100,
) -> dict | None:
    """Complete the MTP -> EAGLE-3 mapping on real activations (see transforms.py); only for drafts whose config
    says calibration is pending.

    1. fc: the MTP layer read `P_h hnorm(h)` of the target's final hidden h, fc only sees the three aux layers. At
       conversion fc's high slot holds `P_h diag(hnorm)`; here fc is refitted by ridge regression so that
       `fc(aux) ~ P_h diag(hnorm) h / rms(h)` over the batch's tokens: the best linear stand-in for what the MTP layer
       saw. (Only the rms scale when the final hidden is not available.)
    2. attention scales (with the native MTP layer, for its attention internals): the conversion replaced rms values
       inside the attention by weight-based estimates (rms of the projected input, MLA's low-rank norms), which are
       off on real, anisotropic activations. One scale per head for each of q, k and v is fitted (Adam on the
       log-scales, weights otherwise untouched) so that the EAGLE-3 attention output matches what the MTP layer adds
       to its residual stream: its attention output plus the embedding term the pass-through heads carry.
    """
    init = draft.eagle_config.get("mtp2draft_init")
    if not init or init.get("fc_scale_calibrated", True):
        return None
    aux = features.step0_input(DraftKind.EAGLE3).float()  # [B, T, 3Ht]
    b, t = aux.shape[:2]
    ht = aux.shape[-1] // 3
    keep = mask.reshape(-1).bool() if mask is not None else torch.ones(b * t, dtype=torch.bool)
    x = aux.reshape(-1, 3 * ht)[keep].double()  # [N, 3Ht]
    out: dict[str, Any] = {}
    with torch.no_grad():
        if features.final is None:
            rms = float(x[:, 2 * ht :].pow(2).mean().sqrt())
            draft.fc.weight[:, 2 * ht :] /= rms
            init.update(fc_scale_calibrated=True, high_aux_rms=rms)
            return {"high_aux_rms": rms}
        h = features.final.float().reshape(-1, features.final.shape[-1])[keep].double()  # [N, H]
        h = h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        w0 = draft.fc.weight[:, 2 * ht :].double()  # [H, Ht] = P_h diag(hnorm)
        y = h @ w0.T  # [N, H]: what the MTP layer's projection read from the hidden side
        gram = x.T @ x
        ridge = 1e-3 * gram.diagonal().mean()
        w = torch.linalg.solve(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y)  # [3Ht, H]
        r2 = float(1 - (y - x @ w).pow(2).sum() / (y - y.mean(0)).pow(2).sum())
        draft.fc.weight.copy_(w.T.to(draft.fc.weight.dtype))
    out.update(fc_fit_r2=r2, tokens=int(x.shape[0]))
    init.update(fc_fit="ridge", fc_fit_r2=r2, fc_fit_tokens=int(x.shape[0]))
    if native is not None and input_ids is not None:
        out.update(_fit_attention_scales(draft, native, features, input_ids, mask, iterations))
        init.update(attention_scale_fit={k: v for k, v in out.items() if k.startswith("attention")})
    init["fc_scale_calibrated"] = True
    return out


def _fit_attention_scales(draft, native, features, input_ids, mask, iterations: int) -> dict[str, float]:
    """Per-head scales of q, k, v fitted to the native layer's residual update (see calibrate_eagle3)."""
    from torch.func import functional_call

    b, t = input_ids.shape
    tokens = shift(input_ids, 1)  # step 0 reads x[p + 1]
    pos = torch.arange(t).expand(b, -1) + 1
    valid = (mask.bool() if mask is not None else torch.ones(b, t, dtype=torch.bool)) & shift(
        torch.ones_like(input_ids, dtype=torch.bool), 1, False
    )
    with torch.no_grad():
        e = F.embedding(tokens, native.embed_weight).float()  # [B, T, H]
        e_hat, h_hat = native.enorm(e), native.hnorm(features.final.float())
        zeros = torch.zeros_like(h_hat)
        first = native.spec.layer.concat == "embed_hidden"
        x = native.eh_proj(torch.cat([e_hat, h_hat] if first else [h_hat, e_hat], -1))  # MTP block input
        x_e = native.eh_proj(torch.cat([e_hat, zeros] if first else [zeros, e_hat], -1))  # its embedding term
        blk = native.block
        mask_n = native.default_mask(x) if hasattr(native, "default_mask") else None
        a_n = blk.self_attn(
            hidden_states=blk.input_layernorm(x),
            position_embeddings=native.rotary_emb(x, pos, **native._rotary_kwargs),
            attention_mask=mask_n,
            position_ids=pos,
        )
        a_n = a_n[0] if isinstance(a_n, tuple) else a_n
        want = (a_n + x_e)[valid]  # what the MTP layer adds to the P_h hnorm(h) part of its residual
        hidden = draft.initial_hidden(features.aux)
        mid = draft.midlayer
        xin = torch.cat([mid.input_layernorm(e.to(hidden.dtype)), mid.hidden_norm(hidden)], -1)  # [B, T, 2H]
        pe = draft.rotary_emb(hidden, pos)
    attn = mid.self_attn
    heads, kv, d = draft.config.num_attention_heads, draft.config.num_key_value_heads, attn.head_dim
    base = {f"{p}_proj.weight": getattr(attn, f"{p}_proj").weight.detach().clone() for p in "qkvo"}
    logs = {p: torch.zeros(heads if p == "q" else kv, requires_grad=True) for p in "qkv"}
    opt = torch.optim.Adam(logs.values(), lr=0.05)

    def scaled() -> dict[str, torch.Tensor]:
        out = dict(base)
        for p, n in (("q", heads), ("k", kv), ("v", kv)):
            w = base[f"{p}_proj.weight"]
            out[f"{p}_proj.weight"] = (w.view(n, d, -1) * logs[p].exp()[:, None, None].to(w.dtype)).reshape_as(w)
        return out

    def error() -> torch.Tensor:
        got, _ = functional_call(attn, scaled(), (xin,), {"position_embeddings": pe, "attention_mask": None})
        return (got[valid] - want).pow(2).mean() / want.pow(2).mean()

    with torch.no_grad():
        before = float(error())
    for _ in range(iterations):
        loss = error()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(error())
        for name, w in scaled().items():
            getattr(attn, name.split(".")[0]).weight.copy_(w)
    return {"attention_rel_error_before": before, "attention_rel_error_after": after}


def _native_attention(draft_dir: str | Path, embed: torch.Tensor, progress: Progress) -> NativeMtpDraft | None:
    """The attention side of the MTP layer an EAGLE-3 draft was converted from (its provenance names the source):
    norms, projection and attention only — the experts are never read. None, with a note, when unreachable."""
    from .convert import load_native

    prov_path = Path(draft_dir) / PROVENANCE_FILE
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    source = prov.get("source")
    if not source:
        return None
    parts = ("enorm", "hnorm", "eh_proj", "block.input_layernorm", "block.self_attn")
    try:
        local = Path(source).is_dir()
        revision = None if local else prov.get("commit")
        native = load_native(source, prov.get("mtp_layer"), revision, attach_target=False, parts=parts)
    except Exception as exc:  # calibration is an improvement, not a requirement
        progress(f"note: could not read the MTP layer from {source} ({exc}); calibrating fc only")
        return None
    native.embed_weight = embed.float()
    return native.eval()


# ---- batches ----------------------------------------------------------------------------------------------------------
def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Examples of optimizer step `step`: consecutive slices of per-epoch permutations fixed by the seed, so a
    resumed run sees exactly the batches an uninterrupted run would."""
    out = []
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(k, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
        out.append(int(perm[i]))
    return out


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    t = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), t), pad_id, dtype=torch.int64)
    loss = torch.zeros((len(examples), t), dtype=torch.bool)
    attn = torch.zeros((len(examples), t), dtype=torch.int64)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n], loss[i, :n], attn[i, :n] = torch.tensor(e.input_ids), torch.tensor(e.loss_mask), 1
    return {"input_ids": ids, "loss_mask": loss & attn.bool(), "attention_mask": attn}


# ---- checkpoints --------------------------------------------------------------------------------------------------------
def _settings_hash(settings: dict[str, Any]) -> str:
    # neither changes the math, so a run may resume with or without them
    skip = ("save_every", "log_every", "steps", "compile", "activation_checkpointing")
    keep = {k: v for k, v in settings.items() if k not in skip}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(
    folder: Path, step: int, draft, optimizer: torch.optim.Optimizer, meta: dict[str, Any], par: Parallel | None = None
) -> None:
    """Atomically write step `step` (weights, AdamW moments, progress) and keep the two newest.

    torch.distributed.checkpoint, keyed by parameter name, on one process or many (see parallel.py): a checkpoint
    loads on any world size."""
    parallel.save(folder, step, draft, optimizer, {**meta, "draft_config": draft.draft_config()}, par or Parallel())


def latest_checkpoint(folder: Path) -> Path | None:
    done = sorted(p for p in folder.glob("step-*") if (p / parallel.STATE_FILE).is_file())
    return done[-1] if done else None


def load_checkpoint(path: Path, draft, optimizer: torch.optim.Optimizer, par: Parallel | None = None) -> dict[str, Any]:
    return parallel.load(path, draft, optimizer, par or Parallel())


# ---- the stage ----------------------------------------------------------------------------------------------------------
@dataclass
class DistillResult:
    out: Path
    steps: int
    seconds: float
    per_step_accuracy: list[float]
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    is_main: bool = True
    """False on ranks other than 0 under torchrun: they wrote nothing and should print nothing."""


def _lr(step: int, cfg: DistillConfig) -> float:
    warm = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, cfg.steps // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def distill(
    draft_dir: str | Path,
    out: str | Path,
    data: str | Path | None = None,
    target: str | None = None,
    hidden_states: str | Path | None = None,
    config: DistillConfig | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    resume: bool = False,
    overwrite: bool = False,
    regenerate_data: bool = False,
    sample: bool = False,
    skip_bad: bool = False,
    checkpoint_dir: str | Path | None = None,
    device: str = "cpu",
    progress: Progress = lambda _: None,
    stop_after: int | None = None,
    progress_bar: bool = False,
) -> DistillResult:
    """Fine-tune the draft in `draft_dir` against the frozen target; write the result to `out`.

    Data comes either from `data` + the online `target`, or from a `dump-hidden` directory (`hidden_states`).
    `stop_after` ends the run after that many steps without writing `out` (checkpoints stay): for tests.
    Under torchrun every rank calls this; the global batch is split between them and rank 0 logs and writes
    (see parallel.py)."""
    cfg = config or DistillConfig()
    out = Path(out)
    owned = not torch.distributed.is_initialized()
    par = Parallel.from_env(device)
    try:
        return _distill_on(
            par,
            cfg,
            draft_dir,
            out,
            data,
            target,
            hidden_states,
            revision,
            token,
            resume,
            overwrite,
            regenerate_data,
            sample,
            skip_bad,
            checkpoint_dir,
            progress if par.is_main else (lambda _: None),
            stop_after,
            progress_bar and par.is_main,
        )
    finally:
        if owned:
            par.close()


def _distill_on(
    par: Parallel,
    cfg: DistillConfig,
    draft_dir: str | Path,
    out: Path,
    data: str | Path | None,
    target: str | None,
    hidden_states: str | Path | None,
    revision: str | None,
    token: str | bool | None,
    resume: bool,
    overwrite: bool,
    regenerate_data: bool,
    sample: bool,
    skip_bad: bool,
    checkpoint_dir: str | Path | None,
    progress: Progress,
    stop_after: int | None,
    progress_bar: bool,
) -> DistillResult:
    device = par.device
    precision = parallel.resolve_precision(cfg.precision, device)
    if cfg.batch_size < par.world:
        raise DataError(f"--batch-size {cfg.batch_size} is the global batch: it must be at least the {par.world} ranks")
    inputs = [draft_dir, target, data, hidden_states]
    # --resume continues from checkpoints; it never stands in for --overwrite: an existing --out is only replaced
    # with --overwrite, and only when mtp2draft wrote it.
    check_output_dir(out, overwrite, inputs)
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else out.parent / f"{Path(os.path.abspath(out)).name}.checkpoints"
    check_output_dir(ckpt_dir, True, inputs)  # --overwrite or --resume never touch a directory we did not write
    if not resume and latest_checkpoint(ckpt_dir) is not None:
        if not overwrite:
            raise DraftError(
                f"{ckpt_dir} holds checkpoints of an earlier run: pass --resume to continue it, or --overwrite to "
                "start over"
            )
        parallel.run_main_only(par, lambda: shutil.rmtree(ckpt_dir, ignore_errors=True))
    # the memory plan, from the draft's config alone, before anything loads
    mem = memory.plan(
        read_draft_config(draft_dir),
        par.world,
        precision,
        cfg.batch_size,
        cfg.max_length,
        cfg.ttt_steps,
        cfg.train_subset,
        cfg.activation_checkpointing,
        online_logits=hidden_states is None,
    )
    progress(f"{memory.render([mem])}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", par.world))
    reason = memory.check_fits(mem, device, local_world if device == "cpu" else 1)
    if reason:
        raise DraftError(reason)
    torch.manual_seed(cfg.seed)
    draft = load_draft(draft_dir).to(device)
    kind = draft.kind
    if cfg.engine is not None:
        spec_name = getattr(getattr(draft, "spec", None), "name", None) or (
            (getattr(draft, "eagle_config", {}) or {}).get("mtp2draft") or {}
        ).get("spec")
        if spec_name is None:
            raise DataError("--engine needs a draft converted by mtp2draft (its config names the target's spec)")
        spec = get_spec(spec_name)
        if cfg.engine not in ENGINES:
            raise DataError(f"--engine must be one of {', '.join(ENGINES)}, got {cfg.engine!r}")
        if not spec.serves(cfg.engine, kind):
            facts = spec.engine(cfg.engine)
            raise DataError(
                f"{cfg.engine} {facts.version if facts else ''} cannot serve a {kind} draft for {spec.name} targets "
                f"(spec {spec.path}: [engines.{cfg.engine}] methods = {list(facts.methods) if facts else []})"
            )
        if kind == DraftKind.MTP:
            draft.train_for_engine(cfg.engine)
    if cfg.hidden_handover is not None:
        if kind != DraftKind.MTP:
            raise DataError(
                "--hidden-handover applies to native MTP drafts (EAGLE-3 always hands on the pre-norm output)"
            )
        if cfg.hidden_handover not in ("post_norm", "pre_norm"):
            raise DataError(f"--hidden-handover must be post_norm or pre_norm, got {cfg.hidden_handover!r}")
        draft.hidden_handover = cfg.hidden_handover
    weights = cfg.weights()
    started = time.perf_counter()

    # -- teacher --
    if hidden_states is not None:
        store = OfflineHiddenStates(hidden_states)
        source_name, commit, target_model = store.source, store.commit, None
        embed, head = store.embedding(), store.lm_head()
        n_examples = len(store)
        if kind == DraftKind.MTP and store.manifest.get("final") != draft.input_hidden:
            raise DataError(
                f"{hidden_states} holds the {store.manifest.get('final')} final hidden, the draft reads the "
                f"{draft.input_hidden} one (dump it again with this draft)"
            )
        if kind == DraftKind.EAGLE3 and store.aux_layers != draft.aux_layer_ids:
            raise DataError(
                f"{hidden_states} holds aux layers {store.aux_layers}, the draft reads {draft.aux_layer_ids}"
            )
        examples = None
        data_hash = hashlib.sha256((Path(hidden_states) / "manifest.json").read_bytes()).hexdigest()
    else:
        if data is None or target is None:
            raise DataError("distill needs --data and --target (or --hidden-states)")
        target_model = TargetModel(target, revision, token, device=device)
        check_draft_fits(draft, target_model, draft_dir)
        source_name, commit = target, target_model.commit
        tokenizer = load_tokenizer(target_model.path)
        examples, skipped = read_examples(data, tokenizer, cfg.max_length, skip_bad)
        if skipped:
            progress(f"skipped {skipped} malformed line(s) in {data}")
        if regenerate_data:
            # only what this run will see: one pass of steps x batch size examples (data order is seeded)
            examples = examples[: max(cfg.steps * cfg.batch_size, cfg.batch_size)]
            progress(f"regenerating {len(examples)} responses with the target ({'sampled' if sample else 'greedy'})")
            examples = regenerate(
                examples, target_model, tokenizer, cfg.max_length // 2, sample, seed=cfg.seed, progress=progress
            )
        embed, head = target_model.embedding(), target_model.lm_head()
        n_examples = len(examples)
        data_hash = hashlib.sha256(Path(data).read_bytes()).hexdigest()
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    fingerprint = target_model.fingerprint() if target_model is not None else None
    draft.attach_target(embed.to(device), head.to(device))

    def batch_at(step: int, want_final: bool = False, whole: bool = False) -> tuple[dict[str, torch.Tensor], Features]:
        """The step's batch: this rank's rows of the global batch (all of it when `whole`)."""
        idx = batch_indices(step, cfg.batch_size, n_examples, cfg.seed)
        rows = slice(None) if whole else par.rows(len(idx))
        if examples is None:
            batch, feats = offline_features(store, idx[rows], cfg.max_length)
            return batch, _features_to(feats, device)
        batch = collate([examples[i] for i in idx], pad_id)  # padded as the global batch: same shapes on any N
        batch = {k: v[rows] for k, v in batch.items()}
        aux = draft.aux_layer_ids if kind == DraftKind.EAGLE3 else None
        feats = target_model.features(
            batch["input_ids"],
            batch["attention_mask"].to(target_model.device),
            aux_layers=aux,
            want_final=want_final or kind == DraftKind.MTP,
            final=getattr(draft, "input_hidden", None),
        )
        return batch, feats

    # -- draft vocabulary and calibration (fresh runs only: a resumed run finds them in its checkpoint) --
    settings = {
        **asdict(cfg),
        "precision": precision,
        "kind": kind,
        "draft": str(draft_dir),
        "data_hash": data_hash,
        "target": source_name,
    }
    meta: dict[str, Any] = {}
    latest = latest_checkpoint(ckpt_dir) if resume else None
    if resume and latest is None:
        progress(f"no checkpoint in {ckpt_dir}: starting from step 0")
    if kind == DraftKind.EAGLE3 and cfg.draft_vocab_size and latest is None:
        if cfg.draft_vocab_size > draft.vocab_size:
            raise DataError(
                f"--draft-vocab-size {cfg.draft_vocab_size} exceeds the target vocabulary {draft.vocab_size}"
            )
        if examples is None:
            raise DataError("--draft-vocab-size needs --data (token counts) rather than --hidden-states")
        if cfg.draft_vocab_size != draft.draft_vocab_size:
            used = choose_draft_vocab(examples, draft.vocab_size, cfg.draft_vocab_size)
            narrow_vocab(draft, used, head.float())
            counts = token_counts(examples, draft.vocab_size)
            share = counts[used].sum().item() / max(counts.sum().item(), 1)
            progress(
                f"draft vocabulary: the {used.numel()} most frequent target tokens, {share:.1%} of the training targets"
            )
    elif kind == DraftKind.MTP and cfg.draft_vocab_size:
        raise DataError("--draft-vocab-size applies to eagle3 drafts; a native MTP draft shares the target's head")
    calibration = None
    if isinstance(draft, Eagle3Draft) and latest is None and draft.eagle_config.get("mtp2draft_init"):
        batch, feats = batch_at(0, want_final=True, whole=True)  # every rank fits the same, on the whole batch
        native = _native_attention(draft_dir, embed, progress)
        calibration = calibrate_eagle3(draft, feats, batch["attention_mask"], native, batch["input_ids"])
        if calibration and "fc_fit_r2" in calibration:
            note = f"fitted fc to the MTP layer's input on {calibration['tokens']} tokens (R^2 {calibration['fc_fit_r2']:.3f})"
            if "attention_rel_error_after" in calibration:
                note += (
                    f"; attention scales: relative error {calibration['attention_rel_error_before']:.3f} -> "
                    f"{calibration['attention_rel_error_after']:.3f}"
                )
            progress(note)
        elif calibration:
            progress(f"calibrated fc: rms of the high aux layer {calibration['high_aux_rms']:.4g}")
    vocab_ids = draft_target_ids(draft)
    if cfg.steps == 0 and calibration is None:
        raise OptionError(
            "--steps 0 would write an untrained draft: 0 steps only calibrate an EAGLE-3 draft converted from MTP"
        )

    start = 0
    if latest is not None:
        state = json.loads((latest / parallel.STATE_FILE).read_text())
        if state.get("settings_hash") != _settings_hash(settings):
            raise DraftError(f"{latest} was written with other settings: resume with the same options or start over")
        if state["draft_config"].get("draft_vocab_size") != getattr(draft, "draft_vocab_size", None):
            # the checkpoint narrowed the vocabulary: rebuild the head to its size before loading weights
            vd = int(state["draft_config"]["draft_vocab_size"])
            narrow_vocab(draft, torch.arange(vd), head.float())
        if isinstance(draft, Eagle3Draft):
            draft.eagle_config.update(state["draft_config"])
    model, autocast = _prepare(draft, cfg, par, precision, progress)
    params = draft.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if latest is not None:
        meta = load_checkpoint(latest, draft, optimizer, par)
        vocab_ids = draft_target_ids(draft)
        start = int(meta["step"])
        progress(
            f"resuming from {latest.name}" + (f" (written by {meta['world_size']} rank(s))" if par.distributed else "")
        )
    history: list[dict[str, Any]] = meta.get("history", [])
    acc_window: list[list[float]] = []
    draft.train()
    end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    bar = None
    if progress_bar:
        from huggingface_hub.utils import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="distill", unit="step", file=sys.stderr, dynamic_ncols=True)
        log_line = progress
        progress = bar.write  # log lines above the bar, not through it
    for step in range(start, end):
        batch, feats = batch_at(step)
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, cfg)
        with autocast():
            stats = ttt_forward(
                model,
                feats,
                batch["input_ids"].to(device),
                batch["loss_mask"].to(device),
                cfg.ttt_steps,
                weights,
                vocab_ids,
            )
        loss = stats.loss
        if par.distributed:
            stats, loss = _global_stats(stats, weights, par)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        acc = [c / max(n, 1) for c, n in zip(stats.per_step_correct, stats.per_step_count, strict=True)]
        acc_window.append(acc)
        if bar is not None:
            bar.set_postfix_str(f"loss {stats.loss.item():.3f} top-1 " + " ".join(f"{a:.2f}" for a in acc))
            bar.update(1)
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            mean = [sum(a[s] for a in acc_window) / len(acc_window) for s in range(cfg.ttt_steps)]
            history.append({"step": step + 1, "loss": stats.loss.item(), "accuracy": mean})
            progress(
                f"step {step + 1}/{cfg.steps}  loss {stats.loss.item():.4f}  top-1 per step "
                + " ".join(f"{a:.2f}" for a in mean)
                + f"  ({time.perf_counter() - started:.0f} s)"
            )
            acc_window = []
        if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(
                ckpt_dir,
                step + 1,
                draft,
                optimizer,
                {"settings_hash": _settings_hash(settings), "history": history},
                par,
            )
    if bar is not None:
        bar.close()
        progress = log_line
    if end < cfg.steps:  # stopped early on purpose: checkpoints stay, nothing is written
        return DistillResult(out, end, time.perf_counter() - started, [], history, start or None)
    if fingerprint is not None and target_model.fingerprint() != fingerprint:
        raise RuntimeError("the target's weights changed during distillation: this is a bug")
    seconds = time.perf_counter() - started
    final_acc = history[-1]["accuracy"] if history else []
    state = parallel.full_state_dict(draft, par)  # collective: every rank takes part
    if not par.is_main:
        par.barrier()  # rank 0 writes the result, then everyone returns
        return DistillResult(out, cfg.steps, seconds, final_acc, history, start or None, is_main=False)
    _write_result(
        draft,
        draft_dir,
        out,
        overwrite,
        {
            "settings": settings,
            "target_commit": commit,
            "steps": cfg.steps,
            "seconds": round(seconds, 1),
            "final_accuracy_per_step": final_acc,
            "calibration": calibration,
            "history": history,
            "resumed_from_step": start or None,
            "command": command_line(),
            "version": __version__,
            "world_size": par.world,
        },
        state,
    )
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    par.barrier()
    return DistillResult(out, cfg.steps, seconds, final_acc, history, start or None)


def plan_memory(
    draft_dir: str | Path,
    config: DistillConfig | None = None,
    world: int | None = None,
    device: str = "cpu",
    offline: bool = False,
) -> list[memory.MemoryPlan]:
    """`distill --plan`: the per-rank memory plan of every trainable subset, side by side, from the draft's
    config.json alone (the chosen --train-subset first). World size: `world`, else torchrun's, else 1."""
    cfg = config or DistillConfig()
    world = world or int(os.environ.get("WORLD_SIZE", 1))
    precision = parallel.resolve_precision(cfg.precision, device)
    draft_config = read_draft_config(draft_dir)
    subsets = [cfg.train_subset] + [s for s in parallel.TRAIN_SUBSETS if s != cfg.train_subset]
    return [
        memory.plan(
            draft_config,
            world,
            precision,
            cfg.batch_size,
            cfg.max_length,
            cfg.ttt_steps,
            s,
            cfg.activation_checkpointing,
            online_logits=not offline,
        )
        for s in subsets
    ]


def _features_to(feats: Features, device: str) -> Features:
    """Offline features are read on the CPU; the draft may live elsewhere."""
    if device == "cpu":
        return feats
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(feats).items()}
    return Features(**moved)


def _prepare(draft, cfg: DistillConfig, par: Parallel, precision: str, progress: Progress):
    """Subset, activation checkpointing, FSDP2 and compile, in that order, on the loaded (and narrowed) draft.

    Returns (the module ttt_forward calls, a context manager for the step: autocast for one-process bf16)."""
    import contextlib

    frozen = parallel.freeze_subset(draft, cfg.train_subset)
    if frozen:
        progress(f"--train-subset {cfg.train_subset}: {len(frozen)} parameter tensor(s) frozen")
    if cfg.activation_checkpointing:
        parallel.checkpoint_mlp(draft)
    autocast = contextlib.nullcontext
    if par.distributed:
        parallel.broadcast_parameters(draft, par)
        units = parallel.shard(draft, par, precision)
        progress(f"FSDP2 over {par.world} rank(s): units {', '.join(units) or '(root only)'} + root; {precision}")
    elif precision == "bf16":
        device_type = torch.device(par.device).type

        def autocast():
            return torch.autocast(device_type, dtype=torch.bfloat16)

    if cfg.compile:
        parallel.draft_block(draft).compile()
    return draft, autocast


def _global_stats(stats: StepStats, weights: Sequence[float], par: Parallel) -> tuple[StepStats, torch.Tensor]:
    """Stats over the global batch, and the loss this rank back-propagates.

    The 1-rank loss is sum_s w_s * S_s / n_s (S_s: KL summed over the batch's valid tokens, n_s: their count). Each
    rank holds its rows' part of S_s; with the GLOBAL n_s, sum over ranks of the rank losses is the 1-rank loss, and
    FSDP averages gradients over ranks, hence the factor N."""
    k = len(weights)
    counts = par.sum(stats.per_step_count + stats.per_step_correct + [float(x.detach()) for x in stats.per_step_sum])
    n, correct, sums = counts[:k], counts[k : 2 * k], counts[2 * k :]
    loss = sum(weights[s] * stats.per_step_sum[s] / max(n[s], 1.0) for s in range(k)) * par.world
    per_step = [sums[s] / max(n[s], 1.0) for s in range(k)]
    total = torch.tensor(sum(weights[s] * per_step[s] for s in range(k)))
    out = StepStats(total, per_step, [int(c) for c in correct], [int(c) for c in n])
    return out, loss


def _write_result(
    draft,
    draft_dir: str | Path,
    out: Path,
    overwrite: bool,
    info: dict[str, Any],
    full_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """The fine-tuned draft in the same format as its input, provenance extended with a `distill` section.

    full_state: the gathered state dict of a sharded draft (parallel.full_state_dict); else draft.state_dict()."""
    src_cfg = read_draft_config(draft_dir)
    prov_path = Path(draft_dir) / PROVENANCE_FILE
    provenance = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    provenance["distill"] = info
    dtype = {"float32": torch.float32, "float16": torch.float16}.get(src_cfg.get("torch_dtype"), torch.bfloat16)
    buffers = {k for k, _ in draft.named_buffers()}
    state = {
        k: (v.to(dtype) if v.is_floating_point() and k not in buffers else v).detach().cpu().contiguous()
        for k, v in (full_state if full_state is not None else draft.state_dict()).items()
    }
    if isinstance(draft, Eagle3Draft):
        config = {**src_cfg, **draft.draft_config()}
        state = without_identity_maps(state, draft.vocab_size, draft.draft_vocab_size)
    else:
        config = {**src_cfg, **draft.computation(), "engine": draft.engine}
    with atomic_output_dir(out, overwrite, inputs=[draft_dir]) as tmp:
        save_tensors(tmp / WEIGHTS_FILE, state, {"format": "pt"})
        write_json(tmp / CONFIG_FILE, config)
        write_json(tmp / PROVENANCE_FILE, provenance)


__all__ = ["DistillConfig", "distill", "plan_memory", "ttt_forward", "ttt_mask", "NativeMtpDraft"]
