"""Every draft mtp2draft exports, served by a real engine: vLLM 0.32's CPU build (marker `engine`, `.ci/run`).

For each bundled target (examples/targets: tiny-deepseek-v3, MLA + MoE; tiny-mimo, Qwen2 trunk) and each format vLLM
loads for it, on the same held-out prompts and k:
- native MTP: the target's own MTP head (raw) and the distilled head written back with `export --format stitched`,
  served with `{"method": "mtp"}`; the distilled head grafted (`export --format stitched --target`) into a
  re-release of tiny-deepseek-v3 that dropped its MTP layer, evaluated against that release;
- EAGLE-3 (DeepSeek-V3 only: vLLM 0.32 captures no aux hidden states for MiMo): `sglang` layout through
  `{"method": "eagle3"}` and `speculators` layout served as the model itself (vLLM reads the verifier from it), each
  as converted (the target's whole vocabulary: no d2t/t2d) and distilled with a reduced draft vocabulary.
Checked: the draft loads; greedy output equals vLLM's own plain decoding of the target; vLLM's mean acceptance length
is within 5 % of `mtp2draft evaluate`'s; a distilled draft beats the undistilled one in vLLM's measurement too.

Everything is built once per session and every vLLM configuration runs in ONE driver process (an engine start costs
a minute or two on 2 CPU cores). Without vLLM's venv the tests skip, except under CI (`CI` set), where they fail.

Not covered: DeepSeek-V4's MTP layer (examples/targets/tiny-deepseek-v4). vLLM 0.32.0's CPU build has a DeepSeek-V4
trunk (`vllm/models/deepseek_v4/cpu/model.py`) but its V4 MTP model is a stub that raises NotImplementedError
(`vllm/models/deepseek_v4/cpu/mtp.py`: "DeepSeek-V4 speculative decoding (MTP) is not implemented on CPU"), and
vLLM 0.34.0's CPU build keeps that stub (its `cpu/mtp.py`); only its GPU module serves the layer. The V4 draft is
checked instead against a reference computation written from vLLM 0.34's GPU forward (tests/test_families.py, its DeepSeek-V4 section).
Nor does the CPU build run the trunk on a CPU without AVX512-BF16 (the CI's): its V4 kernels are only in
`vllm/_C.abi3.so`, which `CpuPlatform.import_kernels` loads on AVX512-BF16 CPUs only, so the model load stops at
`models/deepseek_v4/cpu/cpu_sparse.py:322` (`torch.ops._C.convert_weight_packed` missing); the test below runs that
load and checks the one-line refusal of `dump-hidden --engine vllm` says so (`vllm_dump.cpu_streams_refusal`).
The stream capture for that command (its 4 residual streams before hc_head, vllm_side/stream_capture.py) has a
test for vLLM 0.34's GPU build, skipped without CUDA.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.engine import relative_gap
from support.re_releases import release_variant

from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.engines.vllm_serve import (
    EngineRun,
    EngineSetup,
    Generation,
    run_vllm,
    served_view,
    speculative_config,
)
from mtp2draft.evaluation.decode import TargetRunner, evaluate, greedy_reference, load_prompts
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.formats import ExportConfig
from mtp2draft.formats.export import export, validate
from mtp2draft.settings import DumpConfig
from mtp2draft.target.hidden import TargetModel
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {
    "deepseek": ROOT / "examples" / "targets" / "tiny-deepseek-v3",
    "mimo": ROOT / "examples" / "targets" / "tiny-mimo",
}
TRAIN, HELDOUT = ROOT / "examples" / "data" / "train.jsonl", ROOT / "examples" / "data" / "heldout.jsonl"
K = 3  # draft tokens per step, ours and vLLM's num_speculative_tokens
PROMPTS, NEW_TOKENS, PROMPT_LEN = 10, 40, 64
SETTINGS = EvaluateConfig(
    num_draft_tokens=K, max_new_tokens=NEW_TOKENS, max_prompts=PROMPTS, max_prompt_length=PROMPT_LEN
)
DRAFT_VOCAB = 1024  # reduced draft vocabulary (of 4096)
TOLERANCE = 0.05  # |vLLM - evaluate| / evaluate on mean acceptance length
# a few distillation steps: enough to beat the raw head, cheap enough for CI (the target runs online every step)
DISTILL = {"steps": 20, "ttt_steps": 3, "lr": 2e-3, "batch_size": 4, "max_length": 96, "save_every": 10**9}


def log(msg: str) -> None:
    print(f"[engine] {msg}", file=sys.stderr, flush=True)


def _distill(src: Path, out: Path, target: Path, **extra: Any) -> Path:
    distill(
        DistillJob(
            draft_dir=src,
            out=out,
            target=str(target),
            data=TrainingData(data=TRAIN),
            config=DistillConfig(**{**DISTILL, **extra}),
            progress=log,
        )
    )
    return out


@pytest.fixture(scope="session")
def served(vllm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build every draft, run every vLLM configuration in one driver, evaluate the same drafts with mtp2draft.

    Returns {"cases": {case: {...}}, "baseline": {target: EngineResult}, "vllm_version": str}; a case has the target,
    the vLLM result, our evaluate result and whether the draft is distilled."""
    work = tmp_path_factory.mktemp("engine")
    tok = load_tokenizer(TARGETS["deepseek"])
    prompts = load_prompts(HELDOUT, tok, PROMPTS, PROMPT_LEN)
    runs: list[EngineRun] = []
    cases: dict[str, dict[str, Any]] = {}
    for name, target in TARGETS.items():
        w = work / name
        runs.append(EngineRun(f"{name}/base", served_view(target, w / "view")))
        raw = w / "raw-mtp"
        convert(str(target), raw, to="mtp")  # bf16 like the target: the stitched export is exact
        runs.append(EngineRun(f"{name}/mtp-raw", w / "view", speculative_config("mtp", K)))
        cases[f"{name}/mtp-raw"] = {"target": name, "ours": raw, "distilled": False}
        ft = _distill(raw, w / "mtp-ft", target)
        export(ft, "stitched", w / "mtp-ft-stitched", target=str(target))
        runs.append(
            EngineRun(
                f"{name}/mtp-distilled",
                served_view(target, w / "view-ft", w / "mtp-ft-stitched"),
                speculative_config("mtp", K),
            )
        )
        cases[f"{name}/mtp-distilled"] = {"target": name, "ours": ft, "distilled": True}
    # a graft: DeepSeek-V3 re-released without its MTP layer (a fine-tune's or a quantised export's loss), the
    # distilled head written back into it with `export --format stitched --target`, served as the release plus overlay
    target, w = TARGETS["deepseek"], work / "deepseek"
    mtp_prefix = f"model.layers.{json.loads((target / 'config.json').read_text())['num_hidden_layers']}."
    dropped = release_variant(target, w / "no-mtp-release", mtp_prefix, mtp="drop")
    export(w / "mtp-ft", "stitched", w / "graft", target=str(dropped))
    runs.append(EngineRun("deepseek/graft-distilled", served_view(dropped, w / "view-graft", w / "graft"),
                          speculative_config("mtp", K)))  # fmt: skip
    cases["deepseek/graft-distilled"] = {"target": "deepseek", "ours": w / "mtp-ft", "distilled": True,
                                         "release": dropped, "export": w / "graft"}  # fmt: skip
    # EAGLE-3 on DeepSeek-V3 (vLLM 0.32's DeepseekV3ForCausalLM captures aux hidden states; MiMo's class does not)
    e3 = w / "e3"
    convert(str(target), e3, to="eagle3", dtype="float32")
    # full vocabulary: convert's draft as it is (no d2t/t2d); reduced: distilled with a draft vocabulary (d2t/t2d)
    drafts = {"full": e3, "reduced": _distill(e3, w / "e3-reduced", target, draft_vocab_size=DRAFT_VOCAB)}
    for vocab, draft in drafts.items():
        for fmt in ("sglang", "speculators"):
            out = w / f"e3-{vocab}-{fmt}"
            export(draft, fmt, out, config=ExportConfig(dtype="float32", speculative_tokens=K))
            case = f"deepseek/eagle3-{fmt}-{vocab}"
            if fmt == "sglang":
                runs.append(EngineRun(case, target, speculative_config("eagle3", K, out)))
            else:  # vLLM's speculators path: the draft is the model, its config names the verifier and k
                runs.append(EngineRun(case, out))
            cases[case] = {"target": "deepseek", "ours": out, "distilled": vocab == "reduced", "export": out}
    log(f"vLLM: {len(runs)} configurations")
    version, results = run_vllm(runs, prompts, Generation(max_new_tokens=NEW_TOKENS), log=log)
    for r in results.values():
        log(f"{r.name}: start {r.start_s}s, generate {r.generate_s}s, error {r.error}")
    references = {}  # transformers' own greedy decoding of each target: does vLLM compute the same model?
    for name, target in TARGETS.items():
        tm = TargetModel(str(target))
        runner = TargetRunner(tm, load_draft(work / name / "raw-mtp"))
        references[name] = [greedy_reference(runner, p, NEW_TOKENS, tok.eos_token_id) for p in prompts]
    by_target: dict[Path, list[tuple[str, Path]]] = {}  # evaluated against the checkpoint vLLM served
    for case, c in cases.items():
        c["vllm"] = results[case]
        by_target.setdefault(c.get("release", TARGETS[c["target"]]), []).append((case, c["ours"]))
    for served_target, drafts_ in by_target.items():
        report = evaluate(drafts_, str(served_target), HELDOUT, SETTINGS)
        for row in report["results"]:
            cases[row["name"]]["evaluate"] = row
    summary = {
        case: (
            c["evaluate"]["mean_acceptance_length"],
            (c["vllm"].metrics or {}).get("mean_acceptance_length"),
        )
        for case, c in cases.items()
    }
    log(f"vLLM {version}: case -> (evaluate, vLLM) mean acceptance length at k={K}: {summary}")
    if report_path := os.environ.get("MTP2DRAFT_ENGINE_REPORT"):  # the figures docs/results.md quotes
        Path(report_path).write_text(json.dumps(_report(version, cases, results), indent=2))
    return {
        "cases": cases,
        "baseline": {n: results[f"{n}/base"] for n in TARGETS},
        "reference": references,
        "vllm_version": version,
    }


