"""The math of distilling a DSpark drafter against its frozen target: anchors, the teacher per block slot, the loss.

One training sequence [B, S] gives many blocks at once. Anchors are drawn at random among the positions a where a
block can start (DeepSpec's `sample_anchor_positions`: a and its first label a + 1 are both in the loss mask), up to
`DSparkObjective.anchors` per sequence; slot k of the block at a predicts the token at a + k + 1.

The teacher is the target's own distribution, as for the MTP path (`train/ttt.py`): slot k's teacher is the target's
logits at position a + k (its next-token distribution for a + k + 1, given the data up to a + k), and its label is
that distribution's greedy token. The drafter reads the data tokens (the Markov head's previous token, the anchor),
exactly as the target did. The loss is DeepSpec's (`draft.dspark.dspark_loss`).

Acceptance is measured teacher-forced, per slot: slot k of a block counts as accepted when the drafter's top-1 equals
the target's greedy token at slots 0..k (greedy verification stops at the first miss). `slot_rates` turns the counts
into the rate per slot and the mean accepted length per block they imply: a proxy, since a real decode drafts from
the target's own tokens (`evaluate` measures that).

What this module does not do: run the target, hold an optimizer or write files (`train/dspark_run.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtp2draft.draft.dspark import dspark_loss, eval_mask, pooled_context
from mtp2draft.train.settings import DSparkObjective


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, S]: position a may anchor a block (a < S - 1, loss_mask[a] and loss_mask[a + 1]), DeepSpec's
    `build_anchor_candidate_mask`."""
    mask = loss_mask.bool()
    out = torch.zeros_like(mask)
    out[:, :-1] = mask[:, :-1] & mask[:, 1:]
    return out


def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors [B, nb] (ascending) and keep [B, nb], nb = min(num_anchors, S - 1): a random subset of each row's
    candidates; a row with fewer candidates than nb keeps them all and pads with anchor 0, keep False."""
    valid = anchor_candidates(loss_mask)[:, :-1]  # [B, S - 1]: the last position has no label
    b, n = valid.shape
    nb = max(1, min(num_anchors, n))
    if n == 0:
        return torch.zeros(b, nb, dtype=torch.long), torch.zeros(b, nb, dtype=torch.bool)
    noise = torch.rand(b, n, generator=generator).to(loss_mask.device)
    noise = noise.masked_fill(~valid, 2.0)  # candidates first, in random order
    order = noise.argsort(dim=1)[:, :nb]
    keep = valid.gather(1, order)
    anchors = torch.where(keep, order, torch.full_like(order, n + 1)).sort(dim=1).values
    keep = torch.arange(nb, device=anchors.device)[None] < keep.sum(1, keepdim=True)  # kept ones sort first
    return torch.where(keep, anchors, torch.zeros_like(anchors)), keep


def slot_logits(logits: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """The target's logits [B, S, V] at positions anchor + 0..bs-1 (clamped inside the sequence; the eval mask
    drops the clamped slots): [B, nb, bs, V], slot k's teacher for the token at anchor + k + 1."""
    b, s, v = logits.shape
    at = (anchors[..., None] + torch.arange(block_size, device=anchors.device)).clamp(max=s - 1)  # [B, nb, bs]
    return logits.gather(1, at.flatten(1)[..., None].expand(-1, -1, v)).view(b, *at.shape[1:], v)


@dataclass
class BlockStats:
    """One batch's loss and its teacher-forced acceptance counts per slot."""

    loss: torch.Tensor
    accepted: list[int]  # [bs]: blocks whose slots 0..k all matched the target's greedy token
    counted: list[int]  # [bs]: blocks whose slot k is evaluated (its label inside the sequence and the loss mask)


def block_step(
    draft,
    context: torch.Tensor,
    input_ids: torch.Tensor,
    target_logits: torch.Tensor,
    blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    objective: DSparkObjective,
) -> BlockStats:
    """The drafter over `blocks` = (anchors, keep, loss_mask) of one batch: DeepSpec's loss against the target and
    the acceptance counts. context [B, S, n*H] (pooled target layers), input_ids [B, S], target_logits [B, S, V]."""
    anchors, keep, loss_mask = blocks
    bs = draft.block_size
    out = draft(input_ids, context, anchors, keep)
    mask = eval_mask(anchors, keep, loss_mask, bs)  # [B, nb, bs]
    teacher = slot_logits(target_logits, anchors, bs)  # [B, nb, bs, V]
    labels = teacher.argmax(-1)  # the target's greedy token for anchor + k + 1
    gamma = objective.loss_decay_gamma or None  # 0 or None: no decay
    loss = dspark_loss(out, labels, mask, teacher, decay_gamma=gamma, weights=objective.weights)
    with torch.no_grad():
        hit = (out.logits.argmax(-1) == labels) & mask
        accepted = hit.int().cumprod(dim=-1).bool()
        counts = (accepted.sum(dim=(0, 1)).tolist(), mask.sum(dim=(0, 1)).tolist())
    return BlockStats(loss, [int(c) for c in counts[0]], [int(c) for c in counts[1]])


def context_of(aux: torch.Tensor | None) -> torch.Tensor:
    """The drafter's `targets` from `Features.aux`: the target layers concatenated, residual streams pooled."""
    if aux is None:
        raise ValueError("the target's features hold no aux layers: a DSpark drafter reads its target layers")
    return pooled_context(aux)


def slot_rates(accepted: list[int], counted: list[int]) -> tuple[list[float], float]:
    """Per-slot teacher-forced acceptance (slots 0..k all accepted, over the blocks where slot k is evaluated) and
    the mean accepted length per block it implies (their sum)."""
    rates = [a / c if c else 0.0 for a, c in zip(accepted, counted, strict=True)]
    return rates, sum(rates)
