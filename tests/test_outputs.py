"""Output directories are claimed: two runs of convert, distill or dump-hidden into one --out leave one complete result
and one clean refusal, whatever the interleaving (20 tries each); a claim left by a killed run is taken over; a
directory that changed while a run was writing is never deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer, read_examples
from mtp2draft.draft.disk import load_draft
from mtp2draft.engines.choice import dump_hidden_with
from mtp2draft.errors import OutputExistsError
from mtp2draft.manifest import is_ours
from mtp2draft.outputs.claims import claim_output, lock_path
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.settings import DumpConfig
from mtp2draft.target.dump_checks import check_shards, read_manifest
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData


def _race(n: int, fn) -> list[BaseException | None]:
    """Run fn(i) in n threads released together; each thread's exception (None: it succeeded)."""
    gate = threading.Barrier(n)
    results: list[BaseException | None] = [None] * n

    def one(i: int) -> None:
        gate.wait()
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _one_result_one_refusal(results: list[BaseException | None], out: Path) -> None:
    errors = [r for r in results if r is not None]
    assert len(errors) == 1 and isinstance(errors[0], OutputExistsError), results
    assert "another mtp2draft run" in str(errors[0]) or "not empty" in str(errors[0])
    assert is_ours(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no claim, checkpoints, temporary or old copy


def test_concurrent_converts_into_one_out_leave_one_result_and_one_refusal(build, tmp_path: Path) -> None:
    src = build("mimo")
    for attempt in range(20):
        out = tmp_path / f"try{attempt}" / "draft"
        results = _race(2, lambda _, out=out: convert(str(src), out, dtype="float32"))
        _one_result_one_refusal(results, out)
        assert load_draft(out) is not None  # complete and loadable


@pytest.mark.slow
def test_concurrent_distills_into_one_out_leave_one_result_and_one_refusal(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo", num_hidden_layers=2)
    convert(str(tgt), tmp_path / "draft", dtype="float32")
    cfg = DistillConfig(steps=2, batch_size=2, max_length=24, save_every=1, log_every=1)
    for attempt in range(20):
        out = tmp_path / f"try{attempt}" / "ft"
        results = _race(
            2,
            lambda _, out=out: distill(
                DistillJob(
                    draft_dir=tmp_path / "draft",
                    out=out,
                    target=str(tgt),
                    data=TrainingData(data=text_data),
                    config=cfg,
                )
            ),
        )
        _one_result_one_refusal(results, out)
        assert (
            load_draft(out) is not None and json.loads((out / "provenance.json").read_text())["distill"]["steps"] == 2
        )


def _sequences(tgt: Path, data: Path) -> list[dict]:
    examples, _ = read_examples(data, load_tokenizer(tgt), 24)
    return [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples[:4]]


def _dumped(out: Path, n: int) -> None:
    manifest = read_manifest(out)
    assert sorted(i for s in manifest["shards"] for i in s["sequences"]) == list(range(n))
    check_shards(out, manifest)  # every record there, headers and shapes as the manifest says


@pytest.mark.slow
def test_concurrent_dumps_into_one_out_leave_one_result_and_one_refusal(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo", num_hidden_layers=2)
    seqs = _sequences(tgt, text_data)
    for attempt in range(20):
        out = tmp_path / f"try{attempt}" / "dump"
        results = _race(
            2,
            lambda _, out=out: dump_hidden_with("transformers", str(tgt), seqs, out, DumpConfig(top_k=4, shard_size=2)),
        )
        _one_result_one_refusal(results, out)
        _dumped(out, len(seqs))


@pytest.mark.slow
def test_a_vllm_dump_claims_its_out_while_the_engine_runs(target, text_data, tmp_path: Path, monkeypatch) -> None:
    """The engine's extraction takes minutes on a real target: a second dump into the same --out is refused at once,
    not after it. A stand-in for the vLLM run (the transformers target, slowed down) keeps this on the unit suite."""
    from mtp2draft.engines import vllm_dump
    from mtp2draft.target.hidden import TargetModel

    class SlowEngine(TargetModel):
        vllm_version = "stand-in"

        def __init__(self, target, ids, config, work, *, where, hub, progress) -> None:
            assert lock_path(out).is_file()  # claimed before the engine starts
            time.sleep(0.5)
            super().__init__(target, hub.revision, hub.token)

    monkeypatch.setattr(vllm_dump, "VllmTarget", SlowEngine)
    tgt = target("mimo", num_hidden_layers=2)
    seqs = _sequences(tgt, text_data)
    for attempt in range(20):
        out = tmp_path / f"try{attempt}" / "dump"
        results = _race(
            2, lambda _, out=out: dump_hidden_with("vllm", str(tgt), seqs, out, DumpConfig(top_k=4, shard_size=2))
        )
        errors = [r for r in results if r is not None]
        assert len(errors) == 1 and "another mtp2draft run" in str(errors[0]), results  # refused while it ran
        assert is_ours(out) and sorted(p.name for p in out.parent.iterdir()) == ["dump"]
        _dumped(out, len(seqs))


def test_overlapping_overwrites_refuse_the_second_run(build, tmp_path: Path, monkeypatch) -> None:
    """With --overwrite, a run that starts after another finished replaces it (as asked); while one is writing, the
    other is refused (the first holds its claim a second longer here, so the two overlap)."""
    import mtp2draft.outputs.directories as io

    real = io.mark
    monkeypatch.setattr(io, "mark", lambda path: (time.sleep(1.0), real(path)))
    src = build("mimo")
    out = tmp_path / "draft"
    convert(str(src), out, dtype="float32")
    for _ in range(3):
        results = _race(2, lambda _: convert(str(src), out, dtype="float32", overwrite=True))
        errors = [r for r in results if r is not None]
        assert len(errors) == 1 and "another mtp2draft run" in str(errors[0]), results
        assert is_ours(out) and load_draft(out) is not None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


def test_a_claim_held_by_a_live_run_refuses_and_is_left_alone(build, tmp_path: Path) -> None:
    out = tmp_path / "draft"
    with claim_output(out):
        lock = lock_path(out)
        before = lock.read_text()
        err = _race(1, lambda _: convert(str(build("mimo")), out))[0]
        assert isinstance(err, OutputExistsError) and str(lock) in str(err)
        assert lock.read_text() == before and not out.exists()
    assert not lock.exists()


def test_a_claim_left_by_a_killed_run_is_taken_over(build, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    out = tmp_path / "draft"
    lock_path(out).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename, "command": "x"}))
    convert(str(build("mimo")), out)
    assert is_ours(out) and not lock_path(out).exists()


def test_an_out_that_changed_while_writing_is_put_back_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        (tmp / "x").write_text("1")
    changed = pytest.raises(OutputExistsError, match="changed while this run was writing")
    with changed, atomic_output_dir(out, overwrite=True) as tmp:
        (tmp / "x").write_text("2")
        for f in out.iterdir():  # meanwhile, someone puts their own files there
            f.unlink()
        (out / "thesis.tex").write_text("years of work")
    assert (out / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_out_created_while_writing_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(OutputExistsError), atomic_output_dir(out) as tmp:
        (tmp / "x").write_text("1")
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    assert (out / "mine.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
