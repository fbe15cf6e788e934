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
Acceptance length = mean(a + 1) (target tokens per target forward, bonus included). The output must equal the
target's own greedy decoding token for token; a mismatch raises, except at a position where the target's top two
logits tie within float rounding (reported separately).

What this module does not do: train (`distill.py`) or load checkpoints beyond the draft/target loaders.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtp2draft.data import load_tokenizer, prompt_ids, read_records
from mtp2draft.draft.modules import DraftCache, load_draft
from mtp2draft.errors import DataError, OptionError
from mtp2draft.identity import check_drafts_belong
from mtp2draft.io import Progress, write_json
from mtp2draft.kinds import DraftKind
from mtp2draft.target.hidden import TargetModel, check_draft_fits

EVALUATION_FILE = "evaluation.json"
TIE_TOLERANCE = 1e-4


class LosslessError(AssertionError):
    """Speculative decoding changed the target's greedy output: a bug, never noise."""


def draft_chain(draft, step0: torch.Tensor, tokens: torch.Tensor, origin: int, steps: int) -> list[torch.Tensor]:
    """The serving-time chain from `origin` with the data's tokens forced: logits [V_draft] of each step.

    step0: [1, T, *] the target features the draft reads at step 0; tokens: [1, T] token ids."""
    cache = DraftCache()
    p = origin
    positions = torch.arange(1, p + 2)[None]
    logits, hidden = draft(tokens[:, 1 : p + 2], draft.initial_hidden(step0[:, : p + 1]), positions, cache=cache)
    out, h = [logits[0, p]], hidden[:, p : p + 1]
    for r in range(1, steps):
        logits, h = draft(tokens[:, p + r + 1 : p + r + 2], h, torch.tensor([[p + r + 1]]), cache=cache)
        out.append(logits[0, 0])
    return out


def _append_mask(past: int, new: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, new, past + new]: every new entry sees the whole cache and the new entries up to itself."""
    allowed = torch.cat([torch.ones(new, past, dtype=torch.bool), torch.ones(new, new, dtype=torch.bool).tril()], 1)
    return torch.zeros(new, past + new, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


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

    def start(self):
        return self.target.new_cache()

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
    lossless: bool
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


@torch.no_grad()
def speculative_decode(
    runner: TargetRunner, draft, prompt: list[int], k: int, max_new: int, eos: int | None
) -> tuple[list[int], list[int]]:
    """Chain speculative decoding with greedy verification: (generated tokens, accepted count per target forward)."""
    tcache, dcache = runner.start(), DraftCache()
    logits, feats = runner.forward(prompt, tcache)  # [L, V], [1, L, *]
    out = [int(logits[-1].argmax())]
    o = len(prompt) - 1  # origin: last position whose target feature is known
    if o > 0:  # step-0 entries of origins 0..o-1 (tokens 1..o at positions 1..o)
        draft(
            torch.tensor([prompt[1:]]), draft.initial_hidden(feats[:, :o]), torch.arange(1, o + 1)[None], cache=dcache
        )
    last = feats[:, o : o + 1]
    accepted: list[int] = []
    while len(out) < max_new and out[-1] != eos:
        h, tok, proposal = draft.initial_hidden(last), out[-1], []
        for j in range(k):
            logits_d, h = draft(torch.tensor([[tok]]), h, torch.tensor([[o + 1 + j]]), cache=dcache)
            tok = int(draft.to_target_ids(logits_d[0, -1].argmax()))
            proposal.append(tok)
        vlogits, vfeats = runner.forward([out[-1], *proposal], tcache)  # positions o+1 .. o+1+k
        greedy = vlogits.argmax(-1).tolist()
        a = 0
        while a < k and proposal[a] == greedy[a]:
            a += 1
        accepted.append(a)
        out += proposal[:a] + [greedy[a]]
        _crop(tcache, o + 2 + a)  # keep tokens 0 .. o+1+a (through the last accepted draft token)
        dcache.crop(o + 1)  # origins 0..o (origin o's step-0 entry was the chain's first)
        if a > 0:  # step-0 entries of origins o+1 .. o+a: their features came with the verification
            mask = _append_mask(o + 1, a, vfeats.dtype)
            draft(
                torch.tensor([proposal[:a]]),
                draft.initial_hidden(vfeats[:, :a]),
                torch.arange(o + 2, o + 2 + a)[None],
                attention_mask=mask,
                cache=dcache,
            )
        o, last = o + 1 + a, vfeats[:, a : a + 1]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out[:max_new], accepted


def _tie(runner: TargetRunner, prompt: list[int], ref: list[int], at: int) -> bool:
    """Whether the target's top two logits at generated position `at` are equal within float rounding."""
    cache = runner.start()
    logits, _ = runner.forward(prompt + ref[:at], cache)
    top = logits[-1].topk(2).values
    return float(top[0] - top[1]) <= TIE_TOLERANCE * max(1.0, float(top[0].abs()))


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
    lossless: bool
    ties: int
    num_prompts: int
    seconds: float
    tokens_per_forward_by_prompt: list[float] = field(default_factory=list)


