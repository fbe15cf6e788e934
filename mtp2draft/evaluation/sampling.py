"""Speculative sampling: how the chain loop in `decode.py` picks, proposes and verifies tokens at a temperature.

The loop calls one sampler object at three points, so the same loop runs greedy and sampled decoding:
- `first(logits)`: the token the prefill emits;
- `propose(logits_d, draft)`: draft step j's token d[j] (a target id) and the distribution q_j it was drawn from;
- `verify(vlogits, proposal, qs, draft)`: from the target's logits at the k + 1 verified positions, the number of
  accepted draft tokens a and the token emitted after them.

`Greedy` (temperature 0) is today's greedy verification, bit for bit: argmax everywhere, accept while d[j] equals the
target's argmax, the target's argmax after them. `Speculative` is speculative sampling (Leviathan et al. 2023; Chen
et al. 2023): p and q are the target's and draft's softmax at the same temperature and top-p; d[j] is accepted with
probability min(1, p(d) / q(d)); at the first rejection the token is drawn from the normalised residual max(0, p - q);
when all k are accepted the bonus token is drawn from p at position k. Proposing by argmax makes q one-hot (accept with
probability p(d); the residual is p without d, renormalised): the draft's softmax is not what argmax proposals are
drawn from, and using it as q would bias the output. A reduced draft vocabulary (EAGLE-3's d2t) puts q at zero outside
it. The output is then distributed exactly as the target's own sampling (tests/test_sampling.py proves it by
enumeration and statistically).

The rule's four pieces live in `Rule` and all randomness goes through a `Randomness` object, so tests can inject wrong
rules or enumerate every random outcome while running the real loop. `pit` and `ks_uniform` are the randomised
probability-integral transform and Kolmogorov-Smirnov test the statistical check uses.

What this module does not do: run models, hold or crop caches, or decide which positions are verified (`decode.py`
does); nucleus filtering beyond top-p (no top-k, no min-p); batching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from mtp2draft.errors import OptionError
from mtp2draft.kinds import DRAFT_SAMPLING


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by the target and the draft. temperature 0 is greedy decoding (top_p unused)."""

    temperature: float = 0.0
    top_p: float = 1.0
    draft_sampling: str = "greedy"

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise OptionError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise OptionError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise OptionError(f"--draft-sampling must be one of {', '.join(DRAFT_SAMPLING)}, got {self.draft_sampling}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution [..., V] (float64) of logits [..., V]: softmax(logits / T), then top-p (the smallest
    set of most probable tokens whose mass reaches top_p, always at least the top one) renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token: [..., V]
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def to_target_vocab(q: torch.Tensor, draft, vocab_size: int) -> torch.Tensor:
    """q [V_draft] over the draft's vocabulary -> [V] over the target's (zero outside the draft vocabulary)."""
    if q.shape[-1] == vocab_size:  # full vocabulary: the identity map
        return q
    ids = draft.to_target_ids(torch.arange(q.shape[-1], device=q.device))
    return torch.zeros(vocab_size, dtype=q.dtype, device=q.device).index_add_(0, ids, q)


class Randomness(Protocol):
    """Every random decision speculative sampling makes: a draw from a distribution, a biased coin."""

    def draw(self, probs: torch.Tensor) -> int:
        """A token id drawn from probs [V]."""
        ...

    def coin(self, prob: float) -> bool:
        """True with probability `prob`."""
        ...


