"""Published speculative-decoding figures the speed model is fit on and checked against, as cited data
(`published.toml`), and the real configs (trimmed, `configs/*.json`) of the checkpoints they ran.

Each case records what its source states and, marked in `assumed`, what it does not (hardware, batch, context). The
fit (`fit`) reads only each case's *non-speculative* time per token; the speculative speedups are predicted out of
sample (`predict_case`), with the module-level constants of `cost.py` and nothing per case but the engine setting
the source states (how many draft forwards a step runs, on how many devices).

What this module does not do: download anything (the configs ship with the package) or change a constant.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from mtp2draft.speed.accelerators import ACCELERATORS
from mtp2draft.speed.cost import fit_layer_latency, forward_time, mtp_draft_cost, target_cost
from mtp2draft.speed.model import Acceptance, Deployment, step_seconds

CONFIGS = "configs"
CASES = "published.toml"


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


def load_cases() -> tuple[PublishedCase, ...]:
    """The cases of `published.toml` (the data, with each source's words), as `PublishedCase`s."""
    data = tomllib.loads(resources.files(__package__).joinpath(CASES).read_text())
    return tuple(
        PublishedCase(**{**case, "acceptance": tuple(case["acceptance"]), "assumed": tuple(case.get("assumed", ()))})
        for case in data["case"]
    )


PUBLISHED_CASES: tuple[PublishedCase, ...] = load_cases()


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
    where = Deployment(acc, case.tp, case.draft_tp, case.context, case.draft_forwards)
    step = step_seconds(target, draft, where, case.k, case.batch)
    spec = step / tokens
    return CasePrediction(case.name, base, spec, base / spec, case.speedup)


__all__ = [
    "PUBLISHED_CASES",
    "CasePrediction",
    "PublishedCase",
    "baseline_inputs",
    "fit",
    "get_case",
    "load_cases",
    "load_config",
    "predict_case",
    "shipped_configs",
]
