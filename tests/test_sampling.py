"""Speculative sampling is lossless in distribution, and the tests that say so fail on wrong rules.

(a) exact: toy target and draft "models" with a vocabulary of 3 whose p and q depend on the whole prefix run through
    the real loop (`evaluate.speculative_decode`, real cache cropping) with every random outcome enumerated (the
    randomness is injected); the distribution of the emitted tokens must equal the target's own autoregressive
    distribution to 1e-9. Chains of k = 2 with the bonus token visible, several rounds, so p read from the wrong
    position or a target cache cropped wrong changes the result (both are shown to be caught).
(b) statistical, on the bundled tiny-mimo target with its raw MTP head: see `test_pit_is_uniform_on_a_bundled_target`.
(c) both fail on each wrong rule in WRONG_RULES, injected into the same loop as a `Rule` subclass.
"""

from __future__ import annotations

import importlib
import zlib
from collections import defaultdict
from itertools import product

import pytest
import torch

from mtp2draft.sampling import Rule, Sampling, Speculative, warp

ev = importlib.import_module("mtp2draft.evaluate")  # the package exports the function under this name

V = 3  # toy vocabulary


def _code(*values: int) -> int:
    """A deterministic 24-bit code of a tuple of small ints (exact in float64)."""
    return zlib.crc32(bytes(v % 256 for v in values) + bytes(len(values) % 256)) & 0xFFFFFF


def _toy_logits(code: int, scale: float, size: int) -> torch.Tensor:
    return scale * torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(code))


