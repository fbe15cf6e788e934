"""Stage 3: real speculative decoding against the target — acceptance per position and a lossless check.

Chain drafting with greedy verification, one prompt at a time (positions are 0-based token indices):
- the target has processed tokens 0..o and emitted t[o+1]; the draft's cache holds one step-0 entry per origin
  0..o-1 (target feature at i, token t[i+1], RoPE position i+1);
- the draft runs k steps from origin o: step 0 reads (feature o, t[o+1]), step j reads its own hidden and its own
  token d[j]; it proposes d[1..k];
- the target verifies [t[o+1], d[1..k]] in one forward: greedy[i] is its choice for position o+2+i; the longest
  prefix with d == greedy is accepted (a tokens), greedy[a] is the bonus token;
- both caches are cut back to the accepted tokens, the draft cache gets the step-0 entries of the new origins, and
  the loop goes on from origin o+1+a.
One loop serves every draft; what differs is the draft's caches (`forced_caches`): one for a one-layer draft
(`ForcedLayer`), one per layer for a chain draft (`ForcedChain`, the forced chain of `draft/chain.py`).
Acceptance length = mean(a + 1) (target tokens per target forward, bonus included). Acceptance per position j comes
two ways: conditional, P(d[j] accepted | d[1..j-1] accepted) (`acceptance_per_position`), and per draft,
P(d[j] accepted) (`per_draft_acceptance`, what vLLM's per-position counters divided by the number of drafts give; it
falls with j by construction).

At temperature 0 the output must equal the target's own greedy decoding token for token; a mismatch raises, except
at a position where the target's top two logits tie within the rounding of the dtype the target runs in
(`tie_tolerance`; reported separately). At a temperature
the sampler (`sampling.py`: speculative sampling, draft proposing by argmax or by sampling, seeded per prompt) leaves
the output's *distribution* unchanged, which no single output can show: the report's `distribution_check` is a
Kolmogorov-Smirnov test of the randomised PIT of every emitted token under the target's exact p (uniform iff
lossless; tests/test_sampling.py proves the rule exactly and fails it on wrong rules), and `lossless` is null.

The target runs where `--device` / `--device-map` put it, in `--dtype`; the draft follows it (its device and dtype).

What this module does not do: train (`train/recipe.py`) or load checkpoints beyond the draft/target loaders.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtp2draft.data import load_tokenizer, prompt_ids, rendered
from mtp2draft.draft.chain import MtpChainDraft
from mtp2draft.draft.disk import check_draft_weights, load_draft
from mtp2draft.draft.modules import DraftCache
from mtp2draft.errors import DataError
from mtp2draft.evaluation.compare import compare_to_baselines
from mtp2draft.evaluation.sampling import Greedy, Sampling, Speculative, ks_uniform, make_sampler, pit, warp
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.kinds import DraftKind
from mtp2draft.progress import Progress, meter
from mtp2draft.settings import HubAccess, Placement, derived_seed
from mtp2draft.target.device import resolve_device
from mtp2draft.target.hidden import TargetModel, check_draft_fits
from mtp2draft.target.identity import check_drafts_belong

# A tie: the top two logits within TIE_ULPS units of the target dtype's resolution, relative to the top logit.
TIE_ULPS = 4


def tie_tolerance(dtype: torch.dtype) -> float:
    """Relative gap under which the target's top two logits count as tied in `dtype`.

    finfo(dtype).eps is the spacing of the dtype's numbers at 1 (one ulp there; at a logit x it is eps * |x| within
    a factor 2). Speculative decoding and the greedy reference compute the same logits with different reductions
    (k + 1 tokens per forward vs one, a KV cache cut back), so each logit may land a few ulps from the other path's:
    a top-two gap under TIE_ULPS * eps * max(1, |top|) can flip the argmax without a bug. bf16 (eps 2^-7): 3.1 %;
    fp16 (2^-10): 0.39 %; fp32 (2^-23): 4.8e-7."""
    return TIE_ULPS * torch.finfo(dtype).eps


class LosslessError(AssertionError):
    """Speculative decoding changed the target's greedy output: a bug, never noise."""


