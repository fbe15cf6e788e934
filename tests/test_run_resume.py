"""`run` resumes: a run stopped in any stage, rerun with the same command and --work, finishes without redoing the
stages it finished; a rerun with other inputs or settings is refused in one line naming --work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtp2draft import pipeline
from mtp2draft.cli.app import main
from mtp2draft.pipeline.record import RECORD

TAIL = ["--steps", "4", "--save-every", "2", "--batch-size", "2", "--max-length", "32"]
TAIL += ["--max-prompts", "2", "--max-new-tokens", "6", "-k", "2"]
STAGES = ("convert", "distill", "evaluate", "export")


def _args(source: Path, data: Path, work: Path, *extra: str) -> list[str]:
    return ["run", str(source), "--data", str(data), "--work", str(work), "--to", "mtp", *TAIL, *extra]


def _count_calls(monkeypatch, calls: list[str], fail: str | None = None, error: type = KeyboardInterrupt) -> None:
    """Wrap each stage function `run` calls: record the call, and make `fail`'s call raise `error` (a kill, or a
    stage's own failure) after the stage has started."""
    for stage in STAGES:
        real = getattr(pipeline, stage)

        def wrapped(*args, _stage=stage, _real=real, **kwargs):
            calls.append(_stage)
            if _stage == fail:
                raise error() if error is KeyboardInterrupt else error(f"injected failure in {_stage}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(pipeline, stage, wrapped)


@pytest.mark.slow  # ~1 min: a stopped run and its rerun, for each stage
@pytest.mark.parametrize("stopped", STAGES)
def test_a_rerun_continues_after_the_finished_stages(target, text_data, tmp_path, monkeypatch, capsys, stopped):
    from mtp2draft.errors import CheckpointError

    source, work = target("mimo", num_hidden_layers=4), tmp_path / "w"
    args = _args(source, text_data, work)
    first: list[str] = []
    with monkeypatch.context() as patch:
        error = KeyboardInterrupt if stopped in ("convert", "evaluate") else CheckpointError
        _count_calls(patch, first, fail=stopped, error=error)
        assert main(args) != 0
    err = capsys.readouterr().err
    done = list(STAGES[: STAGES.index(stopped)])
    assert first == [*done, stopped]
    assert f"run stopped in {stopped}" in err and "Rerun the same command" in err, err
    record = json.loads((work / RECORD).read_text())
    assert list(record["finished"]) == done

    again: list[str] = []
    with monkeypatch.context() as patch:
        _count_calls(patch, again)
        assert main(args) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert again == list(STAGES[STAGES.index(stopped) :])  # the finished stages are not run again
    kept = [line for line in err.splitlines() if line.endswith("finished in an earlier run, kept")]
    assert len(kept) == len(done), err
    assert "raw MTP head (baseline)" in out and f"export: {work / 'export-stitched'}" in out
    assert list(json.loads((work / RECORD).read_text())["finished"]) == list(STAGES)
    # the summary's launch lines are the export README's: the same overlay lines and the same k (-k 2)
    readme = (work / "export-stitched" / "README.md").read_text()
    assert f"cp {work}/export-stitched/*.safetensors" in out and f"cp {work}/export-stitched/*.safetensors" in readme
    assert '"num_speculative_tokens": 2' in out and '"num_speculative_tokens": 2' in readme

    # a finished run rerun: nothing is redone, the table is printed again
    third: list[str] = []
    with monkeypatch.context() as patch:
        _count_calls(patch, third)
        assert main(args) == 0
    assert third == [] and "raw MTP head (baseline)" in capsys.readouterr().out


def test_a_rerun_with_other_settings_is_refused_naming_work(target, text_data, tmp_path, monkeypatch, capsys):
    source, work = target("mimo", num_hidden_layers=4), tmp_path / "w"
    calls: list[str] = []
    with monkeypatch.context() as patch:
        _count_calls(patch, calls, fail="distill")
        assert main(_args(source, text_data, work)) != 0
    capsys.readouterr()
    with monkeypatch.context() as patch:
        _count_calls(patch, calls)
        assert main(_args(source, text_data, work, "--lr", "0.5")) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and f"--work {work} holds a run of other inputs or settings" in lines[0], err
        assert "distill.lr" in lines[0] and "--overwrite" in lines[0]
        other = tmp_path / "other.jsonl"
        other.write_text(text_data.read_text().replace("return", "yield"))
        assert main(_args(source, other, work)) == 2
        assert "training.data" in capsys.readouterr().err
    assert calls == ["convert", "distill"]  # nothing ran on the refused reruns
    # a --work that holds no run: refused naming --work (it used to say --out)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    assert main(_args(source, text_data, stray)) == 2
    err = capsys.readouterr().err
    assert f"error: --work {stray} exists and is not empty" in err and "--out" not in err


@pytest.mark.slow
def test_a_run_killed_in_distill_continues_from_its_checkpoint(target, text_data, tmp_path):
    """A real kill (SIGKILL, in a child process, right after distill wrote its step-2 checkpoint): the rerun keeps
    convert's output and continues distillation from that checkpoint."""
    source, work = target("mimo", num_hidden_layers=4), tmp_path / "w"
    args = _args(source, text_data, work)
    killer = (
        "import os, signal, sys\n"
        "import mtp2draft.train.parallel as parallel\n"
        "real = parallel.save\n"
        "def save(*a, **k):\n"
        "    out = real(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "parallel.save = save\n"
        "from mtp2draft.cli.app import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = subprocess.run([sys.executable, "-c", killer, *args], capture_output=True, text=True, env=env)
    assert killed.returncode == -9, killed.stderr
    assert list(json.loads((work / RECORD).read_text())["finished"]) == ["convert"]
    rerun = subprocess.run([sys.executable, "-m", "mtp2draft", *args], capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert "[1/5] convert" in rerun.stderr and "finished in an earlier run, kept" in rerun.stderr
    assert "continuing distillation from its last checkpoint" in rerun.stderr, rerun.stderr
    provenance = json.loads((work / "distilled" / "provenance.json").read_text())
    assert provenance["distill"].get("resumed_from_step") == 2, provenance["distill"]


@pytest.mark.hub
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--push", "someone-else/draft"], "may create repos under tester, not someone-else"),
        (["--push", "tester/draft", "--token", "hf_not_a_token"], "the Hub rejects the token"),
        (["--device-map", "auto"], "--device-map auto needs accelerate: pip install 'mtp2draft[device-map]'"),
    ],
)
def test_run_checks_hub_access_and_extras_before_stage_1(
    target, text_data, hub, tmp_path, monkeypatch, capsys, extra, needle
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    calls: list[str] = []
    _count_calls(monkeypatch, calls)
    work = tmp_path / "w"
    assert main(_args(target("mimo", num_hidden_layers=4), text_data, work, *extra)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert calls == [] and not work.exists()


@pytest.mark.hub
@pytest.mark.slow
def test_a_failed_push_prints_the_table_and_the_rerun_only_pushes(
    target, text_data, hub, tmp_path, monkeypatch, capsys
):
    import mtp2draft.hub.upload as hub_module
    from mtp2draft.errors import HubError

    work = tmp_path / "w"
    args = _args(target("mimo", num_hidden_layers=4), text_data, work, "--push", "tester/tiny-mimo-mtp")

    def refused(*_a, **_k):
        raise HubError("the Hub answered 500")

    with monkeypatch.context() as patch:
        patch.setattr(hub_module, "push", refused)
        assert main(args) == 2
    out, err = capsys.readouterr()
    assert "raw MTP head (baseline)" in out and f"export: {work / 'export-stitched'}" in out  # stdout not empty
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "the Hub answered 500" in error[0], err
    assert (
        f"is complete: publish it with `mtp2draft push {work / 'export-stitched'} --repo-id tester/tiny-mimo-mtp`"
        in error[0]
    )
    calls: list[str] = []
    _count_calls(monkeypatch, calls)
    assert main(args) == 0, capsys.readouterr().err
    assert calls == [] and "pushed: " in capsys.readouterr().out
    assert "README.md" in hub.files("tester/tiny-mimo-mtp")


def test_run_without_data_says_what_it_needs(target, tmp_path, capsys) -> None:
    argv = ["run", str(target("mimo", num_hidden_layers=4)), "--work", str(tmp_path / "w")]
    assert main(argv) == 2
    assert 'error: run needs --data: a JSONL file to distill on, one {"text": ...}' in capsys.readouterr().err


def test_demo_is_not_offered_where_the_bundled_target_is_missing(monkeypatch, tmp_path) -> None:
    """An installed wheel ships no examples/: its `--help` does not list `demo` (a checkout's does)."""
    import importlib

    import mtp2draft.bundled as bundled
    import mtp2draft.cli.pipeline as cli_pipeline
    from mtp2draft.cli import root

    def commands() -> list[str]:
        return [c.name or c.callback.__name__ for c in root.app.registered_commands if not c.hidden]

    assert "demo" in commands()
    monkeypatch.setattr(bundled, "BUNDLED_TARGET", tmp_path / "none")
    root.app.registered_commands = [c for c in root.app.registered_commands if c.callback.__name__ != "demo"]
    importlib.reload(cli_pipeline)  # registers the commands again, as a fresh process of the wheel would
    try:
        assert "demo" not in commands()
    finally:
        monkeypatch.undo()
        root.app.registered_commands = [
            c for c in root.app.registered_commands if c.callback.__module__ != cli_pipeline.__name__
        ]
        importlib.reload(cli_pipeline)
