"""Speculative sampling is lossless in distribution, and the tests that say so fail on wrong rules.

(a) exact: toy target and draft "models" with a vocabulary of 3 whose p and q depend on the whole prefix run through
    the real loop (`evaluate.speculative_decode`, real cache cropping) with every random outcome enumerated (the
    randomness is injected); the distribution of the emitted tokens must equal the target's own autoregressive
    distribution to 1e-9. Chains of k = 2 and 3 with the bonus token visible, several rounds, so p read from the
    wrong position or a target cache cropped wrong changes the result (both are shown to be caught). A wrong draft
    cache cannot change the distribution (any q is lossless), only acceptance: test_evaluate's forced-chain test
    pins that.
(b) statistical, on the bundled tiny-mimo target with its raw MTP head made far from p, through `evaluate`'s own
    distribution check (`emitted_pit`): see `sample_sizes` for how the sample size follows from the wrong rules'
    exact distance on that target.
(c) both fail on each wrong rule in WRONG_RULES, injected into the same loop as a `Rule` subclass.
"""

from __future__ import annotations

import importlib
import math
import zlib
from collections import defaultdict
from itertools import product
from pathlib import Path

import pytest
import torch

from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.evaluation.sampling import Rule, Sampling, Speculative, TorchRandomness, ks_uniform, warp
from mtp2draft.kinds import DRAFT_SAMPLING
from mtp2draft.target.hidden import TargetModel

ev = importlib.import_module("mtp2draft.evaluation.decode")  # the package exports the function under this name

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

    device = torch.device("cpu")

    def start(self, rollback: int = 0) -> ToyCache:  # a cache of token rows: any rollback is a crop
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
        prob = 0.0 if math.isnan(prob) else min(prob, 1.0)  # as TorchRandomness: NaN (a wrong rule's 0/0) rejects
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
        return torch.ones_like(p_x)


class AcceptWithP(Rule):
    """The ratio without q: accept with probability p(x), as if a sampled proposal were one-hot."""

    def accept_prob(self, p_x, q_x):
        return p_x.clamp(max=1.0)


class QAtWrongTemperature(Rule):
    """Tokens drawn at the temperature, q for verification at half of it."""

    def verify_q(self, logits_d, proposal, s):
        return warp(logits_d, s.temperature / 2, s.top_p)


class SoftmaxQForArgmax(Rule):
    """Argmax proposals verified against the draft's softmax instead of the one-hot they were drawn from."""

    def verify_q(self, logits_d, proposal, s):
        return warp(logits_d, s.temperature, s.top_p)


class NoBonus(Rule):
    """No bonus token drawn from p after k acceptances: the greedy loop's argmax stands in for it. (Dropping the
    bonus outright is lossless, only slower: the next round then verifies from the last draft token.)"""

    def bonus(self, p):
        return torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).double()


# each wrong rule with the proposal mode both tests run it in (the exact test's case for that mode, the statistical
# test's draft proposing that way); residual-from-p also breaks argmax proposals, but the statistical test would need
# ~3,000 tokens to see it there (distance 0.06 with the raw head's 20 % acceptance), so it runs with sampled ones.
WRONG_RULES = {
    "residual from p": (ResidualFromP, "sample"),
    "no min: always accept": (AlwaysAccept, "sample"),
    "no min: accept with p(x)": (AcceptWithP, "sample"),
    "q at the wrong temperature": (QAtWrongTemperature, "sample"),
    "softmax q for argmax proposals": (SoftmaxQForArgmax, "greedy"),
    "no bonus token": (NoBonus, "sample"),
}


@pytest.mark.parametrize("name", WRONG_RULES)
def test_enumeration_fails_on_wrong_rules(name: str) -> None:
    rule, mode = WRONG_RULES[name]
    assert (
        exact_error("argmax proposals" if mode == "greedy" else "sampled proposals, top-p", rule(), small=True) > 1e-3
    )


# ---- (b) statistical: the randomised PIT on a bundled target ------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
TINY_MIMO, HELDOUT = ROOT / "examples" / "targets" / "tiny-mimo", ROOT / "examples" / "data" / "heldout.jsonl"
STAT = Sampling(1.0, 1.0, "sample")  # the statistical test's setting (per-rule proposal mode from WRONG_RULES)
STAT_K, STAT_NEW, ALPHA = 1, 48, 1e-3
# Sample size: the KS statistic of n tokens from a rule at distance D (sup |G(u) - u| of its PIT's CDF) is about
# D + N(0, ~0.5 / sqrt(n)); ALPHA = 1e-3 rejects above 1.95 / sqrt(n) (the Kolmogorov quantile). sqrt(n) * D >= 1.95
# + 2 * 0.5 rejects it with ~98 % probability on any seeds (the seeds here are fixed, so the outcome is too).
MARGIN = 1.95 + 2 * 0.5
MAX_TOKENS = 2000  # the sample this test can afford on 2 cores; the computed sizes must fit it


