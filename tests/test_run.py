"""The one-shot pipeline against a hub-hosted target: convert -> distill -> evaluate -> export -> push."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtp2draft.cli.app import main
from mtp2draft.formats.export import validate
from mtp2draft.settings import ConvertConfig, HubAccess, RunConfig
from mtp2draft.train.settings import TrainingData


@pytest.mark.hub
@pytest.mark.slow
def test_run_from_the_hub_to_a_pushed_draft(target, text_data, hub, tmp_path: Path, capsys) -> None:
    path = target("mimo", num_hidden_layers=6)  # deep enough for three distinct EAGLE-3 aux layers
    # MiMo: no engine runs EAGLE-3 (run's default is a native draft); --to/--format exercise the EAGLE-3 chain
    hub.add_repo("org/tiny-mimo", path)
    code = main(
        [
            "run",
            "org/tiny-mimo",
            "--data",
            str(text_data),
            "--work",
            str(tmp_path / "w"),
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--max-length",
            "48",
            "--draft-vocab-size",
            "64",
            "-k",
            "2",
            "--max-new-tokens",
            "6",
            "--max-prompts",
            "2",
            "--push",
            "tester/tiny-mimo-eagle3",
            "--to",
            "eagle3",
            "--format",
            "sglang",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "raw MTP head (baseline)" in out and "pushed: " in out
    work = tmp_path / "w"
    assert sorted(p.name for p in work.iterdir()) == [
        ".mtp2draft",
        ".mtp2draft-run.json",
        "distilled",
        "export-sglang",
        "raw-eagle3",
        "raw-mtp",
    ]
    assert validate(work / "export-sglang") == []
    report = json.loads((work / "distilled" / "evaluation.json").read_text())
    assert [r["lossless"] for r in report["results"]] == [True, True]
    files = hub.files("tester/tiny-mimo-eagle3")
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    assert b"base_model: org/tiny-mimo" in files["README.md"]
    prov = json.loads((work / "distilled" / "provenance.json").read_text())
    assert prov["source"] == "org/tiny-mimo" and len(prov["commit"]) == 40
    assert prov["distill"]["target_commit"] == prov["commit"]


@pytest.mark.slow  # ~25 s: two runs of the whole pipeline
def test_run_trains_for_the_engine_named(target, text_data, tmp_path: Path, capsys) -> None:
    work = tmp_path / "w"
    args = [
        "run",
        str(target("mimo", num_hidden_layers=4)),
        "--data",
        str(text_data),
        "--work",
        str(work),
        "--to",
        "mtp",
        "--serving-engine",
    ]
    tail = ["--steps", "2", "--batch-size", "2", "--max-length", "32", "--max-prompts", "2", "--max-new-tokens", "8"]
    assert main([*args, "vllm", *tail]) == 0, capsys.readouterr().err
    config = json.loads((work / "distilled" / "config.json").read_text())
    assert config["engine"]["name"] == "vllm"
    # an engine that cannot serve the kind for the family is one line, before any training
    capsys.readouterr()
    assert main([*args[:-3], "--to", "eagle3", "--serving-engine", "vllm", *tail, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "cannot serve" in err and "Traceback" not in err


def test_run_keeps_the_weights_that_score_best_on_heldout(target, text_data, tmp_path: Path, capsys) -> None:
    """`run --heldout` hands distill its held-out guard: the distilled draft records the guard's evaluations."""
    heldout = tmp_path / "pick.jsonl"
    heldout.write_text("".join(text_data.read_text().splitlines(keepends=True)[:4]))
    work = tmp_path / "w"
    args = ["run", str(target("mimo", num_hidden_layers=4)), "--data", str(text_data), "--work", str(work)]
    args += ["--heldout", str(heldout), "--eval-every", "1", "--patience", "1", "--heldout-examples", "2"]
    args += ["--eval-data", str(heldout)]  # allowed, with a note: the weights are picked on the reporting prompts
    args += ["--steps", "2", "--batch-size", "2", "--max-length", "32", "--max-prompts", "2", "--max-new-tokens", "8"]
    assert main(args) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert f"held-out guard: 2 examples of {heldout}" in err
    assert "note: --heldout is also the evaluation data" in err
    record = json.loads((work / "distilled" / "provenance.json").read_text())["distill"]["heldout"]
    assert record is not None and record["patience"] == 1
    assert [e["step"] for e in record["history"]][0] == 0  # scored before the first step, as distill does
    assert heldout.read_text() == "".join(text_data.read_text().splitlines(keepends=True)[:4])  # an input: untouched