def draft_chain(draft, step0: torch.Tensor, tokens: torch.Tensor, origin: int, steps: int) -> list[torch.Tensor]:
    """The serving-time chain from `origin` with the data's tokens forced: logits [V_draft] of each step, from the
    caches `speculative_decode` keeps (`forced_caches`).

    step0: [1, T, *] the target features the draft reads at step 0; tokens: [1, T] token ids."""
    forced = forced_caches(draft, steps)
    forced.extend(tokens[0, : origin + 2].tolist(), step0[:, : origin + 1], tokens.device)
    data = tokens[0].tolist()
    out: list[torch.Tensor] = []

    def choose(logits: torch.Tensor) -> tuple[int, None]:
        out.append(logits)
        return data[origin + len(out) + 1] if origin + len(out) + 1 < len(data) else 0, None

    forced.propose(origin, steps, choose, tokens.device)
    return out


def _append_mask(past: int, new: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, new, past + new]: every new entry sees the whole cache and the new entries up to itself."""
    allowed = torch.cat([torch.ones(new, past, dtype=torch.bool), torch.ones(new, new, dtype=torch.bool).tril()], 1)
    mask = torch.zeros(new, past + new, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def _crop(cache, length: int) -> None:
    """Cut a transformers cache back to `length` tokens (5.x: crop takes minus the number of tokens to drop)."""
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)


class TargetRunner:
    """Decoding with the frozen target: `TargetModel.run` over a KV cache (the same forward distillation reads),
    returning the next-token logits and the features the draft reads.

    draft: the draft whose step-0 input to return (EAGLE-3: its aux layers; native: its `input_hidden`); None
    returns the target's final hidden as its spec names it (a native MTP draft's default)."""

    def __init__(self, target: TargetModel, draft=None) -> None:
        self.target = target
        self.kind = draft.kind if draft is not None else DraftKind.MTP
        self.aux = draft.aux_layer_ids if self.kind == DraftKind.EAGLE3 else None
        self.input_hidden = getattr(draft, "input_hidden", None)  # a native draft's step-0 hidden (pre/post norm)

    @property
    def device(self) -> torch.device:
        """Where the target's outputs come back (a device map's first device): the draft runs there too."""
        return self.target.device

    def start(self, rollback: int = 0):
        """An empty target cache that verification can roll back by up to `rollback` tokens (`_crop`). Layers that
        keep a bounded past are told to record it until the next crop: a linear-attention layer (Qwen3.5's gated
        delta net) its last rollback + 1 recurrent states (one [heads, d_k, d_v] each), a sliding-window layer
        (DeepSeek-V4's) the keys past its window (without it, a crop after the window fills is refused); full
        attention layers keep every token already."""
        cache = self.target.new_cache()
        for layer in getattr(cache, "layers", []) if rollback else []:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording(recurrent_states_to_keep=rollback + 1)
        return cache

    def forward(self, ids: list[int], cache) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [n, V] and step-0 features [1, n, *] for `ids`, appended after the cache's tokens."""
        x = torch.tensor([ids], device=self.target.device)
        feats = self.target.run(x, aux_layers=self.aux, want_final=not self.aux, final=self.input_hidden, cache=cache)
        return feats.logits[0], feats.step0_input(self.kind)


@dataclass
class PromptResult:
    tokens: list[int]
    accepted: list[int]  # a per target forward
    reference: list[int]
    lossless: bool | None  # None: sampled output, checked in distribution only
    tie_at: int | None = None


@torch.no_grad()
def greedy_reference(runner: TargetRunner, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    """The target's own greedy decoding, one token per forward (what speculative decoding must reproduce)."""
    cache = runner.start()
    logits, _ = runner.forward(prompt, cache)
    out = [int(logits[-1].argmax())]
    while len(out) < max_new and out[-1] != eos:
        logits, _ = runner.forward([out[-1]], cache)
        out.append(int(logits[-1].argmax()))
    return out


class ForcedLayer:
    """A one-layer draft's KV cache during decoding: one step-0 entry per origin whose next token is known (target
    feature at p, token p + 1, RoPE position p + 1). The newest origin's step 0 runs as the first step of the next
    proposal, whose entry then stays (it is that origin's step-0 entry); the later steps' entries are cut off when the
    cache is next extended. The same interface as `ForcedChain`, which computes the same with one layer."""

    def __init__(self, draft) -> None:
        self.draft = draft
        self.cache = DraftCache()
        self.count = 0  # origins with their step-0 entry in the cache
        self.last: torch.Tensor | None = None  # [1, 1, *] the newest origin's step-0 feature
        self.token = 0  # the newest known token: the newest origin's step-0 input

    def extend(self, tokens: Sequence[int], feats: torch.Tensor, device) -> None:
        """tokens: every known token (prompt + output so far); feats: [1, n, *] the step-0 features of the next n
        positions. Adds the entries of the origins that became complete, all but the newest."""
        self.cache.crop(self.count)  # the last proposal's entries past its step 0
        n = feats.shape[1] - 1
        if n > 0:
            start = self.count
            ids = torch.tensor([list(tokens[start + 1 : start + n + 1])], device=device)
            positions = torch.arange(start + 1, start + n + 1, device=device)[None]
            mask = _append_mask(start, n, feats.dtype, device) if start else None  # None: the draft's causal mask
            self.draft(ids, self.draft.initial_hidden(feats[:, :n]), positions, attention_mask=mask, cache=self.cache)
            self.count += n
        self.last, self.token = feats[:, n:], tokens[-1]

    def propose(self, origin: int, k: int, choose, device) -> tuple[list[int], list]:
        """k draft tokens from `origin` (step 0 reads its feature and the newest token); choose(logits [V]) ->
        (token, q)."""
        if self.count != origin:
            raise AssertionError(f"draft cache holds {self.count} origins, drafting from origin {origin}")
        h, tok, proposal, qs = self.draft.initial_hidden(self.last), self.token, [], []
        for j in range(k):
            at = torch.tensor([[origin + 1 + j]], device=device)
            logits, h = self.draft(torch.tensor([[tok]], device=device), h, at, cache=self.cache)
            tok, q = choose(logits[0, -1])
            proposal.append(tok)
            qs.append(q)
        self.count = origin + 1  # step 0's entry is origin's own
        return proposal, qs


class ForcedChain:
    """A chain draft's per-layer KV caches during decoding, kept as the forced chain (`draft/chain.py`): the chain
    run from every origin with the known tokens, layer l's entry of origin p kept once token p + f + 1 is known
    (f: the first step that runs layer l)."""

    def __init__(self, draft, steps: int) -> None:
        self.draft = draft
        self.cache = draft.new_cache()
        self.firsts = draft.first_steps(steps)  # [f_0 = 0, f_1, ...]: the forced chain's steps
        self.count = [0] * len(self.firsts)  # forced origins in each used layer's cache
        self.handed: list[torch.Tensor | None] = [None] * len(self.firsts)  # [1, count, H] hidden handed on
        self.feats: torch.Tensor | None = None  # [1, F, *] step-0 features of positions 0..F-1
        self.last_logits: torch.Tensor | None = None  # [V] step 0's logits at the newest forced origin

    def extend(self, tokens: Sequence[int], feats: torch.Tensor, device) -> None:
        """tokens: every known token (prompt + output so far); feats: [1, n, *] the step-0 features of the next n
        positions. Adds each used layer's entries of the origins that became complete."""
        self.feats = feats if self.feats is None else torch.cat([self.feats, feats], dim=1)
        for i, f in enumerate(self.firsts):
            # origin p needs token p + f + 1 and the previous forced step's hidden at p (step 0: the feature at p)
            avail = min(len(tokens) - 1 - f, self.feats.shape[1] if i == 0 else self.count[i - 1])
            start = self.count[i]
            if avail <= start:
                continue
            ids = torch.tensor([list(tokens[start + f + 1 : avail + f + 1])], device=device)
            hidden = (
                self.draft.initial_hidden(self.feats[:, start:avail]) if i == 0 else self.handed[i - 1][:, start:avail]
            )
            positions = torch.arange(start + f + 1, avail + f + 1, device=device)[None]
            mask = _append_mask(start, avail - start, hidden.dtype, device)
            logits, out = self.draft(ids, hidden, positions, attention_mask=mask, cache=self.cache, step=f)
            self.handed[i] = out if self.handed[i] is None else torch.cat([self.handed[i], out], dim=1)
            self.count[i] = avail
            if i == 0:
                self.last_logits = logits[0, -1]

    def propose(self, origin: int, k: int, choose, device) -> tuple[list[int], list]:
        """k draft tokens from `origin` (its step 0 is the forced entry of origin `origin`); choose(logits [V]) ->
        (token, q). The caches are cut back to their forced entries after."""
        if self.count[0] != origin + 1:
            raise AssertionError(f"forced chain holds {self.count[0]} origins, drafting from origin {origin}")
        h = self.handed[0][:, origin : origin + 1]
        tok, q = choose(self.last_logits)
        proposal, qs = [tok], [q]
        for j in range(1, k):
            at = torch.tensor([[origin + 1 + j]], device=device)
            logits, h = self.draft(torch.tensor([[tok]], device=device), h, at, cache=self.cache, step=j)
            tok, q = choose(logits[0, -1])
            proposal.append(tok)
            qs.append(q)
        for i, f in enumerate(self.firsts):
            self.cache[self.draft.layer_at(f)].crop(self.count[i])
        return proposal, qs


def forced_caches(draft, steps: int) -> ForcedLayer | ForcedChain:
    """The draft's caches during decoding: a chain draft's per-layer ones (`ForcedChain`), else one (`ForcedLayer`)."""
    return ForcedChain(draft, steps) if isinstance(draft, MtpChainDraft) else ForcedLayer(draft)


@torch.no_grad()
def speculative_decode(
    runner: TargetRunner,
    draft,
    prompt: list[int],
    k: int,
    max_new: int,
    eos: int | None,
    sampler: Greedy | Speculative | None = None,
) -> tuple[list[int], list[int]]:
    """Chain speculative decoding: (generated tokens, accepted count per target forward). `sampler` picks, proposes
    and verifies tokens (`sampling.py`); None is greedy verification. The draft's caches are `forced_caches` (a chain
    draft's step j runs layer `draft.layer_at(j)`, `draft/chain.py`)."""
    sampler = sampler or Greedy()
    tcache, dev = runner.start(rollback=k), runner.device  # the draft runs where the target's outputs come back
    logits, feats = runner.forward(prompt, tcache)  # [L, V], [1, L, *]
    out = [sampler.first(logits[-1])]
    forced = forced_caches(draft, k)
    forced.extend(prompt + out, feats, dev)
    o = len(prompt) - 1  # origin: last position whose target feature is known
    accepted: list[int] = []
    while len(out) < max_new and out[-1] != eos:
        # q: [V_draft] the token was drawn from (greedy: None)
        proposal, qs = forced.propose(o, k, lambda lg: sampler.propose(lg, draft), dev)
        vlogits, vfeats = runner.forward([out[-1], *proposal], tcache)  # positions o+1 .. o+1+k
        a, nxt = sampler.verify(vlogits, proposal, qs, draft)  # row j of vlogits: the target at draft token j
        accepted.append(a)
        out += proposal[:a] + [nxt]
        _crop(tcache, o + 2 + a)  # keep tokens 0 .. o+1+a (through the last accepted draft token)
        forced.extend(prompt + out, vfeats[:, : a + 1], dev)  # features of positions o+1 .. o+1+a
        o += 1 + a
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out[:max_new], accepted


def top_two_tie(runner: TargetRunner, prompt: list[int], ref: list[int], at: int) -> bool:
    """Whether the target's top two logits at generated position `at` of output `ref` are equal within its dtype's
    rounding (`tie_tolerance`): where two correct decodings of the same model may part."""
    cache = runner.start()
    logits, _ = runner.forward(prompt + ref[:at], cache)
    top = logits[-1].topk(2).values
    return float(top[0] - top[1]) <= tie_tolerance(runner.target.dtype) * max(1.0, float(top[0].abs()))


@dataclass
class EvalResult:
    name: str
    draft: str
    num_draft_tokens: int
    mean_acceptance_length: float
    acceptance_per_position: list[float]
    tokens_drafted: int
    tokens_accepted: int
    target_forwards: int
    lossless: bool | None
    ties: int
    num_prompts: int
    seconds: float
    tokens_per_forward_by_prompt: list[float] = field(default_factory=list)
    per_draft_acceptance: list[float] = field(default_factory=list)  # P(position j accepted), per draft
    distribution_check: dict[str, float] | None = None  # at a temperature: the PIT's KS test (see the module doc)
    accepted_by_prompt: list[list[int]] = field(default_factory=list)  # a per target forward, prompt by prompt
    chain: dict[str, Any] | None = None  # a chain draft's layer count and the step rule it ran under


def summarise(name: str, draft_path: str, k: int, results: Sequence[PromptResult], seconds: float) -> EvalResult:
    """Acceptance figures of one draft: conditional acceptance per position (accepted at j / reached j) and per
    draft (accepted at j / drafts)."""
    steps = [a for r in results for a in r.accepted]
    attempted = [sum(1 for a in steps if a >= j - 1) for j in range(1, k + 1)]
    passed = [sum(1 for a in steps if a >= j) for j in range(1, k + 1)]
    return EvalResult(
        name=name,
        draft=draft_path,
        num_draft_tokens=k,
        mean_acceptance_length=sum(a + 1 for a in steps) / max(len(steps), 1),
        acceptance_per_position=[p / n if n else 0.0 for p, n in zip(passed, attempted, strict=True)],
        tokens_drafted=k * len(steps),
        tokens_accepted=sum(steps),
        target_forwards=len(steps),
        lossless=None if any(r.lossless is None for r in results) else all(r.lossless for r in results),
        ties=sum(1 for r in results if r.tie_at is not None),
        num_prompts=len(results),
        seconds=round(seconds, 2),
        tokens_per_forward_by_prompt=[
            round(sum(a + 1 for a in r.accepted) / max(len(r.accepted), 1), 3) for r in results
        ],
        per_draft_acceptance=[p / len(steps) if steps else 0.0 for p in passed],
        accepted_by_prompt=[list(r.accepted) for r in results],
    )


@torch.no_grad()
def emitted_pit(
    runner: TargetRunner, prompt: list[int], tokens: list[int], sampling: Sampling, generator: torch.Generator
) -> torch.Tensor:
    """Randomised PIT [n] of the n emitted tokens under the target's exact sampling distribution at each of them
    (one forward over prompt + tokens, no cache reuse from decoding): uniform iff they were sampled from it."""
    logits, _ = runner.forward(prompt + tokens[:-1], runner.start())  # [L + n - 1, V]
    p = warp(logits[len(prompt) - 1 :].float().cpu(), sampling.temperature, sampling.top_p)  # [n, V]
    noise = torch.rand(len(tokens), dtype=torch.float64, generator=generator)
    return pit(p, torch.tensor(tokens), noise)


@dataclass(frozen=True)
class Decoding:
    """How every prompt of one evaluation is decoded, each draft alike: `k` draft tokens per target forward, at most
    `max_new` tokens ending after `eos`, by the `sampling` rule with prompt n seeded (seed, n). A DSpark drafter
    drafts its block whole (`k` unused) and, with a `threshold`, cuts it before its first slot whose confidence is
    under it (None: whole blocks)."""

    k: int
    max_new: int
    eos: int | None
    sampling: Sampling = Sampling()
    seed: int = 0
    threshold: float | None = None

    @classmethod
    def of(cls, config: EvaluateConfig, eos: int | None) -> Decoding:
        """`evaluate`'s settings as decoding reads them, with the tokenizer's `eos`."""
        return cls(config.num_draft_tokens, config.max_new_tokens, eos, config.sampling, config.seed)


def load_prompts(
    path: str | Path, tokenizer, max_prompts: int | None, max_prompt_length: int, skip_bad: bool = False
) -> list[list[int]]:
    prompts, _ = rendered(path, lambda r: prompt_ids(r, tokenizer, max_prompt_length), skip_bad)
    prompts = [p for p in prompts if len(p) >= 2]
    if not prompts:
        raise DataError(f"{path}: no prompt of at least two tokens")
    return prompts[:max_prompts] if max_prompts else prompts


def evaluate(
    drafts: Sequence[tuple[str, str]],
    target: str | TargetModel,
    data: str | Path,
    config: EvaluateConfig | None = None,
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Evaluate each (name, draft directory) against the target on the prompts in `data`.

    The target is loaded where `where` says: in its dtype (float32 unless named) on its device (default: cuda when
    available, else cpu), or spread by transformers' device map (e.g. "auto"); `hub`: its revision and the token.
    Each draft runs on the target's (first) device in its dtype.
    Temperature 0: the target's greedy reference is computed once and shared; every draft's output is checked against
    it. A temperature: speculative sampling at that temperature and top-p, the draft proposing by `draft_sampling`
    (greedy: argmax, sample: from its own distribution), prompt n seeded with (seed, n) for every draft alike; each
    draft's output is checked in distribution (`distribution_check`). `config`: what to decode and how
    (`EvaluateConfig`, default settings when None)."""
    cfg = config or EvaluateConfig()
    where, hub = where or Placement(), hub or HubAccess()
    sampling = cfg.sampling
    check_drafts_belong([path for _, path in drafts], target, hub.revision, hub.token)  # before the weights load
    for _, path in drafts:  # a NaN or integer weight in a baseline is refused now, not after the draft's decoding
        check_draft_weights(path)
    if not isinstance(target, TargetModel):
        device = where.device if where.device_map is not None else resolve_device(where.device)
        target = TargetModel(target, hub.revision, hub.token, dtype=where.torch_dtype, device=device or "cpu",
                             device_map=where.device_map)  # fmt: skip
    tm = target
    tokenizer = load_tokenizer(tm.path)
    eos = tokenizer.eos_token_id
    prompts = load_prompts(data, tokenizer, cfg.max_prompts, cfg.max_prompt_length, cfg.skip_bad)
    references: list[list[int]] | None = None
    decoding = Decoding.of(cfg, eos)
    out: dict[str, Any] = {
        "target": tm.source,
        "target_family": tm.spec.name,  # what the acceptance was measured on (`speedup` says when it differs)
        "target_commit": tm.commit,
        "data": str(data),
        "device": str(tm.device) if where.device_map is None else f"device_map={where.device_map}",
        "dtype": str(tm.dtype).removeprefix("torch."),
        "tie_tolerance": tie_tolerance(tm.dtype),
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "draft_sampling": "greedy" if sampling.greedy else cfg.draft_sampling,
        "results": [],
    }
    for name, path in drafts:
        draft = load_draft(path, dtype=tm.dtype).to(tm.device).eval()
        if cfg.step_layers is not None and isinstance(draft, MtpChainDraft):
            draft.step_layers = cfg.step_layers
        check_draft_fits(draft, tm, path)
        draft.attach_target(tm.embedding().to(tm.device, tm.dtype), tm.lm_head().to(tm.device, tm.dtype))
        runner = TargetRunner(tm, draft)
        if references is None and sampling.greedy:
            progress(f"target greedy reference on {len(prompts)} prompts")
            references = [greedy_reference(runner, p, cfg.max_new_tokens, eos) for p in prompts]
        summary = evaluate_draft(runner, draft, name, str(path), prompts, references, decoding, progress)
        if isinstance(draft, MtpChainDraft):
            summary.chain = {"num_layers": draft.num_layers, "step_layers": draft.step_layers}
        out["results"].append(asdict(summary))
    if len(out["results"]) > 1:  # the draft against each baseline, with a paired bootstrap interval (compare.py)
        out["comparison"] = compare_to_baselines(out["results"], seed=cfg.seed)
    return with_headline(out)


HEADLINE = ("mean_acceptance_length", "acceptance_per_position", "per_draft_acceptance", "lossless", "num_draft_tokens")


def with_headline(report: dict[str, Any]) -> dict[str, Any]:
    """The report with its documented top-level keys (`HEADLINE`), which describe the first draft."""
    first = report["results"][0]
    return report | {key: first[key] for key in HEADLINE}


def evaluate_draft(
    runner: TargetRunner,
    draft,
    name: str,
    path: str,
    prompts: Sequence[list[int]],
    references: Sequence[list[int]] | None,
    decoding: Decoding,
    progress: Progress,
) -> EvalResult:
    """One draft's speculative decoding of every prompt, summarised. Greedy (`references`: the target's own outputs):
    every output must equal its reference, except after a logit tie (recorded); a difference elsewhere raises
    `LosslessError`. At a temperature: prompt n sampled with the seed (seed, n), and the emitted tokens' PIT tested
    for uniformity (`distribution_check`)."""
    k, max_new, eos, sampling, seed = decoding.k, decoding.max_new, decoding.eos, decoding.sampling, decoding.seed
    started, results, pits = time.perf_counter(), [], []
    check = torch.Generator().manual_seed(seed)  # the PIT's noise
    bar = meter(progress, f"evaluate {name}", len(prompts), "prompt")
    for n, (prompt, ref) in enumerate(zip(prompts, references or [[]] * len(prompts), strict=True), 1):
        sampler = make_sampler(sampling, derived_seed(seed, n))
        tokens, accepted = speculative_decode(runner, draft, prompt, k, max_new, eos, sampler)
        result = PromptResult(tokens, accepted, ref, tokens == ref if sampling.greedy else None)
        if not sampling.greedy:
            pits.append(emitted_pit(runner, prompt, tokens, sampling, check))
        elif not result.lossless:
            result.tie_at = _tie_position(runner, name, n, prompt, tokens, ref)
        results.append(result)
        bar.update(1)
    bar.close()
    summary = summarise(name, path, k, results, time.perf_counter() - started)
    if pits:
        u = torch.cat(pits)  # [tokens emitted over all prompts]
        d, p_value = ks_uniform(u)
        summary.distribution_check = {"pit_ks_statistic": d, "pit_ks_p_value": p_value, "tokens": u.numel()}
    return summary


def _tie_position(runner: TargetRunner, name: str, n: int, prompt: list[int], tokens: list[int], ref: list[int]) -> int:
    """Where a greedy output first differs from the target's reference, if the target's top two logits tie there;
    a difference without a tie is a bug (`LosslessError`), or a target whose output is not the same batched
    (transformers' DSA indexers pick keys with torch.topk, whose ties fall by the number of keys in the forward)."""
    at = next(i for i, (x, y) in enumerate(zip(tokens + [-1], ref + [-2], strict=False)) if x != y)
    if not top_two_tie(runner, prompt, ref, at):
        raise LosslessError(
            f"{name}: speculative output differs from the target's greedy output at generated token "
            f"{at} of prompt {n} (no logit tie there): a bug, unless the target's own output depends on how many "
            "tokens one forward holds (a top-k sparse attention can break its ties by sequence length)"
        )
    return at