class Flattened:
    """A draft far from p: the raw MTP head with its logits halved (a draft at twice the temperature). Flatter than p,
    it puts q above p on many tokens, so rejections are common and draw from a residual far from p, and sampled
    proposals are accepted 44 % of the time at position 1 (the raw head: 69 %), which still leaves bonus tokens."""

    def __init__(self, draft) -> None:
        self.draft = draft

    def __getattr__(self, name: str):
        return getattr(self.draft, name)

    def __call__(self, *args, **kwargs):
        logits, hidden = self.draft(*args, **kwargs)  # [1, n, V], [1, n, H]
        return logits / 2, hidden


@pytest.fixture(scope="module")
def mimo(tmp_path_factory: pytest.TempPathFactory):
    """tiny-mimo with its raw MTP head (convert's default draft, float32) made far from p, and held-out prompts."""
    out = tmp_path_factory.mktemp("tiny-mimo-raw") / "raw"
    convert(str(TINY_MIMO), out, dtype="float32")
    tm = TargetModel(str(TINY_MIMO))
    draft = load_draft(out).eval()
    draft.attach_target(tm.embedding().float(), tm.lm_head().float())
    runner = ev.TargetRunner(tm, draft)
    prompts = ev.load_prompts(HELDOUT, load_tokenizer(tm.path), 60, 32)
    text = ev.load_prompts(HELDOUT, load_tokenizer(tm.path), 200, 256)[-1]  # contexts for the analytic distance
    return runner, Flattened(draft), prompts, text