def test_run_never_hands_the_source_revision_to_another_target(monkeypatch, tmp_path: Path) -> None:
    """`run SOURCE --revision R --target T`: R pins SOURCE only; the stages that read T get T's own revision
    (`--target-revision`, default None). Before the fix, distill, evaluate and export all received R."""
    from mtp2draft import pipeline

    seen: dict[str, dict] = {}

    def record(stage: str, result=None):
        def fake(*args, **kwargs):
            hub = kwargs.get("hub") or getattr(args[0], "hub", None)  # Hub access whole (distill: in its request)
            seen[stage] = {k: getattr(hub, k) if hub else kwargs.get(k) for k in ("revision", "token")}
            return result

        return fake

    monkeypatch.setattr(pipeline, "convert", record("convert"))
    monkeypatch.setattr(pipeline, "distill", record("distill"))
    monkeypatch.setattr(pipeline, "evaluate", record("evaluate", {"results": []}))
    monkeypatch.setattr(pipeline, "save_evaluation", lambda *a, **k: None)
    monkeypatch.setattr(pipeline, "export", record("export"))
    spec = SimpleNamespace(name="toy")  # run's checks before any fetch read configs of repos this test has not got
    chosen = lambda source, config, stages, hub: (spec, replace(stages, format="nextn"))  # noqa: E731
    monkeypatch.setattr(pipeline, "preflight", chosen)
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    convert = ConvertConfig(to="mtp")

    def run(work: str, revision: str | None = None, **config) -> None:
        job = RunConfig(work=tmp_path / work, training=TrainingData(data=data), **config)
        hub = HubAccess(revision=revision, token="hf_secret")
        pipeline.run("org/source", config=job, stages=pipeline.Stages(convert=convert), hub=hub)

    run("w1", target="org/target", revision="abc123")
    assert seen["convert"] == {"revision": "abc123", "token": "hf_secret"}
    for stage in ("distill", "evaluate", "export"):
        assert seen[stage] == {"revision": None, "token": "hf_secret"}, stage
    run("w2", target="org/target", target_revision="def456")
    assert {seen[s]["revision"] for s in ("distill", "evaluate", "export")} == {"def456"}
    run("w3", revision="abc123")  # no --target: SOURCE's own
    assert {seen[s]["revision"] for s in ("convert", "distill", "evaluate", "export")} == {"abc123"}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--to", "mtp", "--format", "sglang"], "--format sglang takes an EAGLE-3 draft"),
        (["--to", "eagle3", "--format", "stitched"], "--format stitched takes a native MTP draft"),
        (["--to", "eagle3", "--serving-engine", "vllm"], "cannot serve"),
        (["--push", "no such/repo id"], "is not a Hub repo id"),
        (["-k", "0"], "--num-draft-tokens must be at least 1"),
        (["--patience", "2"], "--patience stops on held-out acceptance: it needs --heldout"),
        (["--heldout", "no-such-heldout.jsonl"], "--heldout no-such-heldout.jsonl does not exist"),
    ],
)
def test_run_refuses_before_any_work(target, text_data, tmp_path: Path, monkeypatch, capsys, extra, needle) -> None:
    """A clash `run` can see from the options and configs is refused before a tensor byte is read or a stage
    starts, and leaves nothing on disk (it used to surface only after convert and distill had run)."""
    import importlib

    import mtp2draft.checkpoint.tensors as checkpoint

    run = importlib.import_module("mtp2draft.pipeline")  # the module (the package exports a function of that name)

    def no_work(*_a, **_k):
        raise AssertionError("work started before the refusal")

    for stage in ("convert", "distill", "evaluate", "export"):
        monkeypatch.setattr(run, stage, no_work)
    monkeypatch.setattr(checkpoint.Checkpoint, "read_raw", no_work)
    source = target("mimo", num_hidden_layers=4)
    argv = ["run", str(source), "--data", str(text_data), "--work", str(tmp_path / "w"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_run_skip_bad_reaches_the_training_data(target, text_data, tmp_path: Path, monkeypatch, capsys) -> None:
    """`run --skip-bad` skips (and counts) malformed lines of --data, as distill --skip-bad does: the pre-checks
    let them through and distill is handed the flag. Held-out lines are never skipped."""
    from mtp2draft import pipeline
    from mtp2draft.errors import Mtp2DraftError

    data = tmp_path / "d.jsonl"
    data.write_text(text_data.read_text() + "{not json\n")
    seen = {}

    def stop(job):
        seen["job"] = job
        raise Mtp2DraftError("stopped after the checks")

    monkeypatch.setattr(pipeline, "distill", stop)
    argv = ["run", str(target("mimo")), "--data", str(data), "--work", str(tmp_path / "w"), "--steps", "2"]
    assert main(argv) == 2 and "pass --skip-bad" in capsys.readouterr().err and not seen
    assert main([*argv, "--skip-bad"]) == 2 and "stopped after the checks" in capsys.readouterr().err
    assert seen["job"].skip_bad is True
