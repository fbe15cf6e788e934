"""Which MTP layer vLLM 0.32's CPU build runs at each draft step, shown by the engine (marker `engine`).

The bundled tiny-mimo-3mtp ships three MTP layers (`model.mtp_layers.{0,1,2}`, `num_nextn_predict_layers: 3`). Its
raw chain draft (`convert --all-layers`) and a copy whose layers 1 and 2 are wrecked (their input projections
zeroed) are served by vLLM (`stitched` export, `{"method": "mtp"}`, k = 3). If vLLM chained the layers, the wrecked
copy would accept far less; it accepts exactly what the raw chain accepts, token for token: vLLM 0.32 runs layer 0 at
every step (`[engines.vllm] step_layers = "first"` in model_specs/mimo.toml). `evaluate` under `--step-layers first`
agrees with vLLM within 5 %, and under `cycle` tells the two drafts apart (so the comparison can fail).

Without vLLM's venv the tests skip, except under CI (`CI` set), where they fail.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.engine import relative_gap

from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.engines.vllm_evaluate import evaluate_in_vllm
from mtp2draft.evaluation.decode import evaluate
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.settings import Placement

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "examples" / "targets" / "tiny-mimo-3mtp"
HELDOUT = ROOT / "examples" / "data" / "heldout.jsonl"
K = 3
SETTINGS = EvaluateConfig(num_draft_tokens=K, max_new_tokens=40, max_prompts=10, max_prompt_length=64)


def log(msg: str) -> None:
    print(f"[engine-chain] {msg}", file=sys.stderr, flush=True)


def wrecked_copy(src: Path, out: Path) -> Path:
    """The chain draft with layers 1 and 2 unable to predict anything (their eh_proj zeroed)."""
    draft = load_draft(src)
    with torch.no_grad():
        for layer in draft.layers[1:]:
            layer.eh_proj.weight.zero_()
    shutil.copytree(src, out)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items()}
    save_tensors(out / "model.safetensors", state, {"format": "pt"})
    return out


@pytest.fixture(scope="session")
def measured(vllm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("engine-chain")
    raw = work / "raw-chain"
    convert(str(TARGET), raw, all_layers=True)  # bf16, like the target
    wrecked = wrecked_copy(raw, work / "wrecked-chain")
    drafts = [("raw", str(raw)), ("wrecked", str(wrecked))]
    lines: list[str] = []
    engine = evaluate_in_vllm(drafts, str(TARGET), HELDOUT, SETTINGS, progress=lambda m: (lines.append(m), log(m)),
                              keep_outputs=True)  # fmt: skip
    first = evaluate(drafts, str(TARGET), HELDOUT, EvaluateConfig(**{**vars(SETTINGS), "step_layers": "first"}),
                     where=Placement(dtype="bfloat16"))  # fmt: skip
    cycle = evaluate(drafts, str(TARGET), HELDOUT, SETTINGS, where=Placement(dtype="bfloat16"))
    out = {"engine": engine, "first": first, "cycle": cycle, "lines": lines}
    log(json.dumps({n: [r["mean_acceptance_length"] for r in out[n]["results"]] for n in ("engine", "first", "cycle")}))
    return out


def test_vllm_runs_layer_zero_at_every_step(measured: dict) -> None:
    raw, wrecked = measured["engine"]["results"]
    outputs = measured["engine"]["engine"]["outputs"]
    assert outputs["raw"] == outputs["wrecked"]  # the same tokens ...
    for metric in ("tokens_accepted", "target_forwards", "per_draft_acceptance"):
        assert raw[metric] == wrecked[metric], metric  # ... and the same counters: layers 1 and 2 never ran
    assert raw["chain"] == {"num_layers": 3, "step_layers": "first", "trained_for": "cycle"}
    # the note names the vLLM that ran, beside the one the family's facts were read from
    running = measured["engine"]["engine"]["version"]
    notes = [m for m in measured["lines"] if "chains 3 layers for step_layers cycle" in m]
    assert notes and all(f"but vllm {running} runs mimo drafts under 'first'" in m for m in notes), notes


def test_evaluate_tells_the_rules_apart_and_matches_vllm_under_its_rule(measured: dict) -> None:
    raw_c, wrecked_c = measured["cycle"]["results"]
    assert wrecked_c["mean_acceptance_length"] < 0.8 * raw_c["mean_acceptance_length"]  # cycle runs layers 1, 2
    raw_f, wrecked_f = measured["first"]["results"]
    assert raw_f["accepted_by_prompt"] == wrecked_f["accepted_by_prompt"]  # first: layer 0 only, as vLLM
    theirs = measured["engine"]["results"][0]["mean_acceptance_length"]
    assert relative_gap(raw_f["mean_acceptance_length"], theirs) <= 0.05, (raw_f["mean_acceptance_length"], theirs)