def _report(version: str, cases: dict[str, dict[str, Any]], results: dict) -> dict[str, Any]:
    return {
        "vllm_version": version,
        "k": K,
        "prompts": PROMPTS,
        "new_tokens": NEW_TOKENS,
        "prompt_tokens_max": PROMPT_LEN,
        "distill": DISTILL,
        "draft_vocab_size_reduced": DRAFT_VOCAB,
        "engine_start_s": {name: r.start_s for name, r in results.items()},
        "generate_s": {name: r.generate_s for name, r in results.items()},
        "cases": {
            case: {
                "evaluate": {k: c["evaluate"][k] for k in ("mean_acceptance_length", "acceptance_per_position")},
                "vllm": c["vllm"].metrics,
                "vllm_error": c["vllm"].error,
                "distilled": c["distilled"],
            }
            for case, c in cases.items()
        },
    }


CASES = [
    "deepseek/mtp-raw",
    "deepseek/mtp-distilled",
    "deepseek/graft-distilled",
    "mimo/mtp-raw",
    "mimo/mtp-distilled",
    "deepseek/eagle3-sglang-full",
    "deepseek/eagle3-speculators-full",
    "deepseek/eagle3-sglang-reduced",
    "deepseek/eagle3-speculators-reduced",
]


# vLLM 0.32's CPU build cannot run a non-MLA draft beside an MLA target: the KV cache needs one block size, CPU_MLA
# supports only 16 and CPU_ATTN (the EAGLE-3 Llama layer's) only multiples of 32 (v1/attention/backends/mla/cpu_mla.py,
# cpu_attn.py). The failure comes after both models' weights are loaded, so the loading itself is still checked.
# The manager's size in the message is 16 where the target's config sets it (the `sglang` layout, the target served)
# and vLLM's CPU default 128 where the speculators draft is the served model: no size suits both backends either way.
CPU_BLOCK_SIZE_LIMIT = re.compile(r"No common block size for \d+ \(CPU_MLA: \[16\]; CPU_ATTN: \[MultipleOf\(32\)\]\)")


