"""The distill recipe: it trains, checkpoints, resumes to the same weights, never writes to the target, chooses the
EAGLE-3 draft vocabulary, calibrates once, and learns from online or offline hidden states. (The TTT math is
tests/test_ttt.py; the target's features are tests/test_hidden.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from distill_requests import online
from matplotlib.image import imread
from safetensors.torch import load_file

from mtp2draft.conversion import convert
from mtp2draft.data import encode, load_tokenizer, read_examples
from mtp2draft.draft.disk import load_draft
from mtp2draft.errors import DataError, DraftError, OptionError
from mtp2draft.formats import charts
from mtp2draft.target.hidden import TargetModel
from mtp2draft.train.calibrate import choose_draft_vocab
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData

SMALL = {"steps": 4, "batch_size": 4, "max_length": 48, "save_every": 2, "log_every": 2}


def _final_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_distill_trains_without_writing_the_target(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw")
    before = TargetModel(str(tgt)).fingerprint()
    cfg = DistillConfig(**{**SMALL, "steps": 12, "lr": 3e-3, "log_every": 1})
    result = distill(online(tmp_path, tgt, "ft", text_data, config=cfg))
    assert TargetModel(str(tgt)).fingerprint() == before  # and distill itself re-checks before writing
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    prov = json.loads((tmp_path / "ft" / "provenance.json").read_text())
    assert prov["distill"]["steps"] == 12 and prov["distill"]["settings"]["ttt_steps"] == 3
    assert len(prov["distill"]["final_accuracy_per_step"]) == 3
    raw, ft = _final_weights(tmp_path / "raw"), _final_weights(tmp_path / "ft")
    assert raw.keys() == ft.keys() and not torch.equal(raw["eh_proj.weight"], ft["eh_proj.weight"])
    assert not (tmp_path / "ft.checkpoints").exists()
    (loss_line, *_), accuracy = (ax.get_lines() for ax in charts.training_figure(prov["distill"]["history"]).axes)
    assert [float(y) for y in loss_line.get_ydata()] == [h["loss"] for h in result.history]  # what training.png draws
    assert len(accuracy) == 3 and imread(tmp_path / "ft" / charts.TRAINING_CHART).shape[:2] == (400, 1000)


def test_eagle3_draft_vocabulary(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "e3", to="eagle3", dtype="float32")
    cfg = DistillConfig(**{**SMALL, "steps": 1, "draft_vocab_size": 32})
    distill(online(tmp_path, tgt, "ft", text_data, draft="e3", config=cfg))
    w = _final_weights(tmp_path / "ft")
    tok = load_tokenizer(tgt)
    examples, _ = read_examples(text_data, tok, 48)
    used = choose_draft_vocab(examples, 256, 32)
    assert torch.equal(torch.arange(32) + w["d2t"], used) and used.tolist() == sorted(used.tolist())
    assert w["t2d"].sum() == 32 and w["t2d"][used].all()
    counts = torch.bincount(
        torch.tensor([i for e in examples for i, m in zip(e.input_ids, e.loss_mask, strict=False) if m]), minlength=256
    )
    assert counts[used].min() >= counts[~w["t2d"]].max()  # the most frequent tokens
    cfg_json = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert cfg_json["draft_vocab_size"] == 32 and w["lm_head.weight"].shape == (32, 64)


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mtp2draft.cli.app", "distill", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


@pytest.mark.slow
def test_resume_after_a_kill_reaches_the_same_weights(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw", to="eagle3")
    common = [
        str(tmp_path / "raw"),
        "--target",
        str(tgt),
        "--data",
        str(text_data),
        "--steps",
        "40",  # far more than the kill point: on idle cores 4 tiny steps can finish between two polls
        "--batch-size",
        "4",
        "--max-length",
        "48",
        "--save-every",
        "2",
        "--draft-vocab-size",
        "48",
    ]
    assert (
        subprocess.run(
            [sys.executable, "-m", "mtp2draft.cli.app", "distill", *common, "--out", str(tmp_path / "a")],
            capture_output=True,
        ).returncode
        == 0
    )
    proc = _spawn([*common, "--out", str(tmp_path / "b")])
    ckpts = tmp_path / "b.checkpoints"
    deadline = time.time() + 120
    while not list(ckpts.glob("step-0000004")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "b").exists(), "the run should have been killed before finishing"
    done = subprocess.run(
        [sys.executable, "-m", "mtp2draft.cli.app", "distill", *common, "--out", str(tmp_path / "b"), "--resume"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "resuming from step-" in done.stderr
    a, b = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_refuses_other_settings(target, text_data, tmp_path: Path) -> None:
    tgt = target("mimo")
    convert(str(tgt), tmp_path / "raw")
    distill(online(tmp_path, tgt, "o", text_data, config=DistillConfig(**SMALL), stop_after=2))
    assert (tmp_path / "o.checkpoints").is_dir() and not (tmp_path / "o").exists()
    with pytest.raises(DraftError, match="pass --resume to continue it"):  # a fresh run must not mix them up
        distill(online(tmp_path, tgt, "o", text_data, config=DistillConfig(**SMALL)))
    with pytest.raises(DraftError, match="other settings"):
        distill(online(tmp_path, tgt, "o", text_data, config=DistillConfig(**{**SMALL, "lr": 1.0}), resume=True))


def test_teacher_temperature_changes_the_settings_hash_only_off_its_default() -> None:
    """A checkpoint written before --teacher-temperature existed (its settings lack the field) still resumes at the
    default; another temperature is other settings."""
    from dataclasses import asdict

    from mtp2draft.train.state import settings_hash

    now = asdict(DistillConfig(**SMALL))
    before = {k: v for k, v in now.items() if k != "teacher_temperature"}
    assert now["teacher_temperature"] == 1.0 and settings_hash(now) == settings_hash(before)
    assert settings_hash({**now, "teacher_temperature": 0.5}) != settings_hash(before)


@pytest.mark.slow
def test_offline_hidden_states_train_like_the_online_target(target, text_data, tmp_path: Path, monkeypatch) -> None:
    """With every log-prob kept (top-k = vocabulary), training from dumped files matches training online."""
    from mtp2draft.data import read_examples
    from mtp2draft.settings import DumpConfig
    from mtp2draft.target import hidden
    from mtp2draft.target.dumps import dump_hidden_states

    tgt = target("deepseek_v3", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw", to="eagle3", dtype="float32")
    draft = load_draft(tmp_path / "raw")
    tm = TargetModel(str(tgt))
    examples, _ = read_examples(text_data, load_tokenizer(tgt), 48)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    dump_hidden_states(
        tm, seqs, tmp_path / "dump", DumpConfig(aux_layers=draft.aux_layer_ids, top_k=256, shard_size=10)
    )
    manifest = json.loads((tmp_path / "dump" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 3 and manifest["num_sequences"] == len(seqs)
    cfg = DistillConfig(**{**SMALL, "batch_size": 1})  # batch 1: no padding differences between the two paths
    distill(online(tmp_path, tgt, "online", text_data, config=cfg))

    def no_target(*_a, **_k):
        raise AssertionError("offline distillation must not load the target")

    from mtp2draft.train import teacher

    monkeypatch.setattr(hidden, "TargetModel", no_target)
    monkeypatch.setattr(teacher, "TargetModel", no_target)
    distill(
        DistillJob(
            draft_dir=tmp_path / "raw",
            out=tmp_path / "offline",
            data=TrainingData(hidden_states=tmp_path / "dump"),
            config=cfg,
        )
    )
    a, b = _final_weights(tmp_path / "online"), _final_weights(tmp_path / "offline")
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=2e-2, rtol=0), key


def test_chat_records_train_on_assistant_tokens_only(target) -> None:
    tok = load_tokenizer(target("mimo"))
    ex = encode(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "fine"},
            ]
        },
        tok,
        500,
    )
    spans = "".join("1" if m else "0" for m in ex.loss_mask)
    assert spans.count("01") == 2  # two assistant turns
    kept = [i for i, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m]
    ok, fine = tok("ok", add_special_tokens=False)["input_ids"], tok("fine", add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert kept[: len(ok) + 1] == ok + [end] and fine + [end] == kept[-len(fine) - 2 : -1]


def test_malformed_lines_name_file_and_line(target, tmp_path: Path) -> None:
    tok = load_tokenizer(target("mimo"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "def f(x): return x"}\n{"text": 3}\nnot json\n{"messages": []}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: 'text' must be a non-empty string"):
        read_examples(bad, tok, 512)
    examples, skipped = read_examples(bad, tok, 512, skip_bad=True)
    assert len(examples) == 1 and skipped == 3


def test_eagle3_from_mtp_is_calibrated_once_on_real_activations(target, text_data, tmp_path: Path) -> None:
    tgt = target("deepseek_v3", num_hidden_layers=6)
    convert(str(tgt), tmp_path / "e3", to="eagle3", dtype="float32")
    assert json.loads((tmp_path / "e3" / "config.json").read_text())["mtp2draft_init"]["fc_scale_calibrated"] is False
    result = distill(online(tmp_path, tgt, "c", text_data, draft="e3", config=DistillConfig(**{**SMALL, "steps": 0})))
    init = json.loads((tmp_path / "c" / "config.json").read_text())["mtp2draft_init"]
    fit = init["attention_scale_fit"]
    assert init["fc_scale_calibrated"] is True and 0 < init["fc_fit_r2"] <= 1
    assert fit["attention_rel_error_after"] < fit["attention_rel_error_before"]
    assert result.steps == 0
    prov = json.loads((tmp_path / "c" / "provenance.json").read_text())
    assert prov["distill"]["calibration"]["attention_rel_error_after"] == fit["attention_rel_error_after"]
    # a calibrated draft is not calibrated again, so 0 steps would only copy it: refused, nothing written
    with pytest.raises(OptionError, match="untrained draft"):
        distill(online(tmp_path, tgt, "c2", text_data, draft="c", config=DistillConfig(**{**SMALL, "steps": 0})))
    assert not (tmp_path / "c2").exists()


def test_regenerate_writes_the_targets_own_greedy_continuations(target, text_data) -> None:
    from mtp2draft.data import Regeneration, regenerate
    from mtp2draft.evaluation.decode import TargetRunner, greedy_reference

    tgt = target("mimo", num_hidden_layers=4)
    tm, tok = TargetModel(str(tgt)), load_tokenizer(tgt)
    examples, _ = read_examples(text_data, tok, 40)
    out = regenerate(examples[:6], tm, tok, Regeneration(12), prompts_per_batch=4)  # left-padded batches
    runner = TargetRunner(tm)
    for ex, new in zip(examples[:6], out, strict=True):
        prompt = ex.input_ids[: len(ex.input_ids) // 2]
        assert new.input_ids[: len(prompt)] == prompt and new.loss_mask == [False] * len(prompt) + [True] * (
            len(new.input_ids) - len(prompt)
        )
        want = greedy_reference(runner, prompt, len(new.input_ids) - len(prompt), tok.eos_token_id)
        assert new.input_ids[len(prompt) :] == want


def test_regenerate_samples_reproducibly_from_the_seed(target, text_data) -> None:
    # `distill --regenerate --sample` failed outright: transformers' generate() takes no `generator`
    from mtp2draft.data import Regeneration, regenerate

    tgt = target("mimo", num_hidden_layers=4)
    tm, tok = TargetModel(str(tgt)), load_tokenizer(tgt)
    examples, _ = read_examples(text_data, tok, 40)
    greedy = regenerate(examples[:6], tm, tok, Regeneration(12), prompts_per_batch=4)
    state = torch.random.get_rng_state()
    first = regenerate(
        examples[:6], tm, tok, Regeneration(12, sample=True, temperature=1.5, seed=1), prompts_per_batch=4
    )
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is left as it was
    again = regenerate(
        examples[:6], tm, tok, Regeneration(12, sample=True, temperature=1.5, seed=1), prompts_per_batch=4
    )
    other = regenerate(
        examples[:6], tm, tok, Regeneration(12, sample=True, temperature=1.5, seed=2), prompts_per_batch=4
    )
    ids = [[e.input_ids for e in out] for out in (greedy, first, again, other)]
    assert ids[1] == ids[2] and ids[1] != ids[3] and ids[1] != ids[0]
    for ex, new in zip(examples[:6], first, strict=True):
        prompt = ex.input_ids[: len(ex.input_ids) // 2]  # the prompt kept, the sampled continuation is the loss span
        assert new.input_ids[: len(prompt)] == prompt and new.loss_mask == [False] * len(prompt) + [True] * (
            len(new.input_ids) - len(prompt)
        )


def test_distill_takes_one_request_whole() -> None:
    """`distill(job)`: the request is one `DistillJob`, whose parts are the records the CLI builds (no field of it is
    a setting that one of its records already declares); a field it lacks is a TypeError."""
    import dataclasses
    import inspect

    from mtp2draft.settings import HubAccess, Placement
    from mtp2draft.train.settings import DSparkObjective, NewDSpark

    assert list(inspect.signature(distill).parameters) == ["job"]
    records = (DistillConfig, TrainingData, Placement, HubAccess, DSparkObjective, NewDSpark)
    parts = {f.name: f.type for f in dataclasses.fields(DistillJob)}
    assert {getattr(t, "__name__", t) for t in parts.values()} >= {r.__name__ for r in records}
    declared = {f.name for r in records for f in dataclasses.fields(r)}
    assert not (set(parts) - {"data"}) & declared, "a record's setting repeated in DistillJob"
    with pytest.raises(TypeError, match="stepz"):
        DistillJob(draft_dir="nowhere", out="out", stepz=3)  # type: ignore[call-arg]
    job = DistillJob(draft_dir="d", out="o")
    assert (job.draft_dir, job.out, job.checkpoints) == (Path("d"), Path("o"), Path("o.checkpoints"))
    with pytest.raises(OptionError, match="stop_after"):
        DistillJob(draft_dir="d", out="o", stop_after=0)
