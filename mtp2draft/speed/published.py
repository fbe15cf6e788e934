"""Published speculative-decoding figures the speed model is fit on and checked against, as cited data, and the real
configs (trimmed, `configs/*.json`) of the checkpoints they ran.

Each case records what its source states and, marked in `assumed`, what it does not (hardware, batch, context). The
fit (`fit`) reads only each case's *non-speculative* time per token; the speculative speedups are predicted out of
sample (`predict_case`), with the module-level constants of `cost.py` and nothing per case but the engine setting
the source states (how many draft forwards a step runs, on how many devices).

What this module does not do: download anything (the configs ship with the package) or change a constant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from mtp2draft.speed.accelerators import ACCELERATORS
from mtp2draft.speed.cost import fit_layer_latency, forward_time, mtp_draft_cost, target_cost
from mtp2draft.speed.model import Acceptance, step_seconds

CONFIGS = "configs"


def shipped_configs() -> dict[str, str]:
    """Hub repo id -> file name of each real config.json shipped with the package ('org--name.json')."""
    folder = resources.files(__package__).joinpath(CONFIGS)
    return {p.name[: -len(".json")].replace("--", "/"): p.name for p in folder.iterdir() if p.name.endswith(".json")}


def load_config(repo_id: str) -> dict[str, Any]:
    """The shipped config.json of `repo_id` (KeyError when none ships)."""
    name = shipped_configs()[repo_id]
    return json.loads(resources.files(__package__).joinpath(CONFIGS, name).read_text())


@dataclass(frozen=True)
class PublishedCase:
    name: str
    source: str
    model: str  # the checkpoint the figures are for
    config: str  # the shipped config the cost model is built from
    gpu: str
    tp: int
    draft_tp: int
    batch: int
    context: int
    k: int  # draft tokens verified per step
    draft_forwards: int  # draft forwards per step
    acceptance: tuple[float, ...]  # conditional, per draft position
    baseline_s_per_token: float  # without the draft: what the fit may read
    speculative_s_per_token: float  # with it: what the model must predict, never fit
    stated: str
    assumed: tuple[str, ...] = ()

    @property
    def speedup(self) -> float:
        return self.baseline_s_per_token / self.speculative_s_per_token


PUBLISHED_CASES: tuple[PublishedCase, ...] = (
    PublishedCase(
        name="sglang-3582",
        source="https://github.com/sgl-project/sglang/pull/3582",
        model="deepseek-ai/DeepSeek-V3",
        config="deepseek-ai/DeepSeek-V3",
        gpu="h200",
        tp=8,
        draft_tp=8,
        batch=1,
        context=2048,
        k=1,
        draft_forwards=2,
        acceptance=(0.9,),
        baseline_s_per_token=1.76 / 77.0,
        speculative_s_per_token=1.0 / 77.0,
        stated=(
            "1.76x, 77 token/s at batch size 1, ~1.9 mean acceptance length with `--speculative-num-steps 2 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 2` (SGLang counts the root token: one drafted "
            "token verified per step, two draft forwards run); CUDA graph and torch.compile on"
        ),
        assumed=(
            "8x H200, TP 8: the PR does not say; SGLang's DeepSeek documentation gives its MTP speedups 'on H200 TP8'",
            "the draft runs at the target's TP (SGLang's default)",
            "context 2048 tokens (bench_one_batch_server's lengths are not stated; KV is <3 % of bytes here)",
            "baseline = 77 / 1.76 = 43.75 token/s",
        ),
    ),
    PublishedCase(
        name="vllm-12755",
        source="https://github.com/vllm-project/vllm/pull/12755",
        model="deepseek-ai/DeepSeek-R1",
        config="deepseek-ai/DeepSeek-V3",
        gpu="h200",
        tp=8,
        draft_tp=1,
        batch=1,
        context=2048,
        k=1,
        draft_forwards=1,
        acceptance=(0.8165,),
        baseline_s_per_token=55.47e-3,
        speculative_s_per_token=33.99e-3,
        stated=(
            "DeepSeek-R1, --tensor-parallel-size 8, k = 1, acceptance 81 % - 82.3 %, 'Draft TP=1' table: TPOT "
            "55.47 ms -> 33.99 ms (1.63x) at QPS 1"
        ),
        assumed=(
            "8x H200: the PR does not say; the FP8 checkpoint (~690 GB) does not fit 8x 80 GB at its "
            "--gpu-memory-utilization 0.8",
            "batch 1 at QPS 1 (TPOT rises only 4 % from QPS 1 to 2, so few requests overlap)",
            "DeepSeek-R1 has DeepSeek-V3's architecture and config sizes: the V3 config is used",
            "acceptance 0.8165, the middle of the stated range; context 2048 tokens",
        ),
    ),
    PublishedCase(
        name="vllm-39680",
        source="https://github.com/vllm-project/vllm/issues/39680",
        model="Qwen/Qwen3.5-0.8B",
        config="Qwen/Qwen3.5-0.8B",
        gpu="h100",
        tp=1,
        draft_tp=1,
        batch=1,
        context=2048,
        k=1,
        draft_forwards=1,
        acceptance=(0.966,),
        baseline_s_per_token=1.0 / 342.2,
        speculative_s_per_token=1.0 / 128.3,
        stated=(
            "Qwen3.5-0.8B in vLLM, 'Running: 1 reqs': generation throughput 342.2 token/s without MTP, 128.3 with "
            "it, mean acceptance length 1.97, per-position acceptance 0.966 (one draft token)"
        ),
        assumed=(
            "one H100 SXM, TP 1: the issue gives no hardware",
            "context 2048 tokens",
            "the figures are vLLM's 10-second log averages, which also contain prefill and, for this multimodal "
            "model, vision work (prompt throughput 967 vs 1358 token/s in the two windows)",
        ),
    ),
)


def get_case(name: str) -> PublishedCase:
    return next(c for c in PUBLISHED_CASES if c.name == name)


def baseline_inputs(cases: tuple[PublishedCase, ...] = PUBLISHED_CASES) -> list[tuple]:
    """What `fit_layer_latency` reads: each case's non-speculative time per token, nothing speculative."""
    return [
        (target_cost(load_config(c.config)), ACCELERATORS[c.gpu], c.tp, c.batch, c.context, c.baseline_s_per_token)
        for c in cases
    ]