def _engine_limit(c: dict) -> str | None:
    """The known vLLM CPU limitation that stopped this run after loading, or None (the run worked, or failed for
    another reason, which the caller then reports as a failure)."""
    r = c["vllm"]
    if r.error is not None and (hit := next(filter(None, map(CPU_BLOCK_SIZE_LIMIT.search, r.log_errors)), None)):
        return f"vLLM 0.32 CPU: EAGLE-3 beside an MLA target: {hit.group(0)}"
    return None


def _diverging(served: dict, target: str) -> list[int]:
    """Prompts on which vLLM's plain greedy decoding of `target` differs from transformers' (mtp2draft's reference)."""
    base = served["baseline"][target].check().outputs
    return [i for i, (a, b) in enumerate(zip(base, served["reference"][target], strict=True)) if a != b]


# vLLM 0.32.0's CPU build computed MLA targets (tiny-deepseek-v3) differently from transformers: its CPU rotary op
# mishandles the strided q_pe / k_pe views DeepSeek's MLA passes (benchmarks/vllm-repro/repro_vllm_cpu_rope.py). The drivers apply
# the fix for MLA targets (engines/vllm_side/cpu_fixes.py), after which vLLM's fp32 log-probabilities equal
# transformers' to ~1e-5 (docs/engines.md), so every comparison below is held for both targets.


