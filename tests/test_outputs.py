"""Output directories are claimed: two runs into one --out leave one complete result and one clean refusal, whatever
the interleaving; a claim left by a killed run is taken over; a directory that changed while a run was writing is
never deleted."""

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
from mtp2draft.draft.modules import load_draft
from mtp2draft.errors import OutputExistsError
from mtp2draft.io import atomic_output_dir, claim_output, is_ours, lock_path


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


def test_concurrent_converts_into_one_out_leave_one_result_and_one_refusal(build, tmp_path: Path) -> None:
    src = build("mimo")
    for attempt in range(20):
        out = tmp_path / f"try{attempt}" / "draft"
        results = _race(2, lambda _, out=out: convert(str(src), out, dtype="float32"))
        errors = [r for r in results if r is not None]
        assert len(errors) == 1 and isinstance(errors[0], OutputExistsError), results
        assert "another mtp2draft run" in str(errors[0]) or "not empty" in str(errors[0])
        assert is_ours(out) and load_draft(out) is not None  # complete and loadable
        assert sorted(p.name for p in out.parent.iterdir()) == ["draft"]  # no claim, temporary or old copy left


def test_overlapping_overwrites_refuse_the_second_run(build, tmp_path: Path, monkeypatch) -> None:
    """With --overwrite, a run that starts after another finished replaces it (as asked); while one is writing, the
    other is refused (the first holds its claim a second longer here, so the two overlap)."""
    import mtp2draft.io as io

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