class TorchRandomness:
    """Seeded draws from a torch.Generator (CPU, so a seed gives the same output on every machine)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.double().cpu(), 1, generator=self.generator))

    def coin(self, prob: float) -> bool:
        return prob >= 1 or float(torch.rand((), dtype=torch.float64, generator=self.generator)) < prob


class Rule:
    """Speculative sampling's rule, one method per piece, each elementwise over leading dimensions (so tests can also
    compute a rule's exact output distribution in bulk). Tests subclass it to inject wrong rules into the real loop."""

    def proposal(self, logits_d: torch.Tensor, s: Sampling) -> torch.Tensor:
        """The distribution [..., V_draft] draft tokens are drawn from: one-hot at the argmax, or the warped softmax."""
        if s.draft_sampling == "greedy":
            return torch.nn.functional.one_hot(logits_d.argmax(-1), logits_d.shape[-1]).double()
        return warp(logits_d, s.temperature, s.top_p)

    def verify_q(self, logits_d: torch.Tensor, proposal: torch.Tensor, s: Sampling) -> torch.Tensor:
        """The q [..., V_draft] verification divides by: exactly the distribution the token was drawn from."""
        return proposal

    def accept_prob(self, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
        """Probability of accepting draft token x: min(1, p(x) / q(x)) (q(x) > 0: x was drawn from q)."""
        return (p_x / q_x).clamp(max=1.0)

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """What a rejection draws from: max(0, p - q) normalised [..., V]. It has mass whenever a rejection can happen
        (p != q); p itself is returned where rounding leaves none."""
        r = (p - q).clamp(min=0)
        total = r.sum(-1, keepdim=True)
        return torch.where(total > 0, r / total.clamp(min=torch.finfo(r.dtype).tiny), p)

    def bonus(self, p: torch.Tensor) -> torch.Tensor:
        """What the token after k accepted drafts is drawn from: the target's p [..., V] at position k."""
        return p


class Greedy:
    """Temperature 0: greedy verification, exactly as `evaluate` has always decoded."""

    def first(self, logits: torch.Tensor) -> int:
        return int(logits.argmax())

    def propose(self, logits_d: torch.Tensor, draft) -> tuple[int, None]:
        return int(draft.to_target_ids(logits_d.argmax())), None

    def verify(self, vlogits: torch.Tensor, proposal: list[int], qs: list, draft) -> tuple[int, int]:
        """vlogits [k + 1, V]: accept the longest prefix equal to the target's argmax; its argmax after it."""
        greedy = vlogits.argmax(-1).tolist()
        a = 0
        while a < len(proposal) and proposal[a] == greedy[a]:
            a += 1
        return a, greedy[a]


class Speculative:
    """Speculative sampling at `sampling`'s temperature and top-p, drawing through `rng` with `rule`."""

    def __init__(self, sampling: Sampling, rng: Randomness, rule: Rule | None = None) -> None:
        if sampling.greedy:
            raise OptionError("speculative sampling needs --temperature > 0 (temperature 0 is greedy decoding)")
        self.s, self.rng, self.rule = sampling, rng, rule or Rule()

    def p(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's sampling distribution [..., V] of logits [..., V]."""
        return warp(logits, self.s.temperature, self.s.top_p)

    def first(self, logits: torch.Tensor) -> int:
        return self.rng.draw(self.p(logits))

    def propose(self, logits_d: torch.Tensor, draft) -> tuple[int, torch.Tensor]:
        """logits_d [V_draft] -> (the drawn token as a target id, the q [V_draft] verification uses)."""
        proposal = self.rule.proposal(logits_d, self.s)
        d = self.rng.draw(proposal)
        q = self.rule.verify_q(logits_d, proposal, self.s)
        return int(draft.to_target_ids(torch.tensor(d, device=logits_d.device))), q

    def verify(self, vlogits: torch.Tensor, proposal: list[int], qs: list[torch.Tensor], draft) -> tuple[int, int]:
        """vlogits [k + 1, V]: row j is the target at the position draft token j fills (row k: the bonus's)."""
        p = self.p(vlogits)  # [k + 1, V]
        for j, x in enumerate(proposal):
            q = to_target_vocab(qs[j], draft, p.shape[-1]).to(p.device)  # [V]
            if not self.rng.coin(float(self.rule.accept_prob(p[j, x], q[x]))):
                return j, self.rng.draw(self.rule.residual(p[j], q))
        return len(proposal), self.rng.draw(self.rule.bonus(p[len(proposal)]))


def make_sampler(sampling: Sampling, seed: int, rule: Rule | None = None) -> Greedy | Speculative:
    """The sampler `speculative_decode` takes: Greedy at temperature 0, else seeded speculative sampling."""
    return Greedy() if sampling.greedy else Speculative(sampling, TorchRandomness(seed), rule)


# ---- the statistical check: randomised PIT + Kolmogorov-Smirnov ----------------------------------------------------
def pit(probs: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Randomised probability-integral transform [n] of tokens [n] under probs [n, V], noise [n] uniform on [0, 1).

    Tokens are ordered by decreasing probability (ties by id), F is the CDF in that order, and
    u = F(x) - noise * p(x). If every token is drawn from its row of probs, u is i.i.d. uniform on [0, 1) (given the
    past, each u is uniform), and only then."""
    probs = probs.double()
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices  # [n, V]
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(probs.shape[-1]).expand_as(order))
    sorted_probs = probs.gather(-1, order)
    cdf = sorted_probs.cumsum(-1).gather(-1, rank.gather(-1, tokens[:, None]))[:, 0]  # F(x): [n]
    p_x = probs.gather(-1, tokens[:, None])[:, 0]
    return (cdf - noise.double() * p_x).clamp(0, 1)


def ks_uniform(u: torch.Tensor) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov test of u [n] against uniform on [0, 1]: (D, asymptotic p-value, with
    Stephens' small-sample correction)."""
    x = torch.sort(u.double()).values
    n = x.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    d = float(torch.maximum(i / n - x, x - (i - 1) / n).max())
    return d, kolmogorov_sf((math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d)


def kolmogorov_sf(t: float) -> float:
    """P(K > t) for the Kolmogorov distribution: 2 sum_j (-1)^(j-1) exp(-2 j^2 t^2)."""
    if t < 0.2:
        return 1.0
    return max(0.0, min(1.0, 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * t * t) for j in range(1, 101))))
