"""The held-out guard of distill (train/heldout.py): the written weights are the best-scoring evaluation's, the input
draft included; --patience stops; a resumed run writes what an uninterrupted one does; bad combinations refused."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from distill_requests import online
from safetensors.torch import load_file

from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.errors import OptionError
from mtp2draft.train.heldout import HeldoutGuard, implied_acceptance
from mtp2draft.train.parallel import Parallel
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData
from mtp2draft.train.teacher import online_teacher

SMALL = {"steps": 4, "batch_size": 4, "max_length": 48, "save_every": 2, "log_every": 2, "lr": 3e-3}


@pytest.fixture(scope="module")
def heldout_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Held-out records unlike the training ones (other function shapes), 8 of them: two batches of 4."""
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("heldout") / "heldout.jsonl"
    rows = [
        {"text": "\n".join(f"class C{j}:\n    y = {rng.randint(10, 99)}" for j in range(rng.randint(2, 3)))}
        for _ in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_implied_acceptance_is_the_sum_of_running_products() -> None:
    assert implied_acceptance([0.5, 0.5]) == pytest.approx(0.75)
    assert implied_acceptance([1.0, 1.0, 1.0]) == 3.0
    assert implied_acceptance([0.0, 1.0]) == 0.0


def _scripted(monkeypatch: pytest.MonkeyPatch, scores: list[float]) -> list[int]:
    """HeldoutGuard.measure returns `scores` in order; returns the list the measured steps are appended to."""
    it, seen = iter(scores), []

    def measure(self, recipe):
        seen.append(len(self.history))
        score = next(it)
        return [score / 3] * 3, score

    monkeypatch.setattr(HeldoutGuard, "measure", measure)
    return seen


def test_the_input_draft_is_written_unchanged_when_it_scores_best(
    target, text_data, heldout_data, tmp_path: Path, monkeypatch
) -> None:
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    _scripted(monkeypatch, [2.0, 1.5, 1.0])  # steps 0, 2, 4: training only loses
    cfg = DistillConfig(**SMALL, eval_every=2)
    result = distill(online(tmp_path, tgt, "ft", text_data, heldout=heldout_data, config=cfg))
    raw, ft = (
        load_file(str(tmp_path / "raw" / "model.safetensors")),
        load_file(str(tmp_path / "ft" / "model.safetensors")),
    )
    assert raw.keys() == ft.keys() and all(torch.equal(raw[k], ft[k]) for k in raw)
    record = json.loads((tmp_path / "ft" / "provenance.json").read_text())["distill"]["heldout"]
    assert record["best_step"] == 0 and [h["step"] for h in record["history"]] == [0, 2, 4]
    assert result.heldout == record and result.steps == 4


def test_patience_stops_after_that_many_evaluations_without_a_gain(
    target, text_data, heldout_data, tmp_path: Path, monkeypatch
) -> None:
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    _scripted(monkeypatch, [1.0, 1.2, 1.1, 1.1, 9.0])  # best at step 1; steps 2 and 3 gain nothing
    cfg = DistillConfig(**{**SMALL, "steps": 6}, eval_every=1, patience=2)
    result = distill(online(tmp_path, tgt, "ft", text_data, heldout=heldout_data, config=cfg))
    prov = json.loads((tmp_path / "ft" / "provenance.json").read_text())["distill"]
    assert result.steps == 3 and prov["steps"] == 3
    assert prov["heldout"]["stopped_at"] == 3 and prov["heldout"]["best_step"] == 1
    assert [h["step"] for h in prov["heldout"]["history"]] == [0, 1, 2, 3]


def _measure_written(draft_dir: Path, tgt: Path, text_data: Path, heldout: Path, cfg: DistillConfig) -> float:
    """The held-out score of a written draft, measured afresh (nothing shared with the run that wrote it)."""
    draft = load_draft(draft_dir)
    job = DistillJob(draft_dir=draft_dir, out=draft_dir.parent / "unused", target=str(tgt),
                     data=TrainingData(data=text_data), config=cfg)  # fmt: skip
    teacher = online_teacher(draft, job, "cpu")
    draft.attach_target(teacher.embed, teacher.head)
    guard = HeldoutGuard.build(heldout, teacher, cfg.heldout_examples, cfg.batch_size, cfg.max_length, every=1,
                               patience=None)  # fmt: skip
    recipe = SimpleNamespace(
        draft=draft, model=draft, cfg=cfg, par=Parallel(), autocast=contextlib.nullcontext, device="cpu",
        weights=cfg.weights(), vocab_ids=None,
    )  # fmt: skip
    return guard.measure(recipe)[1]


@pytest.mark.slow
def test_written_weights_score_the_best_evaluation_and_resume_agrees(
    target, text_data, heldout_data, tmp_path: Path
) -> None:
    """Real evaluations (no script): the written draft, measured afresh, scores the recorded best; a run stopped and
    resumed writes the same weights and the same held-out history as an uninterrupted one."""
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    cfg = DistillConfig(**{**SMALL, "steps": 6, "lr": 0.05}, eval_every=1)  # a large lr: scores move both ways
    whole = distill(online(tmp_path, tgt, "a", text_data, heldout=heldout_data, config=cfg))
    scores = {h["step"]: h["score"] for h in whole.heldout["history"]}
    assert sorted(scores) == list(range(7)) and all(0 <= s <= 3 for s in scores.values())
    best = max(scores, key=scores.get)
    assert whole.heldout["best_step"] == best
    assert _measure_written(tmp_path / "a", tgt, text_data, heldout_data, cfg) == pytest.approx(scores[best], abs=1e-6)

    distill(online(tmp_path, tgt, "b", text_data, heldout=heldout_data, config=cfg, stop_after=4))
    resumed = distill(online(tmp_path, tgt, "b", text_data, heldout=heldout_data, config=cfg, resume=True))
    assert resumed.heldout["history"] == whole.heldout["history"]
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_guard_options_are_refused_where_they_cannot_apply(target, text_data, heldout_data, tmp_path: Path) -> None:
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw")
    with pytest.raises(OptionError, match="--patience .* needs --heldout"):
        distill(online(tmp_path, tgt, "o", text_data, config=DistillConfig(**SMALL, patience=2)))
    with pytest.raises(OptionError, match="--patience must be a whole number >= 1"):
        DistillConfig(patience=0)
    with pytest.raises(OptionError, match="--eval-every must be a whole number >= 1"):
        DistillConfig(eval_every=0)
    with pytest.raises(OptionError, match="--heldout needs the online target"):
        distill(
            DistillJob(
                draft_dir=tmp_path / "raw",
                out=tmp_path / "o",
                data=TrainingData(hidden_states=tmp_path / "raw", heldout=heldout_data),
                config=DistillConfig(**SMALL),
            )
        )
