"""`evaluate` for DSpark drafts: greedy block drafting against the frozen target, lossless and per slot.

One round, one prompt at a time (positions are 0-based token indices):
- the target has processed tokens 0..S-1 and chosen t[S]; the context states of positions 0..S-1 at the drafter's
  target layers are kept ([1, S, n * H], mean-pooled over residual streams by `draft.dspark.pooled_context`);
- the drafter drafts one block in one pass of its layers (`draft_block`): slot 0 holds t[S], slot k proposes the
  token at S + k + 1, so a block of `bs` slots proposes d[1..bs] (the anchor-first layout of vLLM 0.32's DSpark
  speculator, `v1/worker/gpu/spec_decode/dspark/speculator.py`);
- with the confidence stop on, the block is cut before its first slot whose sigmoid(confidence) is under the
  threshold: n <= bs slots are verified (n = 0 verifies t[S] alone, a plain greedy step);
- the target verifies [t[S], d[1..n]] in ONE forward over its KV cache (positions S..S+n): greedy[i] is its choice
  for position S+1+i; the longest prefix with d == greedy is accepted (a tokens) and greedy[a] is the bonus token;
- the cache is cut back to tokens 0..S+a, the states of positions S..S+a join the context, and the next round
  anchors at S+a+1.
Each target forward covers only new tokens. The drafter keeps no cache of its own: each block re-reads the whole
context (its layers' keys and values of the context are recomputed), which changes no figure.

Figures per draft (`block_summary`): mean acceptance length = mean(a + 1) over blocks (target tokens per
verification forward, bonus included); acceptance at slot k = blocks that accepted slot k / blocks that reached it
(verified it, every earlier slot accepted); per-draft acceptance at slot k = blocks that accepted it / blocks; the
target forwards, prefill included, against plain greedy decoding's (one a token). Every draft runs twice on the
same prompts: the whole block verified, and with the confidence stop (`EvaluateConfig.confidence_threshold`).
The stop is SGLang's rule, the stop run's threshold (0.5) mtp2draft's; what each engine does with the confidence
head is in docs/engines.md ("DSpark drafters").

The output must equal the target's own greedy decoding token for token (`decode.greedy_reference`); a difference
raises `LosslessError` unless the target's top two logits tie there (`decode.tie_tolerance`, reported as ties).
Drafts after the first are baselines, each compared with the first by the paired bootstrap of `compare.py`.

What this module does not do: sample at a temperature (greedy only), serve through vLLM (`--engine vllm` is refused
for DSpark drafts), read the target's embedding output (a target layer id of -1), or load drafts itself
(`draft.dspark_disk.open_dspark`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from mtp2draft.data import load_tokenizer
from mtp2draft.draft.dspark import pooled_context
from mtp2draft.draft.dspark_disk import check_fits, fields_of, is_speculators_dspark, open_dspark
from mtp2draft.errors import DraftError, OptionError, read_json_file
from mtp2draft.evaluation.compare import compare_to_baselines
from mtp2draft.evaluation.decode import (
    Decoding,
    PromptResult,
    TargetRunner,
    _crop,
    _tie_position,
    greedy_reference,
    load_prompts,
    summarise,
    tie_tolerance,
    with_headline,
)
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.kinds import CONFIG_FILE, DSPARK_KIND, is_dspark_draft
from mtp2draft.progress import Progress, meter
from mtp2draft.settings import HubAccess, Placement
from mtp2draft.target.device import resolve_device
from mtp2draft.target.hidden import TargetModel

# Where the stop run's threshold comes from (the module doc has the sources).
THRESHOLD_SOURCE = (
    "SGLang's DSpark rule (the slots before the first with sigmoid(confidence) < threshold); SGLang's default 0.0 "
    "verifies whole blocks (the run without the stop) and vLLM 0.32 states no threshold: 0.5 is mtp2draft's default"
)


def _forward(target: TargetModel, ids: list[int], cache, layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] and context states [1, n, len(layers) * H] of `ids`, appended after the cache's tokens."""
    x = torch.tensor([ids], device=target.device)
    feats = target.run(x, aux_layers=list(layers), want_final=False, cache=cache)
    return feats.logits[0], pooled_context(feats.aux)


def slots_to_verify(confidence: torch.Tensor, threshold: float | None) -> int:
    """confidence [bs] logits -> how many leading slots to verify: all of them without a threshold, else those
    before the first slot whose sigmoid(confidence) is under `threshold`."""
    if threshold is None:
        return confidence.shape[0]
    low = (confidence.float().sigmoid() < threshold).nonzero()
    return int(low[0, 0]) if low.numel() else confidence.shape[0]