class ToyCache:
    """The tokens the toy target has seen; crop() takes transformers' negative 'drop this many' form too."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def get_seq_length(self) -> int:
        return len(self.tokens)

    def crop(self, length: int) -> None:
        self.tokens = self.tokens[: length if length >= 0 else len(self.tokens) + length]


class ToyTarget:
    """TargetRunner's interface: logits [n, 3] at each new position depend on the whole prefix in the cache, and the
    feature [1, n, 1] is a code of that prefix (so the draft's q depends on it too)."""

    def start(self) -> ToyCache:
        return ToyCache()

    def forward(self, ids: list[int], cache: ToyCache) -> tuple[torch.Tensor, torch.Tensor]:
        rows, feats = [], []
        for t in ids:
            cache.tokens.append(t)
            code = _code(*cache.tokens)
            rows.append(_toy_logits(code, 1.5, V))
            feats.append(float(code))
        return torch.stack(rows), torch.tensor(feats, dtype=torch.float64)[None, :, None]

    def p(self, prefix: list[int], s: Sampling) -> torch.Tensor:
        return warp(_toy_logits(_code(*prefix), 1.5, V), s.temperature, s.top_p)


class ToyDraft:
    """The draft's interface: step reads (hidden code, token) and returns logits over its vocabulary and the next
    hidden code. q therefore depends on the prefix. With `d2t`, a reduced vocabulary: draft id i is target id
    i + d2t[i]. One token per step is masked out (-inf), which keeps the enumeration small."""

    kind = "mtp"

    def __init__(self, d2t: list[int] | None = None) -> None:
        self.d2t = torch.tensor(d2t or [0] * V)
        self.vocab = len(self.d2t)

    def initial_hidden(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def __call__(self, input_ids, hidden, position_ids, attention_mask=None, cache=None):
        codes = [_code(int(h), int(t), 7) for h, t in zip(hidden[0, :, 0].tolist(), input_ids[0].tolist(), strict=True)]
        logits = torch.stack([_toy_logits(c, 1.5, self.vocab) for c in codes])
        if self.vocab == V:
            logits[torch.arange(len(codes)), torch.tensor([c % V for c in codes])] = float("-inf")
        return logits[None], torch.tensor(codes, dtype=torch.float64)[None, :, None]


class Scripted:
    """Randomness that replays `script` (the values of the first decisions) and then takes the first possible value,
    recording every decision's possible values with their probabilities and the path's probability."""

    def __init__(self, script: list) -> None:
        self.script, self.taken, self.options, self.prob = script, [], [], 1.0

    def _pick(self, options: list[tuple[object, float]]):
        i = len(self.taken)
        value = self.script[i] if i < len(self.script) else options[0][0]
        self.options.append(options)
        self.taken.append(value)
        self.prob *= dict(options)[value]
        return value

    def draw(self, probs: torch.Tensor) -> int:
        return self._pick([(v, pv) for v, pv in enumerate(probs.tolist()) if pv > 0])

    def coin(self, prob: float) -> bool:
        return self._pick([(b, pb) for b, pb in ((True, prob), (False, 1.0 - prob)) if pb > 0])


def output_distribution(run) -> dict[tuple[int, ...], float]:
    """The exact distribution of run(randomness)'s output, by depth-first enumeration of every random outcome."""
    dist: dict[tuple[int, ...], float] = defaultdict(float)
    stack: list[list] = [[]]
    while stack:
        script = stack.pop()
        rng = Scripted(script)
        dist[tuple(run(rng))] += rng.prob
        for i in range(len(script), len(rng.taken)):
            stack.extend(rng.taken[:i] + [alt] for alt, _ in rng.options[i][1:])
    return dict(dist)


def autoregressive(target: ToyTarget, prompt: list[int], n: int, s: Sampling) -> dict[tuple[int, ...], float]:
    """The target's own sampling distribution of its next n tokens."""
    dist = {}
    for seq in product(range(V), repeat=n):
        prob = 1.0
        for i, x in enumerate(seq):
            prob *= float(target.p(prompt + list(seq[:i]), s)[x])
        if prob > 0:
            dist[seq] = prob
    return dist


def max_error(a: dict, b: dict) -> float:
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


# (sampling, d2t, k, new tokens): a round that accepts all k drafts shows its bonus token within the new tokens, one
# that rejects early is followed by another round on the cropped cache. Sizes keep each enumeration to ~2,000 runs.
EXACT_CASES = {
    "argmax proposals": (Sampling(1.0, 1.0, "greedy"), None, 3, 5),
    "sampled proposals, top-p": (Sampling(0.7, 0.9, "sample"), None, 3, 5),
    "sampled proposals, reduced draft vocab": (Sampling(1.3, 1.0, "sample"), [0, 1], 2, 4),  # draft 0, 1 -> target 0, 2
}
PROMPT = [1, 2]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (30x on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def exact_error(case: str, rule: Rule | None = None, runner=None, small: bool = False) -> float:
    """Largest difference between the loop's exact output distribution and the target's own, for EXACT_CASES[case]
    (small: k = 2 and 4 new tokens, still with the bonus token visible and several rounds)."""
    s, d2t, k, new = EXACT_CASES[case]
    k, new = (2, 4) if small else (k, new)
    target, draft = ToyTarget(), ToyDraft(d2t)

    def run(rng):
        sampler = Speculative(s, rng, rule)
        return ev.speculative_decode(runner or target, draft, PROMPT, k, new, None, sampler)[0]

    dist = output_distribution(run)
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    return max_error(dist, autoregressive(target, PROMPT, new, s))


@pytest.mark.parametrize("case", EXACT_CASES)
def test_output_distribution_is_exactly_the_targets(case: str) -> None:
    assert exact_error(case) < 1e-9


class ShiftedTarget(ToyTarget):
    """A loop bug: p read one position late (row j + 1 where row j belongs)."""

    def forward(self, ids, cache):
        logits, feats = super().forward(ids, cache)
        return torch.cat([logits[1:], logits[-1:]]), feats


def test_enumeration_catches_p_from_the_wrong_position_and_a_bad_crop(monkeypatch: pytest.MonkeyPatch) -> None:
    case = "sampled proposals, top-p"
    assert exact_error(case, runner=ShiftedTarget(), small=True) > 1e-3
    crop = ev._crop
    monkeypatch.setattr(ev, "_crop", lambda cache, length: crop(cache, length + 1))  # keeps one rejected token
    assert exact_error(case, small=True) > 1e-3


# ---- wrong rules (c) ---------------------------------------------------------------------------------------------
class ResidualFromP(Rule):
    """After a rejection, draw from p instead of the residual."""

    def residual(self, p, q):
        return p


class AlwaysAccept(Rule):
    """No min(1, p/q) test at all: every draft token accepted."""

    def accept_prob(self, p_x, q_x):
        return 1.0


class AcceptWithP(Rule):
    """The ratio without q: accept with probability p(x), as if a sampled proposal were one-hot."""

    def accept_prob(self, p_x, q_x):
        return min(1.0, p_x)


class QAtWrongTemperature(Rule):
    """Tokens drawn at the temperature, q for verification at twice it."""

    def verify_q(self, logits_d, proposal, s):
        return warp(logits_d, 2 * s.temperature, s.top_p)


class SoftmaxQForArgmax(Rule):
    """Argmax proposals verified against the draft's softmax instead of the one-hot they were drawn from."""

    def verify_q(self, logits_d, proposal, s):
        return warp(logits_d, s.temperature, s.top_p)


class NoBonus(Rule):
    """No bonus token drawn from p after k acceptances: the greedy loop's argmax stands in for it. (Dropping the
    bonus outright is lossless, only slower: the next round then verifies from the last draft token.)"""

    def bonus(self, p):
        return torch.nn.functional.one_hot(p.argmax(), p.shape[-1]).double()


# each wrong rule with the proposal mode it is a bug in
WRONG_RULES = {
    "residual from p": (ResidualFromP, "sample"),
    "residual from p, argmax proposals": (ResidualFromP, "greedy"),
    "no min: always accept": (AlwaysAccept, "sample"),
    "no min: accept with p(x)": (AcceptWithP, "sample"),
    "q at the wrong temperature": (QAtWrongTemperature, "sample"),
    "softmax q for argmax proposals": (SoftmaxQForArgmax, "greedy"),
    "no bonus token": (NoBonus, "greedy"),
}


@pytest.mark.parametrize("name", WRONG_RULES)
def test_enumeration_fails_on_wrong_rules(name: str) -> None:
    rule, mode = WRONG_RULES[name]
    assert (
        exact_error("argmax proposals" if mode == "greedy" else "sampled proposals, top-p", rule(), small=True) > 1e-3
    )
