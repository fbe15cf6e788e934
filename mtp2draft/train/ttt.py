"""Training-time test (TTT): the unrolled draft computation and its loss, the math `distill` trains on.

One training sequence gives a chain origin at every position p at once (B batch, T tokens, H hidden):
- step 0 reads the target's features at p and the data token x[p+1]; it predicts x[p+2];
- step s reads the draft's OWN step-(s-1) hidden at p and the data token x[p+s+1]; it predicts x[p+s+2];
- attention at step s for origin p sees the step-0 entries of positions <= p (causal) and, for each earlier step r,
  only origin p's own entry: the KV cache holds one block of T entries per step and the mask is a causal block
  followed by s diagonal blocks; the entry of step s stands at RoPE position p + s + 1 (its input token's position).
  A chain draft (`draft/chain.py`) keeps one cache per layer: step s sees only the blocks of the steps that ran its
  layer, the first of them (step f) at origins <= p - f, the forced chain's entries.
The hidden a step hands on is the one the serving engine hands on (`draft.hidden_handover`), so what is trained is
what is served. The loss is the forward KL from the target's distribution for x[p+s+2] (restricted to the draft
vocabulary for EAGLE-3), weighted per step; top-1 agreement with the target is reported per step.

`tests/test_distill.py` proves the unrolled computation equals the serving-time chain (`evaluate.draft_chain`).

What this module does not do: run the target (`target/hidden.py` gives the `Features`), hold an optimizer, batch data or
write anything (`train/recipe.py`). Nothing here depends on the family: the draft module carries that.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from mtp2draft.draft.eagle3 import Eagle3Draft
from mtp2draft.errors import OptionError
from mtp2draft.target.hidden import Features


def ttt_mask(
    length: int, step: int, dtype: torch.dtype, window: int | None = None, blocks: Sequence[int] | None = None
) -> torch.Tensor:
    """[1, 1, T, (len(blocks))*T] additive mask of step `step`'s queries over the cache blocks of its layer.

    blocks: the steps whose entries the layer's cache holds, ascending, ending with `step` (default: every step
    0..step, one layer at every step). The first block (step f) is the forced chain: origin p sees origins
    p' <= p - f (and itself); every later block only origin p's own entry (the diagonal). f = 0 gives the classic
    TTT mask: causal over step-0 entries, diagonal over steps 1..step.

    window: sliding-window attention sees keys less than `window` positions back (the step-s query of origin p sits
    at p + s + 1, the step-f key of origin j at j + f + 1)."""
    blocks = list(range(step + 1)) if blocks is None else list(blocks)
    first = blocks[0]
    p = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    forced = (j <= p - first) | (j == p)
    if window:
        forced &= j > p + (step - first) - window
    allowed = [forced]
    allowed += [torch.eye(length, dtype=torch.bool)] * (len(blocks) - 1)
    mask = torch.zeros(length, len(blocks) * length, dtype=dtype)
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
    """A full-logits (online) teacher's log-probs for the token at p + offset + 1, given at index p.

    Returns ([B, T, V'] log-probs over the draft vocabulary `vocab_ids` (the target's when None),
    [B, T] the target's own top-1 id over its full vocabulary)."""
    logits = shift(features.logits, offset, 0.0)
    top1 = logits.argmax(-1)
    if vocab_ids is not None:
        logits = logits.index_select(-1, vocab_ids)
    return torch.log_softmax(logits.float(), dim=-1), top1


# step_kl cannot sharpen a top-k teacher; distill refuses the pair in these words before any work
TOP_K_NOT_SHARPENED = "--teacher-temperature needs the online target: a top-k dump keeps no tail to sharpen"


def step_kl(
    logits: torch.Tensor,
    features: Features,
    offset: int,
    vocab_ids: torch.Tensor | None,
    vocab_size: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward KL(target || draft) for the token at p + offset + 1, at index p: ([B, T] KL, [B, T] whether a
    teacher exists there, [B, T] the target's top-1 id). logits: [B, T, V'] the draft's.

    Online (full logits): the dense KL over the draft vocabulary, the target's distribution sharpened to
    p**(1/temperature) first (log p / T renormalised; T -> 0 is cross-entropy on its top token). Offline (the
    target's top-k log-probs only): `top_k_kl`, at temperature 1 only."""
    if features.logits is None:
        if temperature != 1.0:
            raise OptionError(TOP_K_NOT_SHARPENED)
        return top_k_kl(logits, features, offset, vocab_ids, vocab_size)
    teacher, top1 = teacher_logprobs(features, offset, vocab_ids, vocab_size)
    if temperature != 1.0:
        teacher = torch.log_softmax(teacher / temperature, dim=-1)  # [B, T, V']; -inf (no teacher) stays -inf
    logq = torch.log_softmax(logits.float(), dim=-1)
    p = teacher.exp()
    kl = (p * (teacher.clamp(min=-1e30) - logq)).sum(-1)  # [B, T]
    return kl, torch.isfinite(teacher).any(-1), top1


def top_k_kl(
    logits: torch.Tensor, features: Features, offset: int, vocab_ids: torch.Tensor | None, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`step_kl` for an offline teacher that kept only its top-k log-probs (full-vocabulary log-probs, so the k
    probabilities sum to the mass they cover, m <= 1).

    The teacher is the k ids plus one tail bucket holding the mass they do not cover, 1 - m; the draft is read the
    same way: its probabilities of the k ids and, as its tail, everything else (log q = logit - logsumexp, so no
    [B, T, V'] teacher is built). Dropping the tail instead (renormalising the k ids) teaches the draft to put no
    mass outside them: on the bundled tiny-mimo, whose top-64 covers 62 % of the mass, that cost a quarter of the
    online distill's acceptance, while the tail bucket matches it (docs/results.md, "Offline teacher").
    With k = the whole vocabulary the tail is empty and this is the online KL. Ids outside a reduced draft
    vocabulary drop out (their mass too) and the rest is renormalised, as online; the tail is taken to lie inside
    the draft vocabulary, which the files cannot tell."""
    values, col, ids = _topk_columns(features, offset, vocab_ids, vocab_size)  # [B, T, k] each
    covered = shift(features.topk_logprobs, offset, -math.inf).exp().sum(-1)  # [B, T] m, draft vocabulary or not
    p = values.exp()  # [B, T, k]: 0 for ids outside the draft vocabulary and past the end
    tail = (1 - covered).clamp(min=0)  # [B, T]
    has_teacher = p.sum(-1) > 0
    norm = torch.where(has_teacher, p.sum(-1) + tail, torch.ones_like(tail))  # [B, T]
    p, tail = p / norm[..., None], tail / norm
    flat = logits.float()
    logq = flat.gather(-1, col.clamp(min=0)) - torch.logsumexp(flat, dim=-1, keepdim=True)  # [B, T, k]
    q_tail = (1 - (logq.exp() * (p > 0)).sum(-1)).clamp(min=1e-12)  # the draft's mass outside the kept ids
    kl = (p * (p.clamp(min=1e-30).log() - logq)).sum(-1) + tail * (tail.clamp(min=1e-30).log() - q_tail.log())
    return kl, has_teacher, ids[..., 0]


def _topk_columns(
    features: Features, offset: int, vocab_ids: torch.Tensor | None, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An offline teacher's top-k at p + offset + 1: ([B, T, k] log-probs, -inf where the id is outside the draft
    vocabulary or past the end; [B, T, k] draft-vocabulary column of each id, -1 if absent; [B, T, k] target ids)."""
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
    return values.masked_fill(col < 0, -math.inf), col, ids


def _unrolled(draft, hidden: torch.Tensor, input_ids: torch.Tensor, ttt_steps: int) -> Iterator[torch.Tensor]:
    """The logits of the draft's `ttt_steps` steps over every origin of a batch, in order, from the step-0 hidden
    [B, T, H] (`draft.initial_hidden` of the target's features). input_ids: [B, T]."""
    b, t = input_ids.shape
    dtype = hidden.dtype
    cache = draft.new_cache()  # one DraftCache, or one per layer of a chain draft
    layer_of = getattr(draft, "layer_at", lambda _s: 0)
    positions = torch.arange(t, device=input_ids.device).expand(b, -1)
    for s in range(ttt_steps):
        tokens = shift(input_ids, s + 1)  # x[p + s + 1]: the token step s reads
        blocks = [r for r in range(s + 1) if layer_of(r) == layer_of(s)]  # the steps in this step's layer cache
        mask = ttt_mask(t, s, dtype, getattr(draft, "attention_window", None), blocks).to(hidden.device)
        logits, hidden = draft(tokens, hidden, positions + s + 1, attention_mask=mask, cache=cache, step=s)
        yield logits


def ttt_logits(draft, features: Features, input_ids: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
    """The logits [B, T, V] of each of `ttt_steps` unrolled draft steps over every origin of a batch (no loss), as
    `ttt_forward` computes them. input_ids: [B, T]; features: the target's, for the same [B, T]."""
    hidden = draft.initial_hidden(features.step0_input(draft.kind))  # [B, T, H]
    return list(_unrolled(draft, hidden, input_ids, ttt_steps))


def ttt_forward(
    draft,
    features: Features,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    ttt_steps: int,
    step_weights: Sequence[float],
    vocab_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> StepStats:
    """Unroll `ttt_steps` draft steps over every origin of a batch; loss (the KL to the target's distribution at
    `temperature`, `step_kl`) and per-step top-1 agreement.

    input_ids, loss_mask: [B, T]; features: the target's, for the same [B, T]."""
    hidden = draft.initial_hidden(features.step0_input(draft.kind))  # [B, T, H]
    total = hidden.new_zeros(())
    losses, correct, counts, sums = [], [], [], []
    for s, logits in enumerate(_unrolled(draft, hidden, input_ids, ttt_steps)):
        # the predicted token x[p + s + 2] must exist and be a loss token
        valid = shift(loss_mask, s + 2, False)
        kl, has_teacher, target_top1 = step_kl(logits, features, s + 1, vocab_ids, draft.vocab_size, temperature)
        valid = valid & has_teacher  # offline: no top-k id inside the draft vocabulary
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
    return StepStats(total, losses, correct, counts, sums)
