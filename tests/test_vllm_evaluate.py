"""`evaluate --engine vllm` without an engine: vLLM's counters turned into both acceptance metrics, the report's
shape (the transformers path's plus `engine`), the drafts exported the way vLLM loads them, and the lossless check
against the plain run. The driver is faked here; the real engine runs in tests/testing/test_engine_evaluate.py
(marker `engine`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.engines import environments, vllm_evaluate
from mtp2draft.engines.vllm_evaluate import acceptance
from mtp2draft.engines.vllm_serve import EngineResult
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.settings import Placement


def test_acceptance_from_vllms_counters_gives_both_metrics() -> None:
    # 10 drafts of k = 3: 7 accepted position 1, 5 of those position 2, 3 of those position 3
    m = {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 15, "accepted_per_position": [7, 5, 3]}
    a = acceptance(m, 3)
    assert a["mean_acceptance_length"] == 1.0 + 15 / 10
    assert a["per_draft_acceptance"] == [0.7, 0.5, 0.3]
    assert a["acceptance_per_position"] == pytest.approx([0.7, 5 / 7, 3 / 5])  # conditional on the earlier ones
    assert (a["tokens_drafted"], a["tokens_accepted"], a["target_forwards"]) == (30, 15, 10)
    none = acceptance({"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}, 2)
    assert none["mean_acceptance_length"] == 1.0 and none["acceptance_per_position"] == [0.0, 0.0]


class FakeDriver:
    """Stands in for `run_vllm`: records what it was asked to serve and answers with fixed counters; the draft named
    `differs` gets another output on prompt 1."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, runs, prompts, generation, setup, log=None):
        self.calls.append({"runs": runs, "prompts": prompts, **vars(generation), **vars(setup)})
        max_new_tokens = generation.max_new_tokens
        plain = [[5] * max_new_tokens for _ in prompts]
        timing = {"output_tokens": len(prompts) * max_new_tokens, "output_tokens_per_s": 100.0, "tpot_ms": 10.0}
        results = {}
        for r in runs:
            for spec in [r.speculative_config or {}]:
                model = spec.get("model")
                assert model is None or Path(model).is_dir()  # the export exists while vLLM runs
            outputs = [list(o) for o in plain]
            if r.name.endswith("differs"):
                outputs[1][0] = 6
            metrics = None
            if r.speculative_config:
                k = r.speculative_config["num_speculative_tokens"]
                metrics = {"drafts": 10, "draft_tokens": 10 * k, "accepted_tokens": 6, "accepted_per_position": [4, 2]}
                metrics["mean_acceptance_length_by_prompt"] = [1.6] * len(prompts)
            results[r.name] = EngineResult(r.name, outputs, metrics, 1.0, 0.5, timing=timing)
        return "0.32.0", results


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / environments.MARKER).write_text("")
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(venv))
    driver = FakeDriver()
    monkeypatch.setattr(vllm_evaluate, "run_vllm", driver)
    return driver


def test_evaluate_engine_vllm_reports_the_transformers_shape(target, text_data, tmp_path, fake_vllm, capsys) -> None:
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    argv = ["evaluate", str(tmp_path / "raw"), "--target", str(tgt), "--data", str(text_data), "-k", "2"]
    limits = ["--max-new-tokens", "4", "--max-prompts", "3"]
    assert main([*argv, *limits, "--engine", "vllm", "--json", "--save"]) == 0, capsys.readouterr().err
    engine = json.loads(capsys.readouterr().out)
    assert main([*argv, *limits, "--json"]) == 0  # --engine transformers, the default
    ours = json.loads(capsys.readouterr().out)
    # the same keys as the transformers path, so push's card and run read either
    assert set(ours) == set(engine) and set(ours["results"][0]) <= set(engine["results"][0])
    assert ours["engine"]["name"] == "transformers" and engine["engine"]["name"] == "vllm"
    assert engine["engine"]["version"] == "0.32.0" and engine["engine"]["plain"]["tpot_ms"] == 10.0
    assert engine["mean_acceptance_length"] == 1.6 and engine["per_draft_acceptance"] == [0.4, 0.2]
    assert engine["acceptance_per_position"] == [0.4, 0.5] and engine["lossless"] is True
    stored = json.loads((tgt / "config.json").read_text()).get("torch_dtype", "bfloat16")
    assert engine["dtype"] == stored  # the checkpoint's own: vLLM was asked for "auto"
    call = fake_vllm.calls[0]
    assert call["dtype"] == "auto" and call["tensor_parallel_size"] == 1 and len(call["prompts"]) == 3
    plain, draft = call["runs"]
    assert plain.speculative_config is None
    assert draft.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}  # native MTP: served in place
    assert draft.model != plain.model  # a view with the stitched export laid over the target
    assert not list(tmp_path.glob("**/.mtp2draft-vllm-eval-*"))  # the exports and views are gone
    assert main([*argv, *limits, "--engine", "vllm"]) == 0  # the table, then the engine's clock
    text = capsys.readouterr().out
    assert "accept len" in text and "vLLM 0.32.0 (tensor parallel 1)" in text and "no draft: 100 tok/s" in text
    # the card push writes from the saved evaluation says where it was measured
    from mtp2draft.hub.card import model_card

    assert "served by vLLM 0.32.0, read from its counters" in str(model_card(tmp_path / "raw"))


def test_evaluate_engine_vllm_finds_outputs_that_differ(target, text_data, tmp_path, fake_vllm) -> None:
    tgt = target("deepseek_v3", num_hidden_layers=6)
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    # aux layers from 1: SGLang's layout (how vLLM is given an EAGLE-3 draft here) cannot say layer 0's output
    convert(str(tgt), tmp_path / "e3", to="eagle3", dtype="float32", aux_layers=[1, 2, 3])
    # a draft whose output differs from the plain run's: lossless false and the prompt named
    drafts = [("draft", str(tmp_path / "raw")), ("differs", str(tmp_path / "e3"))]
    small = EvaluateConfig(num_draft_tokens=2, max_new_tokens=3, max_prompts=2)
    report = vllm_evaluate.evaluate_in_vllm(drafts, str(tgt), text_data, small, keep_outputs=True)
    rows = {r["name"]: r for r in report["results"]}
    assert rows["draft"]["lossless"] is True and rows["differs"]["lossless"] is False
    assert rows["differs"]["mismatched_prompts"] == [1]
    e3 = fake_vllm.calls[0]["runs"][2].speculative_config
    assert e3["method"] == "eagle3" and Path(e3["model"]).name.endswith("sglang")
    assert set(report["engine"]["outputs"]) == {"plain", "draft", "differs"}


def test_evaluate_engine_vllm_at_a_temperature_asks_for_sampled_drafts(target, text_data, tmp_path, fake_vllm) -> None:
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    drafts = [("draft", str(tmp_path / "raw"))]
    sampled = {"temperature": 0.7, "top_p": 0.9, "seed": 3, "draft_sampling": "sample"}
    cfg = EvaluateConfig(num_draft_tokens=2, max_new_tokens=3, max_prompts=2, **sampled)
    where = Placement(dtype="float32", tensor_parallel_size=2)
    report = vllm_evaluate.evaluate_in_vllm(drafts, str(tgt), text_data, cfg, where=where)
    call = fake_vllm.calls[0]
    assert (call["temperature"], call["top_p"], call["seed"], call["tensor_parallel_size"]) == (0.7, 0.9, 3, 2)
    assert call["dtype"] == "float32"
    assert call["runs"][1].speculative_config["draft_sample_method"] == "probabilistic"
    assert report["lossless"] is None and report["results"][0]["mismatched_prompts"] is None