@pytest.mark.parametrize("target", list(TARGETS))
def test_vllm_plain_greedy_equals_transformers(served: dict, target: str) -> None:
    diff = _diverging(served, target)
    assert not diff, f"vLLM's greedy decoding of {target} differs from transformers' on prompts {diff}"


def test_vllm_is_the_version_the_facts_were_read_from(served: dict) -> None:
    assert served["vllm_version"] == "0.32.0"


@pytest.mark.parametrize("case", CASES)
def test_draft_loads_and_speculates(served: dict, case: str) -> None:
    c = served["cases"][case]
    if (limit := _engine_limit(c)) is not None:
        # both the target's and the draft's weights loaded (a d2t/t2d the draft should not carry, a wrong name or
        # shape fails here, before the KV cache), then the engine stopped at the CPU build's limitation
        loaded = c["vllm"].log_loaded
        assert len(loaded) >= 2, f"{case}: the draft's weights did not load: {c['vllm'].log_errors}"
        pytest.xfail(limit)
    result = c["vllm"].check()
    m = result.metrics
    assert m is not None and m["drafts"] > 0 and m["draft_tokens"] == K * m["drafts"], m
    assert len(m["accepted_per_position"]) == K
    assert m["accepted_tokens"] > 0, f"{case}: vLLM accepted nothing (a draft loaded wrong accepts ~nothing)"
    if "export" in c:
        assert validate(c["export"]) == []


@pytest.mark.parametrize("case", CASES)
def test_speculative_output_equals_vllm_plain_greedy(served: dict, case: str) -> None:
    c = served["cases"][case]
    if (limit := _engine_limit(c)) is not None:
        pytest.xfail(limit)
    base = served["baseline"][c["target"]].check()
    out = c["vllm"].check().outputs
    assert len(base.outputs) == PROMPTS and all(len(o) > 0 for o in base.outputs)
    diff = [i for i, (a, b) in enumerate(zip(out, base.outputs, strict=True)) if a != b]
    assert not diff, f"{case}: speculative output differs from vLLM's plain greedy on prompts {diff}"


@pytest.mark.parametrize("case", CASES)
def test_vllm_acceptance_matches_evaluate(served: dict, case: str) -> None:
    c = served["cases"][case]
    if (limit := _engine_limit(c)) is not None:
        pytest.xfail(limit)
    ours = c["evaluate"]["mean_acceptance_length"]
    theirs = c["vllm"].check().metrics["mean_acceptance_length"]
    assert c["evaluate"]["lossless"]
    assert relative_gap(ours, theirs) <= TOLERANCE, (
        f"{case}: vLLM {theirs:.3f} vs evaluate {ours:.3f} tokens per step "
        f"(per position vLLM {c['vllm'].metrics['acceptance_per_position']}, "
        f"ours {c['evaluate']['acceptance_per_position']})"
    )


