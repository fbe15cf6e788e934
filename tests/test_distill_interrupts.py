"""`distill --heldout` stopped at each phase of its writing (before its first checkpoint, inside a checkpoint's save,
inside the best weights' save), by Ctrl-C, by `kill -9` or by a full disk: the next run resumes with --resume or
starts over with --overwrite, and a run that finishes leaves no checkpoint folder behind.

`kill -9` runs no cleanup, so it is shown in-process by what it leaves on disk: the work directory is copied at the
kill point and put back after the (interrupted) run, claim files excepted (a dead run's claim is taken over by the
next run; tests/test_outputs.py proves that with a real dead process).
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.outputs.claims import LOCK_SUFFIX
from mtp2draft.train import heldout
from mtp2draft.train.heldout import HeldoutGuard
from mtp2draft.train.recipe import DistillRecipe


class Stop(BaseException):
    """The interrupt, raised at the phase under test."""


@pytest.fixture(scope="module")
def setup(target, text_data, tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    root = tmp_path_factory.mktemp("interrupts")
    tgt = target("mimo")
    convert(str(tgt), root / "raw", dtype="float32")
    held = root / "heldout.jsonl"
    held.write_text("".join(json.dumps({"text": f"class C{i}:\n    y = {i}"}) + "\n" for i in range(4)))
    return tgt, root / "raw", text_data, held


def _argv(setup, work: Path, *extra: str) -> list[str]:
    tgt, raw, data, held = setup
    return [
        "distill", str(raw), "--target", str(tgt), "--data", str(data), "--heldout", str(held),
        "--out", str(work / "out"), "--steps", "3", "--batch-size", "2", "--max-length", "24",
        "--save-every", "1", "--eval-every", "1", *extra,
    ]  # fmt: skip


@pytest.fixture
def rising(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every held-out evaluation scores better than the last, so each one writes the best weights (and is quick)."""

    def measure(self, recipe):
        score = 1.0 + 0.1 * len(self.history)
        return [score / 3] * 3, score

    monkeypatch.setattr(HeldoutGuard, "measure", measure)


def _at_first_step(mp, stop: Callable[[], None]) -> None:
    """After the step-0 held-out evaluation (best-0000000 written), before the first checkpoint."""
    real = DistillRecipe.train_step

    def step(self, n):
        if n == 0:
            stop()
        return real(self, n)

    mp.setattr(DistillRecipe, "train_step", step)


def _in_second_checkpoint(mp, stop: Callable[[], None]) -> None:
    """Inside the step-2 checkpoint's save: its shards are on disk, its state.json not yet (step-1 is complete)."""
    real = dcp.save

    def save(state, *, checkpoint_id, **kw):
        real(state, checkpoint_id=checkpoint_id, **kw)
        if "step-0000002" in str(checkpoint_id):
            stop()

    mp.setattr(dcp, "save", save)


def _in_best_weights(mp, stop: Callable[[], None]) -> None:
    """Inside the step-2 best weights' save, its safetensors file half written (step-2's checkpoint is not yet)."""
    real = heldout.save_tensors

    def save(path: Path, tensors, metadata=None):
        real(path, tensors, metadata)
        if "best-0000002" in str(path):
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            stop()

    mp.setattr(heldout, "save_tensors", save)


PHASES = {"before_the_first_checkpoint": _at_first_step, "in_a_checkpoint": _in_second_checkpoint}
PHASES["in_the_best_weights"] = _in_best_weights


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def _disk_full() -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _interrupt(setup, work: Path, phase: str, how: str, capsys) -> None:
    """Run distill into `work` and stop it at `phase` by `how`; what it leaves is on disk."""
    kept = work.parent / f"{work.name}-at-kill"

    def kill() -> None:
        shutil.copytree(work, kept, symlinks=True)
        raise Stop

    with pytest.MonkeyPatch.context() as mp:
        PHASES[phase](mp, {"ctrl_c": _ctrl_c, "kill": kill, "full_disk": _disk_full}[how])
        if how == "kill":
            with pytest.raises(Stop):
                main(_argv(setup, work))
            shutil.rmtree(work)
            kept.rename(work)
            for claim in work.glob(f"*{LOCK_SUFFIX}"):
                claim.unlink()
        else:
            assert main(_argv(setup, work)) == (130 if how == "ctrl_c" else 1)
            err = capsys.readouterr().err
            assert how == "ctrl_c" or "error: No space left on device" in err, err
    assert not (work / "out").exists()
    left = sorted(p.name for p in (work / "out.checkpoints").iterdir()) if (work / "out.checkpoints").exists() else []
    if how != "kill":  # cleanup ran: no temporary folder, no truncated file, nothing that is not resumable
        assert not [n for n in left if n.startswith(".") and n.endswith((".tmp", ".old"))], left
        assert not left or any(n.startswith("step-") for n in left), left  # only a folder that holds a checkpoint


@pytest.mark.parametrize("how", ["ctrl_c", "kill", "full_disk"])
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_an_interrupted_run_resumes_and_starts_over(
    setup, phase: str, how: str, rising, tmp_path: Path, capsys
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    _interrupt(setup, work, phase, how, capsys)
    again = tmp_path / "again"
    shutil.copytree(work, again, symlinks=True)
    assert main(_argv(setup, work, "--resume")) == 0, capsys.readouterr().err
    assert main(_argv(setup, again, "--overwrite")) == 0, capsys.readouterr().err
    for done in (work, again):
        assert sorted(p.name for p in done.iterdir()) == ["out"]  # checkpoints gone, nothing beside the draft
        assert json.loads((done / "out" / "provenance.json").read_text())["distill"]["heldout"]["best_step"] == 3


def test_a_run_killed_after_its_first_evaluation_is_not_blamed_on_the_user(setup, rising, tmp_path, capsys) -> None:
    """The checkpoint folder exists (and is marked) before anything is written into it: a plain rerun goes ahead."""
    _interrupt(setup, tmp_path, "before_the_first_checkpoint", "kill", capsys)
    assert sorted(p.name for p in (tmp_path / "out.checkpoints").iterdir()) == [
        ".mtp2draft",
        ".mtp2draft-checkpoints",
        "best-0000000",
    ]
    assert main(_argv(setup, tmp_path)) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_best_folder_left_unmarked_by_an_older_version_is_taken_over(setup, rising, tmp_path, capsys) -> None:
    """Older versions wrote `best/` before marking the folder: that leftover is recognised as a checkpoint folder."""
    best = tmp_path / "out.checkpoints" / "best"
    best.mkdir(parents=True)
    (best / "model.safetensors").write_bytes(b"half")
    assert main(_argv(setup, tmp_path, "--resume")) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