@torch.no_grad()
def block_decode(
    runner: TargetRunner,
    draft,
    prompt: list[int],
    max_new: int,
    eos: int | None,
    threshold: float | None = None,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Greedy speculative decoding of `prompt` with a DSpark drafter (the module doc's round): (output tokens,
    (accepted a, verified n) per verification forward). `draft`: `fields` and `draft_block` (`draft.dspark`)."""
    target, layers = runner.target, draft.fields.target_layer_ids
    cache = runner.start(rollback=draft.fields.block_size)
    logits, states = _forward(target, prompt, cache, layers)  # states [1, S, n*H] of positions 0..S-1
    out, blocks = [int(logits[-1].argmax())], []
    while len(out) < max_new and out[-1] != eos:
        s = states.shape[1]  # out[-1] sits at position s
        proposal, confidence = draft.draft_block(states, torch.tensor([out[-1]], device=target.device))
        n = slots_to_verify(confidence[0], threshold)
        proposal = proposal[0, :n].tolist()  # d[1..n]: positions s+1..s+n
        vlogits, vstates = _forward(target, [out[-1], *proposal], cache, layers)  # positions s..s+n
        greedy = vlogits.argmax(-1).tolist()  # greedy[i]: the target's token at position s+1+i
        a = 0
        while a < n and proposal[a] == greedy[a]:
            a += 1
        blocks.append((a, n))
        out += proposal[:a] + [greedy[a]]
        _crop(cache, s + 1 + a)  # keep tokens 0..s+a: the anchor and the accepted draft tokens
        states = torch.cat([states, vstates[:, : a + 1]], dim=1)  # their states join the context
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out[:max_new], blocks


def block_summary(
    name: str,
    path: str,
    block_size: int,
    results: Sequence[PromptResult],
    blocks: Sequence[Sequence[tuple[int, int]]],
    seconds: float,
    threshold: float | None,
) -> dict[str, Any]:
    """One run's figures, shaped as `decode.summarise`'s (so the tables, the paired comparison and `--save` read them
    alike), with acceptance per slot over the blocks that reached it and the DSpark counts beside:
    slots_reached[k] / slots_accepted[k] (slot k + 1), forwards (speculative, prefills included, and plain greedy)."""
    summary = summarise(name, path, block_size, results, seconds)
    flat = [b for prompt in blocks for b in prompt]
    reached = [sum(1 for a, n in flat if n >= k and a >= k - 1) for k in range(1, block_size + 1)]
    accepted = [sum(1 for a, _ in flat if a >= k) for k in range(1, block_size + 1)]
    summary.acceptance_per_position = [x / r if r else 0.0 for x, r in zip(accepted, reached, strict=True)]
    summary.tokens_drafted = sum(n for _, n in flat)
    return asdict(summary) | {
        "block_size": block_size,
        "confidence_threshold": threshold,
        "slots_reached": reached,
        "slots_accepted": accepted,
        "forwards": {"speculative": len(results) + len(flat), "plain_greedy": sum(len(r.tokens) for r in results)},
    }


def evaluate_blocks(
    runner: TargetRunner,
    draft,
    name: str,
    path: str,
    prompts: Sequence[list[int]],
    references: Sequence[list[int]],
    decoding: Decoding,
    progress: Progress,
) -> dict[str, Any]:
    """One draft's block decoding of every prompt (greedy, at most `decoding.max_new` tokens, cut at its
    `threshold`), checked against the target's greedy `references` and summarised (`block_summary`)."""
    max_new, eos, threshold = decoding.max_new, decoding.eos, decoding.threshold
    started, results, blocks = time.perf_counter(), [], []
    bar = meter(progress, f"evaluate {name}" + (f" (confidence stop {threshold:g})" if threshold else ""),
                len(prompts), "prompt")  # fmt: skip
    for n, (prompt, ref) in enumerate(zip(prompts, references, strict=True), 1):
        tokens, steps = block_decode(runner, draft, prompt, max_new, eos, threshold)
        result = PromptResult(tokens, [a for a, _ in steps], ref, tokens == ref)
        if not result.lossless:
            result.tie_at = _tie_position(runner, name, n, prompt, tokens, ref)
        results.append(result)
        blocks.append(steps)
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - started
    return block_summary(name, path, draft.fields.block_size, results, blocks, seconds, threshold)