def pit_cdf(p: torch.Tensor, r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[n, m]: CDF at u [m] of the randomised PIT (`sampling.pit`, order of decreasing p) of a token drawn from r
    [n, V] when the PIT is taken under p [n, V]: piecewise linear through (F_p, F_r) at the token boundaries."""
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    ps, rs = p.gather(-1, order), r.gather(-1, order)
    fp, fr = ps.cumsum(-1), rs.cumsum(-1)
    uu = u.expand(p.shape[0], -1).contiguous()
    i = torch.searchsorted(fp, uu, right=True).clamp(max=p.shape[-1] - 1)  # token whose interval holds u
    zero = torch.zeros(p.shape[0], 1, dtype=p.dtype)
    fp0, fr0 = torch.cat([zero, fp], -1).gather(-1, i), torch.cat([zero, fr], -1).gather(-1, i)
    return (fr0 + (uu - fp0) * rs.gather(-1, i) / ps.gather(-1, i).clamp(min=1e-300)).clamp(0, 1)


@torch.no_grad()
def analytic_distance(runner, draft, text: list[int], rule: Rule, s: Sampling) -> tuple[float, float]:
    """(sup_u |G(u) - u|, mean acceptance) of one-draft rounds (k = 1) under `rule`, exactly, at the teacher-forced
    contexts of a held-out text: G mixes the PIT CDF of each round's first token (accepted draft or residual draw,
    distribution Q*a + sum(Q*(1 - a)) * residual) with that of its bonus token (weight P(accept); the next
    position's p stands in for p after the accepted draft). Uses the Rule's own methods."""
    logits, feats = runner.forward(text, runner.start())  # [T, V], [1, T, *]
    n = len(text) - 2
    dlogits, _ = draft(  # the draft's step 0 at origins 0..T-2 (token o+1, feature o): row o proposes token o+2
        torch.tensor([text[1:-1]]), draft.initial_hidden(feats[:, :n]), torch.arange(1, n + 1)[None]
    )
    dl = dlogits[0].double()  # [n, V]
    p = warp(logits[1 : n + 1].double(), s.temperature, s.top_p)  # [n, V]: the target's p at each draft's position
    proposal = rule.proposal(dl, s)
    q = rule.verify_q(dl, proposal, s)
    accept = torch.where(proposal > 0, rule.accept_prob(p, q.clamp(min=1e-300)), 0.0)  # [n, V]
    taken = proposal * accept
    first = taken + (proposal - taken).sum(-1, keepdim=True) * rule.residual(p, q)
    beta = taken.sum(-1)[:-1]  # P(accept) [n - 1], rounds whose bonus has a next position
    bonus_p = p[1:]
    u = torch.linspace(0, 1, 2001, dtype=torch.float64)
    g = pit_cdf(p, first, u).sum(0) + (beta[:, None] * pit_cdf(bonus_p, rule.bonus(bonus_p), u)).sum(0)
    g = g / (n + beta.sum())
    return float((g - u).abs().max()), float(beta.mean())


def sampled_pit(runner, draft, prompts, rule: Rule, s: Sampling, tokens: int) -> torch.Tensor:
    """The randomised PIT of every token the real loop emits (evaluate's own check, `emitted_pit`), prompt after
    prompt (seeded by index) until `tokens` are in."""
    pits, noise = [], torch.Generator().manual_seed(0)
    for n, prompt in enumerate(prompts):
        sampler = Speculative(s, TorchRandomness(1000 + n), rule)
        out, _ = ev.speculative_decode(runner, draft, prompt, STAT_K, STAT_NEW, None, sampler)
        pits.append(ev.emitted_pit(runner, prompt, out, s, noise))
        if sum(x.numel() for x in pits) >= tokens:
            return torch.cat(pits)[:tokens]
    raise AssertionError(f"{len(prompts)} prompts give fewer than {tokens} tokens")


def stat_sampling(mode: str) -> Sampling:
    return Sampling(STAT.temperature, STAT.top_p, mode)


@pytest.fixture(scope="module")
def sample_sizes(mimo) -> dict[str, int]:
    """Per wrong rule, from its exact distance D on this target and draft: n = (MARGIN / D)^2 tokens, at which the KS
    test rejects it with near certainty (at least 200)."""
    runner, draft, _, text = mimo
    for mode in ("sample", "greedy"):  # the analytic computation itself: exact for the right rule
        d, acceptance = analytic_distance(runner, draft, text, Rule(), stat_sampling(mode))
        assert d < 1e-6
        assert 0.1 < acceptance < 0.6  # far from p, but with bonus tokens
    sizes = {}
    for name, (rule, mode) in WRONG_RULES.items():
        d, _ = analytic_distance(runner, draft, text, rule(), stat_sampling(mode))
        sizes[name] = max(200, math.ceil((MARGIN / d) ** 2))
    assert max(sizes.values()) <= MAX_TOKENS, sizes  # the draft no longer makes the wrong rules far enough
    return sizes


@pytest.mark.slow
@pytest.mark.parametrize("mode", DRAFT_SAMPLING)
def test_pit_is_uniform_on_a_bundled_target(mimo, sample_sizes: dict[str, int], mode: str) -> None:
    """Speculative sampling on tiny-mimo (raw MTP head flattened, k = 1, temperature 1): the randomised PIT of every
    emitted token under the target's exact p is uniform (KS p-value above ALPHA, fixed seeds), over as many tokens as
    the wrong rules of this proposal mode need to be rejected (`sample_sizes`)."""
    runner, draft, prompts, _ = mimo
    n = max(size for name, size in sample_sizes.items() if WRONG_RULES[name][1] == mode)
    _, p_value = ks_uniform(sampled_pit(runner, draft, prompts, Rule(), stat_sampling(mode), n))
    assert p_value > ALPHA, (mode, p_value, n)


@pytest.mark.slow
@pytest.mark.parametrize("name", WRONG_RULES)
def test_pit_rejects_wrong_rules(mimo, sample_sizes: dict[str, int], name: str) -> None:
    runner, draft, prompts, _ = mimo
    rule, mode = WRONG_RULES[name]
    _, p_value = ks_uniform(sampled_pit(runner, draft, prompts, rule(), stat_sampling(mode), sample_sizes[name]))
    assert p_value < ALPHA, (name, p_value, sample_sizes[name])


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.9), (0.5, 0.6), (2.0, 0.3)])
def test_warp_equals_transformers_own_logits_processors(temperature: float, top_p: float) -> None:
    """The sampling distribution against an independent implementation: transformers' TemperatureLogitsWarper then
    TopPLogitsWarper (min_tokens_to_keep 1), the order its generate() applies them, then softmax."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(int(temperature * 10 + top_p * 100))) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.double())
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    theirs = torch.softmax(scores, dim=-1)
    ours = warp(logits, temperature, top_p)
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens kept
    assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-12)