def fit(cases: tuple[PublishedCase, ...] = PUBLISHED_CASES) -> float:
    """LAYER_LATENCY_S as fit from the cases' non-speculative figures (what cost.LAYER_LATENCY_S must equal)."""
    return fit_layer_latency(baseline_inputs(cases))


@dataclass(frozen=True)
class CasePrediction:
    case: str
    baseline_s_per_token: float
    speculative_s_per_token: float
    speedup: float
    published_speedup: float

    @property
    def relative_error(self) -> float:
        return self.speedup / self.published_speedup - 1.0


def predict_case(case: PublishedCase) -> CasePrediction:
    """The model's prediction for a case with the module constants: the case gives only its setting."""
    cfg = load_config(case.config)
    target, draft = target_cost(cfg, case.model), mtp_draft_cost(cfg)
    acc = ACCELERATORS[case.gpu]
    base = forward_time(target, acc, case.tp, case.batch, 1, case.context).seconds
    tokens = Acceptance(case.acceptance, case.name).expected_tokens(case.k)
    assert tokens is not None
    step = step_seconds(
        target, draft, acc, case.k, case.batch, case.tp, case.draft_tp, case.context, case.draft_forwards
    )
    spec = step / tokens
    return CasePrediction(case.name, base, spec, base / spec, case.speedup)


__all__ = [
    "PUBLISHED_CASES",
    "CasePrediction",
    "PublishedCase",
    "baseline_inputs",
    "fit",
    "get_case",
    "load_config",
    "predict_case",
    "shipped_configs",
]