@pytest.mark.parametrize(
    "raw, tuned",
    [
        ("deepseek/mtp-raw", "deepseek/mtp-distilled"),
        ("mimo/mtp-raw", "mimo/mtp-distilled"),
        ("deepseek/eagle3-sglang-full", "deepseek/eagle3-sglang-reduced"),
    ],
)
def test_distilled_beats_the_raw_head_in_vllm(served: dict, raw: str, tuned: str) -> None:
    for case in (raw, tuned):
        if (limit := _engine_limit(served["cases"][case])) is not None:
            pytest.xfail(limit)
    before = served["cases"][raw]["vllm"].check().metrics["mean_acceptance_length"]
    after = served["cases"][tuned]["vllm"].check().metrics["mean_acceptance_length"]
    assert after > before, f"vLLM: {tuned} {after:.3f} <= {raw} {before:.3f} tokens per step"


# ---- dump-hidden --engine vllm: vLLM's extract_hidden_states vs the transformers dump (tiny-mimo) -----------------
# fp32 in both (bf16 weights read into fp32): vLLM's CPU kernels sum in another order than torch's, so states agree to
# a few fp32 ulps of the tensor's scale per layer; measured max |diff| / max |value| ~1e-6 over 8 layers (vLLM 0.32.0)
STATE_RTOL = 1e-5
LOGPROB_ATOL = 1e-4  # the top-k log-probs: measured max |diff| ~2e-5
DUMP_SEQUENCES = DISTILL["steps"] * DISTILL["batch_size"]  # the sequences the distills read, each once
# the top-k kept: tiny-mimo's top-64 covers only 62 % of its probability mass; with the tail bucket (ttt.top_k_kl) a
# distill from k = 64 came out 7.7 % above the online one on these 10 prompts, from k = 256 within 1.1 % (measured
# on transformers dumps, 2026-11-30), so the comparison with the online distill uses 256
DUMP_TOP_K = 256
DUMP_AUX = [1, 4, 6]  # EAGLE-3-style aux layers too (vLLM ids 2, 5, 7; the mtp draft reads only `final`)