def summarise(name: str, draft_path: str, k: int, results: Sequence[PromptResult], seconds: float) -> EvalResult:
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
        lossless=all(r.lossless for r in results),
        ties=sum(1 for r in results if r.tie_at is not None),
        num_prompts=len(results),
        seconds=round(seconds, 2),
        tokens_per_forward_by_prompt=[
            round(sum(a + 1 for a in r.accepted) / max(len(r.accepted), 1), 3) for r in results
        ],
    )


def load_prompts(
    path: str | Path, tokenizer, max_prompts: int | None, max_prompt_length: int, skip_bad: bool = False
) -> list[list[int]]:
    records, _ = read_records(path, skip_bad)
    prompts = [prompt_ids(r, tokenizer, max_prompt_length) for r in records]
    prompts = [p for p in prompts if len(p) >= 2]
    if not prompts:
        raise DataError(f"{path}: no prompt of at least two tokens")
    return prompts[:max_prompts] if max_prompts else prompts


def evaluate(
    drafts: Sequence[tuple[str, str]],
    target: str | TargetModel,
    data: str | Path,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 64,
    max_prompts: int | None = None,
    max_prompt_length: int = 256,
    revision: str | None = None,
    token: str | bool | None = None,
    skip_bad: bool = False,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """Evaluate each (name, draft directory) against the target on the prompts in `data`.

    The target's greedy reference is computed once and shared; every draft's output is checked against it."""
    for option, value in (
        ("--num-draft-tokens", num_draft_tokens),
        ("--max-new-tokens", max_new_tokens),
        ("--max-prompt-length", max_prompt_length),
        ("--max-prompts", 1 if max_prompts is None else max_prompts),
    ):
        if value < 1:
            raise OptionError(f"{option} must be at least 1, got {value}")
    check_drafts_belong([path for _, path in drafts], target, revision, token)  # before the target's weights load
    tm = target if isinstance(target, TargetModel) else TargetModel(target, revision, token)
    tokenizer = load_tokenizer(tm.path)
    eos = tokenizer.eos_token_id
    prompts = load_prompts(data, tokenizer, max_prompts, max_prompt_length, skip_bad)
    references: list[list[int]] | None = None
    out: dict[str, Any] = {
        "target": tm.source,
        "target_commit": tm.commit,
        "data": str(data),
        "num_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "results": [],
    }
    for name, path in drafts:
        draft = load_draft(path).eval()
        check_draft_fits(draft, tm, path)
        draft.attach_target(tm.embedding().float(), tm.lm_head().float())
        runner = TargetRunner(tm, draft)
        if references is None:
            progress(f"target greedy reference on {len(prompts)} prompts")
            references = [greedy_reference(runner, p, max_new_tokens, eos) for p in prompts]
        started, results = time.perf_counter(), []
        for n, (prompt, ref) in enumerate(zip(prompts, references, strict=True), 1):
            tokens, accepted = speculative_decode(runner, draft, prompt, num_draft_tokens, max_new_tokens, eos)
            result = PromptResult(tokens, accepted, ref, tokens == ref)
            if not result.lossless:
                at = next(i for i, (x, y) in enumerate(zip(tokens + [-1], ref + [-2], strict=False)) if x != y)
                if not _tie(runner, prompt, ref, at):
                    raise LosslessError(
                        f"{name}: speculative output differs from the target's greedy output at generated token "
                        f"{at} of prompt {n} (no logit tie there): this is a bug"
                    )
                result.tie_at = at
            results.append(result)
            if n % 5 == 0 or n == len(prompts):
                progress(f"{name}: {n}/{len(prompts)} prompts")
        summary = summarise(name, str(path), num_draft_tokens, results, time.perf_counter() - started)
        out["results"].append(asdict(summary))
    first = out["results"][0]
    # the documented top-level keys describe the first draft
    out.update(
        {k: first[k] for k in ("mean_acceptance_length", "acceptance_per_position", "lossless", "num_draft_tokens")}
    )
    return out


def save_evaluation(draft_dir: str | Path, report: dict[str, Any]) -> Path:
    path = Path(draft_dir) / EVALUATION_FILE
    write_json(path, report)
    return path


def read_evaluation(draft_dir: str | Path) -> dict[str, Any] | None:
    path = Path(draft_dir) / EVALUATION_FILE
    return json.loads(path.read_text()) if path.is_file() else None