def check_block_size(path: str | Path, k: int) -> None:
    """Refuse a directory that is no DSpark draft (a DSpark draft is compared only with DSpark drafts), and a `-k`
    other than its default or the drafter's block size (a block is drafted whole, in one pass)."""
    if not is_dspark_draft(path):
        raise DraftError(f"{path} is not a DSpark draft: a DSpark draft is compared only with DSpark drafts")
    cfg = read_json_file(Path(path) / CONFIG_FILE, DraftError)
    bs = fields_of(cfg).block_size if is_speculators_dspark(cfg) else (cfg.get("dspark") or {}).get("block_size")
    if k not in (EvaluateConfig.num_draft_tokens, bs):
        raise OptionError(f"{path} drafts blocks of {bs} tokens in one pass: -k {k} does not apply to it")


def evaluate_dspark(
    engine: str,
    drafts: Sequence[tuple[str, str]],
    target: str | TargetModel,
    data: str | Path,
    config: EvaluateConfig | None = None,
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """`evaluate` for DSpark drafts, called as `engines.choice.evaluate_with` is: each (name, dspark directory)
    decodes the prompts of `data` greedily against the target, whole blocks and with the confidence stop; the first
    is compared with each later one (paired bootstrap). The drafter's block size is the number of draft tokens:
    `-k` does not apply (a value other than its default or the block size is refused)."""
    cfg = config or EvaluateConfig()
    where, hub = where or Placement(), hub or HubAccess()
    if engine != "transformers":
        raise OptionError(
            f"evaluate --engine {engine} does not run DSpark drafts yet (vLLM serves them as method dspark; this "
            "path does not drive it yet): evaluate them with --engine transformers"
        )
    if where.tensor_parallel_size is not None:
        raise OptionError("--tensor-parallel-size is for --engine vllm (transformers spreads with --device-map)")
    if cfg.temperature:
        raise OptionError("a DSpark draft is evaluated greedily here: --temperature must be 0")
    for _, path in drafts:  # before the target loads
        check_block_size(path, cfg.num_draft_tokens)
    if isinstance(target, TargetModel):
        tm = target
    else:
        device = where.device if where.device_map is not None else resolve_device(where.device)
        tm = TargetModel(target, hub.revision, hub.token, dtype=where.torch_dtype or "float32",
                         device=device or "cpu", device_map=where.device_map)  # fmt: skip
    tokenizer = load_tokenizer(tm.path)
    eos = tokenizer.eos_token_id
    prompts = load_prompts(data, tokenizer, cfg.max_prompts, cfg.max_prompt_length, cfg.skip_bad)
    runner = TargetRunner(tm)  # the greedy reference and the tie check; block_decode reads the drafter's layers
    progress(f"target greedy reference on {len(prompts)} prompts")
    references = [greedy_reference(runner, p, cfg.max_new_tokens, eos) for p in prompts]
    runs: dict[float | None, list[dict[str, Any]]] = {None: [], cfg.confidence_threshold: []}
    block_size = None
    for name, path in drafts:
        draft = open_dspark(path, tm.embedding(), tm.lm_head()).to(tm.device, tm.dtype).eval()
        check_fits(draft, tm, str(path))
        block_size = block_size or draft.fields.block_size
        for threshold, rows in runs.items():
            decoding = replace(Decoding.of(cfg, eos), threshold=threshold)
            rows.append(evaluate_blocks(runner, draft, name, str(path), prompts, references, decoding, progress))
    full, stopped = runs[None], runs[cfg.confidence_threshold]
    import transformers

    out: dict[str, Any] = {
        "target": tm.source,
        "target_family": tm.spec.name,
        "target_commit": tm.commit,
        "data": str(data),
        "device": str(tm.device) if where.device_map is None else f"device_map={where.device_map}",
        "dtype": str(tm.dtype).removeprefix("torch."),
        "tie_tolerance": tie_tolerance(tm.dtype),
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": 0.0,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "draft_sampling": "greedy",
        "draft_kind": DSPARK_KIND,
        "block_size": block_size,
        "results": full,
        "confidence_stop": {"threshold": cfg.confidence_threshold, "source": THRESHOLD_SOURCE, "results": stopped},
        "engine": {"name": "transformers", "version": transformers.__version__},
    }
    if len(full) > 1:
        out["comparison"] = compare_to_baselines(full, seed=cfg.seed)
        out["confidence_stop"]["comparison"] = compare_to_baselines(stopped, seed=cfg.seed)
    return with_headline(out)


__all__ = ["block_decode", "block_summary", "evaluate_dspark", "slots_to_verify"]