@pytest.fixture(scope="session")
def vllm_dump(vllm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tiny-mimo's first DUMP_SEQUENCES training lines dumped by vLLM and by transformers, the raw MTP head
    distilled online and from the vLLM dump with the same data and steps, both evaluated."""
    from mtp2draft.data import read_examples
    from mtp2draft.engines.choice import dump_hidden_with

    work, target = tmp_path_factory.mktemp("vllm-dump"), TARGETS["mimo"]
    data = work / "train.jsonl"
    data.write_text("".join(TRAIN.read_text().splitlines(keepends=True)[:DUMP_SEQUENCES]))
    examples, _ = read_examples(data, load_tokenizer(target), DISTILL["max_length"], False)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    raw = work / "raw-mtp"
    convert(str(target), raw, to="mtp")
    final = load_draft(raw).input_hidden
    dumps = {
        engine: dump_hidden_with(
            engine,
            str(target),
            seqs,
            work / engine,
            DumpConfig(aux_layers=DUMP_AUX, top_k=DUMP_TOP_K, final=final),
            progress=log,
        )
        for engine in ("vllm", "transformers")
    }
    cfg = DistillConfig(**DISTILL)
    distill(
        DistillJob(
            draft_dir=raw,
            out=work / "online",
            target=str(target),
            data=TrainingData(data=data),
            config=cfg,
            progress=log,
        )
    )
    distill(
        DistillJob(
            draft_dir=raw,
            out=work / "offline",
            data=TrainingData(hidden_states=dumps["vllm"]),
            config=cfg,
            progress=log,
        )
    )
    drafts = [("online", work / "online"), ("offline-vllm", work / "offline")]
    report = evaluate(drafts, str(target), HELDOUT, SETTINGS)
    acceptance = {row["name"]: row["mean_acceptance_length"] for row in report["results"]}
    log(f"dump-hidden --engine vllm: mean acceptance at k={K}: {acceptance}")
    return {"dumps": dumps, "acceptance": acceptance, "sequences": len(seqs)}


def test_vllm_dump_equals_the_transformers_dump(vllm_dump: dict) -> None:
    from mtp2draft.target.dumps import OfflineHiddenStates

    ours, theirs = (OfflineHiddenStates(vllm_dump["dumps"][e]) for e in ("transformers", "vllm"))
    assert len(ours) == len(theirs) == vllm_dump["sequences"]
    assert theirs.manifest["final"] == ours.manifest["final"] and theirs.aux_layers == ours.aux_layers
    worst: dict[str, float] = {}
    for n in range(len(ours)):
        a, b = ours.sequence(n), theirs.sequence(n)
        assert a.keys() == b.keys()
        for key in ("input_ids", "loss_mask"):
            assert torch.equal(a[key], b[key]), (n, key)
        for key in ("final", "aux"):
            gap = float((a[key] - b[key]).abs().max() / a[key].abs().max())
            worst[key] = max(worst.get(key, 0.0), gap)
        worst["topk_logprobs"] = max(
            worst.get("topk_logprobs", 0.0), float((a["topk_logprobs"] - b["topk_logprobs"]).abs().max())
        )
        # the same ids, except where two log-probs tie within the tolerance and may swap places
        swapped = a["topk_ids"] != b["topk_ids"]
        if swapped.any():
            assert (a["topk_logprobs"][swapped] - b["topk_logprobs"][swapped]).abs().max() <= LOGPROB_ATOL, n
    log(f"vLLM dump vs transformers dump, worst: {worst}")
    assert max(worst["final"], worst["aux"]) <= STATE_RTOL and worst["topk_logprobs"] <= LOGPROB_ATOL, worst
    assert torch.equal(ours.embedding(), theirs.embedding()) and torch.equal(ours.lm_head(), theirs.lm_head())


def test_distill_from_the_vllm_dump_reaches_the_online_distill(vllm_dump: dict) -> None:
    online, offline = vllm_dump["acceptance"]["online"], vllm_dump["acceptance"]["offline-vllm"]
    assert relative_gap(online, offline) <= TOLERANCE, f"offline from vLLM {offline:.3f} vs online {online:.3f}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM 0.34's GPU build only: no DeepSeek-V4 MTP on CPU")
def test_deepseek_v4_vllm_dump_holds_the_streams_transformers_dumps(vllm: Path, tmp_path: Path) -> None:
    """tiny-deepseek-v4 dumped by vLLM (the pre-hc_head residual streams through vllm_side/stream_capture.py) and by
    transformers: the same [T, 4, H] finals and top-k within the tolerances of the MiMo comparison above."""
    from mtp2draft.data import read_examples
    from mtp2draft.engines.choice import dump_hidden_with
    from mtp2draft.target.dumps import OfflineHiddenStates

    target = ROOT / "examples" / "targets" / "tiny-deepseek-v4"
    data = tmp_path / "train.jsonl"
    data.write_text("".join(TRAIN.read_text().splitlines(keepends=True)[:4]))
    examples, _ = read_examples(data, load_tokenizer(target), 64, False)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    dumps = {e: OfflineHiddenStates(dump_hidden_with(e, str(target), seqs, tmp_path / e, DumpConfig(top_k=8), progress=log))
             for e in ("vllm", "transformers")}  # fmt: skip
    for n in range(len(seqs)):
        a, b = dumps["transformers"].sequence(n), dumps["vllm"].sequence(n)
        assert a["final"].shape[-2:] == b["final"].shape[-2:] == (4, 128), a["final"].shape
        assert float((a["final"] - b["final"]).abs().max() / a["final"].abs().max()) <= STATE_RTOL, n


@pytest.mark.skipif(torch.cuda.is_available(), reason="a fact of vLLM's CPU build")
def test_deepseek_v4_on_the_cpu_build_fails_where_the_refusal_says(
    vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """`dump-hidden --engine vllm` refuses tiny-deepseek-v4 on vLLM 0.32.0's CPU build without AVX512-BF16, naming
    the model load that fails (vllm_dump.cpu_streams_refusal); with the refusal lifted, vLLM itself is run on the target
    and fails there: the missing kernel, at that source line, before any hidden state is extracted."""
    from mtp2draft.data import read_examples
    from mtp2draft.engines import vllm_dump as extraction  # the session fixture `vllm_dump` holds the name
    from mtp2draft.engines.choice import dump_hidden_with
    from mtp2draft.engines.environments import EngineUnavailable

    if extraction.has_vllm_cpu_v4_kernels():
        pytest.skip("this CPU has AVX512-BF16: vLLM loads its DeepSeek-V4 kernels (the refusal gives another reason)")
    target = ROOT / "examples" / "targets" / "tiny-deepseek-v4"
    data = tmp_path / "train.jsonl"
    data.write_text("".join(TRAIN.read_text().splitlines(keepends=True)[:2]))
    examples, _ = read_examples(data, load_tokenizer(target), 64, False)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    with pytest.raises(EngineUnavailable, match=r"cpu_sparse\.py:322 \(no torch\.ops\._C\.convert_weight_packed\)"):
        dump_hidden_with("vllm", str(target), seqs, tmp_path / "refused", DumpConfig(top_k=8), progress=log)
    capfd.readouterr()
    monkeypatch.setattr(extraction, "cpu_streams_refusal", lambda _: None)
    with pytest.raises(EngineUnavailable, match="hidden-state extraction failed"):
        dump_hidden_with("vllm", str(target), seqs, tmp_path / "run", DumpConfig(top_k=8), progress=log)
    engine_log = capfd.readouterr().err
    assert "Resolved architecture: DeepseekV4ForCausalLM" in engine_log  # vLLM took it as the V4 trunk
    assert 'models/deepseek_v4/cpu/cpu_sparse.py", line 322' in engine_log, engine_log[-4000:]
    assert "object has no attribute 'convert_weight_packed'" in engine_log, engine_log[-4000:]
    assert not any((tmp_path / "run").glob("hidden-*"))


# ---- dump-hidden --engine vllm --regenerate: the target's own responses, written by vLLM --------------------------
def test_dump_hidden_regenerate_in_vllm_dumps_vllms_own_responses(vllm: Path, tmp_path: Path) -> None:
    """The command as a user runs it on a chat file: the dump holds, per record, the prompt (the chat template's
    rendering of the turns before the assistant's) followed by exactly what vLLM's plain greedy generation of that
    prompt writes (run here on its own), the loss mask on the response only."""
    from mtp2draft.cli.app import main
    from mtp2draft.data import read_examples, regeneration_prompts, with_response
    from mtp2draft.target.dumps import OfflineHiddenStates

    target, chats = TARGETS["mimo"], ROOT / "examples" / "data" / "chat.jsonl"
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(chats.read_text().splitlines(keepends=True)[6:10]))  # prompts of 48 to 154 tokens
    max_length = 320
    argv = ["dump-hidden", "--target", str(target), "--data", str(data), "--out", str(tmp_path / "dump")]
    assert main([*argv, "--engine", "vllm", "--regenerate", "--max-length", str(max_length), "--top-k", "8"]) == 0
    tok = load_tokenizer(target)
    examples, _ = read_examples(data, tok, max_length, False)
    jobs = regeneration_prompts(examples, max_length // 2)
    with_view = served_view(target, tmp_path / "view")
    setup = EngineSetup(dtype="float32", max_model_len=max(len(p) + b for p, b in jobs) + 1)
    _, plain = run_vllm([EngineRun("plain", with_view)], [p for p, _ in jobs], Generation(max_new_tokens=max(b for _, b in jobs)),
                        setup)  # fmt: skip
    dump = OfflineHiddenStates(tmp_path / "dump")
    assert len(dump) == len(examples) == 4
    for n, (ex, job, out) in enumerate(zip(examples, jobs, plain["plain"].check().outputs, strict=True)):
        want = with_response(ex, job, out, tok.eos_token_id)
        got = dump.sequence(n)
        assert got["input_ids"].tolist() == want.input_ids, n
        assert got["loss_mask"].tolist() == want.loss_mask and sum(want.loss_mask) >= 1, n
        assert want.input_ids[: ex.prompt_length] == ex.input_ids[: ex.prompt_length]  # the prompt is the data's
