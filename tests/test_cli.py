"""The command line's own contract (cli/): data on stdout and logs on stderr, one formatter that turns
every known failure into one line with its exit status, option lists parsed into numbers, training options reaching
DistillConfig by name, and the texts the commands print. The stages themselves are tested in their own files."""

from __future__ import annotations

import errno
import json
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file, save_file

from mtp2draft.cli import output, root
from mtp2draft.cli.app import main
from mtp2draft.cli.output import acceptance_table, validate_text
from mtp2draft.conversion import convert
from mtp2draft.errors import DraftError, SourceError
from mtp2draft.family.spec import registry
from mtp2draft.train.settings import DistillConfig

SECRET = "hf_" + "Zq9w" * 9


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---- streams: data on stdout, progress on stderr -----------------------------------------------------------------
def test_convert_prints_data_on_stdout_and_progress_on_stderr(build, tmp_path: Path, capsys) -> None:
    src = str(build("deepseek_v3"))
    code, out, err = run_cli(capsys, "convert", src, "--out", str(tmp_path / "j"), "--json")
    summary = json.loads(out)  # stdout is exactly one JSON document
    assert code == 0 and summary["draft_kind"] == "mtp" and summary["out"] == str(tmp_path / "j")
    assert summary["bytes_fetched"] <= summary["checkpoint_bytes"] and err.strip()
    code, out, err = run_cli(capsys, "convert", src, "--out", str(tmp_path / "t"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith(f"wrote mtp draft to {tmp_path / 't'} (")
    assert "tensors transferred exactly" in lines[1] and "wrote mtp draft" not in err


def test_specs_json_lists_the_registry(capsys) -> None:
    code, out, err = run_cli(capsys, "specs", "--json")
    assert code == 0 and err == ""
    assert [row["name"] for row in json.loads(out)] == list(registry())
    code, out, _ = run_cli(capsys, "specs")
    names = [line.split()[0] for line in out.split("\n\n")[0].splitlines()]
    assert code == 0 and names == list(registry()) and "engine support" in out


def test_cli_export_and_validate(build, tmp_path: Path, capsys) -> None:
    """export --json, validate's text / JSON / exit status on a good, a broken and a missing directory."""
    eagle3 = tmp_path / "e3"
    convert(str(build("mimo", num_hidden_layers=6)), eagle3, to="eagle3", dtype="float32")
    code, out, err = run_cli(capsys, "export", str(eagle3), "--format", "speculators", "--out", str(tmp_path / "s"))
    assert code == 0 and out.startswith(f"wrote speculators export of {eagle3} to {tmp_path / 's'} (") and err
    code, out, err = run_cli(
        capsys, "export", str(eagle3), "--format", "sglang", "--out", str(tmp_path / "g"), "--json"
    )
    assert code == 0 and json.loads(out)["format"] == "sglang" and "validating" in err
    code, out, _ = run_cli(capsys, "validate", str(tmp_path / "s"))
    assert code == 0 and out == f"{tmp_path / 's'}: valid speculators draft\n"
    weights = tmp_path / "g" / "model.safetensors"
    save_file({k: v for k, v in load_file(str(weights)).items() if k != "fc.weight"}, str(weights), {"format": "pt"})
    code, out, err = run_cli(capsys, "validate", str(tmp_path / "g"))
    assert code == 2 and "fc.weight" in out and err.count("error:") == 1 and "violation(s)" in err
    code, out, _ = run_cli(capsys, "validate", str(tmp_path / "g"), "--json")
    report = json.loads(out)
    assert code == 2 and report["format"] == "sglang" and report["ok"] is False
    assert any("fc.weight" in v for v in report["violations"])
    code, out, err = run_cli(capsys, "validate", str(tmp_path / "nowhere"))
    assert code == 2 and out == "" and err == f"error: {tmp_path / 'nowhere'} is not a directory\n"


# ---- the one error formatter -------------------------------------------------------------------------------------
def test_a_known_error_is_one_redacted_line_and_its_exit_status(monkeypatch, capsys) -> None:
    def fails(*_a, **_k):
        raise SourceError(f"cannot read org/x with token {SECRET}")

    monkeypatch.setattr(sys.modules["mtp2draft.conversion"], "inspect_checkpoint", fails)
    code, out, err = run_cli(capsys, "inspect", "org/x", "--token", SECRET)
    assert (code, out) == (SourceError.exit_code, "")
    assert err == "error: cannot read org/x with token ***\n"


def test_debug_shows_the_traceback(monkeypatch, capsys) -> None:
    def fails(*_a, **_k):
        raise DraftError("broken")

    monkeypatch.setattr(sys.modules["mtp2draft.conversion"], "inspect_checkpoint", fails)
    monkeypatch.setenv("MTP2DRAFT_DEBUG", "1")
    with pytest.raises(DraftError, match="broken"):
        main(["inspect", "org/x"])


def test_an_os_error_is_one_line_with_the_path_and_status_1(monkeypatch, capsys) -> None:
    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out")

    monkeypatch.setattr("mtp2draft.family.spec.registry", full)
    assert run_cli(capsys, "specs") == (1, "", "error: No space left on device: /data/out\n")


def test_interrupt_is_status_130_without_a_traceback(monkeypatch, capsys) -> None:
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("mtp2draft.family.spec.registry", interrupted)
    code, out, err = run_cli(capsys, "specs")
    assert (code, out) == (130, "") and "Traceback" not in err


def test_usage_errors_are_click_usage_messages(capsys) -> None:
    code, out, err = run_cli(capsys, "no-such-command")
    assert code == 2 and out == "" and "Usage:" in err and "No such command" in err
    code, _, err = run_cli(capsys, "distill", "d", "--out", "o", "--step-weights", "1,a")
    assert code == 2 and "--step-weights" in err and "expected numbers separated by commas, got '1,a'" in err
    code, _, err = run_cli(capsys, "convert", "src", "--out", "o", "--aux-layers", "1,2.5,3")
    assert code == 2 and "expected whole numbers separated by commas" in err
    assert run_cli(capsys, "--help")[0] == 0


# ---- parsing -----------------------------------------------------------------------------------------------------
def test_number_lists() -> None:
    assert root.number_list("1,0.8,0.64", "--step-weights") == [1.0, 0.8, 0.64]
    assert root.number_list("3,5,7", "--aux-layers", int) == [3, 5, 7]
    assert root.number_list(None, "--aux-layers", int) is None and root.number_list("", "--x") is None


def test_training_options_reach_the_config_by_name() -> None:
    """The CLI's parsed options become the DistillConfig by field name, `--step-weights` parsed to numbers; options
    that are not training settings (device) are left out."""
    options = {
        "steps": 7,
        "ttt_steps": 2,
        "seed": 3,
        "step_weights": "1,0.5",
        "compile_": True,
        "device": "cpu",
        "lr": 0.5,
    }
    assert root.distill_config(SimpleNamespace(params=options)) == DistillConfig(
        steps=7, ttt_steps=2, seed=3, lr=0.5, step_weights=[1.0, 0.5], compile=True
    )


# ---- texts -------------------------------------------------------------------------------------------------------
def _row(name: str, mal: float, acc: list[float], lossless: bool = True) -> dict:
    return {
        "name": name,
        "num_draft_tokens": len(acc),
        "mean_acceptance_length": mal,
        "acceptance_per_position": acc,
        "lossless": lossless,
    }


def test_acceptance_table_aligns_drafts_of_different_k() -> None:
    table = acceptance_table([_row("draft", 2.5, [0.9, 0.5, 0.25]), _row("raw head", 1.25, [0.5], False)])
    assert table.splitlines() == [
        "draft     accept len  pos 1  pos 2  pos 3  lossless",
        "draft     2.500       0.900  0.500  0.250  yes     ",
        "raw head  1.250       0.500                NO      ",
    ]


def test_acceptance_table_shows_both_metrics_and_the_distribution_check() -> None:
    sampled = {**_row("draft", 2.0, [0.8, 0.5]), "per_draft_acceptance": [0.8, 0.4], "lossless": None}
    sampled["distribution_check"] = {"pit_ks_statistic": 0.01, "pit_ks_p_value": 0.4321, "tokens": 900}
    lines = acceptance_table([sampled]).splitlines()
    assert lines[1].split() == ["draft", "2.000", "0.800", "/", "0.800", "0.500", "/", "0.400", "KS", "p", "=", "0.432"]
    assert lines[-1] == "pos j: P(j accepted | 1..j-1 accepted) / P(j accepted) per draft"


def test_acceptance_table_says_a_greedy_difference_was_at_logit_ties() -> None:
    # bf16: the prompts that parted from the target's output only where its top two logits tie (evaluate raises on
    # any other difference), which the table must not call a loss; a difference with no tie counted still reads NO
    lines = acceptance_table([{**_row("draft", 2.0, [0.5]), "lossless": False, "ties": 6}]).splitlines()
    assert lines[1].split()[-3:] == ["yes,", "6", "tie(s)"] and lines[-1].startswith("tie(s): prompts whose output")
    no = acceptance_table([{**_row("raw", 2.0, [0.5], False), "ties": 0}]).splitlines()
    assert no[-1].split()[-1] == "NO" and not any(line.startswith("tie(s):") for line in no)
    # a lossless result with a stale tie count, and a sampled one, part at no tie: no legend either
    stale = [{**_row("a", 2.0, [0.5]), "ties": 3}, {**_row("b", 2.0, [0.5]), "lossless": None, "ties": 2}]
    assert not any(line.startswith("tie(s):") for line in acceptance_table(stale).splitlines())


def test_validate_text_lists_every_violation() -> None:
    assert validate_text(Path("d"), "sglang", []) == "d: valid sglang draft"
    assert validate_text(Path("d"), "nextn", ["a", "b"]) == "d: 2 violation(s) of the nextn format\n  - a\n  - b"


def test_run_text_names_the_push_only_when_there_was_one() -> None:
    report = {"results": [_row("distilled mtp", 2.0, [0.5, 0.5])]}
    result = SimpleNamespace(report=report, exported=Path("w/export-nextn"), push=None)
    assert output.run_text(result).splitlines()[-1] == "export: w/export-nextn"
    result.push = SimpleNamespace(url="https://hub/me/d", commit="abc")
    assert output.run_text(result).splitlines()[-1] == "pushed: https://hub/me/d (commit abc)"


def test_run_and_demo_print_the_gain_over_the_raw_head() -> None:
    diff = {"value": 0.4, "low": 0.3, "high": 0.5}
    gain = {"draft": "distilled mtp", "baseline": "raw MTP head (baseline)", "prompts": 16, "level": 0.95}
    gain["difference"] = {"mean_acceptance_length": diff, "per_draft_acceptance_1": diff}
    report = {"results": [_row("distilled mtp", 2.0, [0.5, 0.5])], "comparison": [gain]}
    report |= {"target": "t", "num_prompts": 16, "num_draft_tokens": 2}
    result = SimpleNamespace(report=report, exported=Path("w/x"), push=None, stages={"convert": 1.0}, work=Path("w"))
    for text in (output.run_text(result), output.demo_text(result)):
        assert "distilled mtp - raw MTP head (baseline): accept len +0.400 [+0.300, +0.500]" in text


def _option_names(command_name: str) -> set[str]:
    """The Python names of a command's options (typer's click command), a trailing `_` dropped as `from_options`
    does (`compile_` is `--compile`)."""
    import typer.main

    from mtp2draft.cli.app import app

    group = typer.main.get_command(app)
    command = group.commands[command_name]
    return {p.name.rstrip("_") for p in command.params if p.param_type_name == "option"}


def test_distill_settings_are_declared_once_and_offered_by_the_cli() -> None:
    """Every DistillConfig field is a `distill` option of the same name, or listed as library-only with its reason;
    `run` offers only options that are fields or its own (no training option spelt differently)."""

    from mtp2draft.train.settings import DistillConfig

    names = {f.name for f in fields(DistillConfig)}
    offered = _option_names("distill")
    assert names - offered == set(DistillConfig.LIBRARY_ONLY)
    assert all(reason.strip() for reason in DistillConfig.LIBRARY_ONLY.values())
    assert not set(DistillConfig.LIBRARY_ONLY) & offered  # nothing listed as library-only is offered after all
    run_training = _option_names("run") & names
    assert {
        "steps",
        "ttt_steps",
        "lr",
        "batch_size",
        "max_length",
        "draft_vocab_size",
        "serving_engine",
    } <= run_training


def test_export_settings_are_declared_once_and_offered_by_the_cli() -> None:
    """Every ExportConfig field is an `export` option of the same name with the same default, and the config is
    built from the parsed options by field name, refusing a bad value on construction."""
    import typer.main

    from mtp2draft.cli.app import app
    from mtp2draft.errors import SourceError
    from mtp2draft.formats import ExportConfig

    command = typer.main.get_command(app).commands["export"]
    defaults = {p.name: p.default for p in command.params if p.param_type_name == "option"}
    assert {f.name: f.default for f in fields(ExportConfig)} == {f.name: defaults[f.name] for f in fields(ExportConfig)}
    assert ExportConfig.from_options({"dtype": "float32", "out": "x", "format": "sglang"}) == ExportConfig("float32")
    with pytest.raises(SourceError, match="--speculative-tokens must be at least 1"):
        ExportConfig(speculative_tokens=0)


def test_evaluate_settings_are_declared_once_and_offered_by_the_cli() -> None:
    """Every EvaluateConfig field is an `evaluate` option of the same name with the same default (what `run` offers
    too, where it has the option), built by field name and refusing a bad value on construction."""
    import typer.main

    from mtp2draft.cli.app import app
    from mtp2draft.errors import OptionError
    from mtp2draft.evaluation.settings import EvaluateConfig

    command = typer.main.get_command(app).commands["evaluate"]
    defaults = {p.name: p.default for p in command.params if p.param_type_name == "option"}
    assert {f.name: f.default for f in fields(EvaluateConfig)} == {
        f.name: defaults[f.name] for f in fields(EvaluateConfig)
    }
    assert EvaluateConfig.from_options({"num_draft_tokens": 2, "engine": "vllm"}) == EvaluateConfig(num_draft_tokens=2)
    for bad, line in (({"max_new_tokens": 0}, "--max-new-tokens must be at least 1"), ({"top_p": 0}, "--top-p")):
        with pytest.raises(OptionError, match=line):
            EvaluateConfig(**bad)


def test_distill_config_comes_from_the_parsed_options_by_field_name() -> None:
    from mtp2draft.train.settings import DistillConfig

    cfg = DistillConfig.from_options({"steps": 7, "compile_": True, "out": "x", "ttt_steps": 2, "target": "t"})
    assert (cfg.steps, cfg.compile, cfg.ttt_steps) == (7, True, 2)
    with pytest.raises(Exception, match="frozen|cannot assign"):
        cfg.steps = 3  # one settings object, passed whole: nothing downstream edits it


def test_demo_prints_how_good_the_bundled_target_is() -> None:
    """The demo's acceptance is read beside the target's own quality (issue 18): its training.json's held-out
    next-token top-1, MTP-vs-trunk agreement and greedy repeat rate, as the file holds them."""
    import json

    from mtp2draft.pipeline import BUNDLED_TARGET, target_figures

    figures = target_figures(BUNDLED_TARGET)
    held = json.loads((BUNDLED_TARGET / "training.json").read_text())
    assert figures is not None and figures["next_token_top1"] == held["next_token_top1"]
    report = {"results": [_row("distilled mtp", 2.0, [0.5, 0.5])], "target": "t", "num_prompts": 16}
    report["num_draft_tokens"] = 2
    result = SimpleNamespace(report=report, exported=Path("w/x"), stages={}, work=Path("w"), target_figures=figures)
    text = output.demo_text(result)
    assert f"held-out next-token top-1 {held['next_token_top1']:.3f}" in text
    assert f"repeat {held['greedy_repeat_rate']:.3f} of their 4-grams" in text
    assert target_figures(Path("/nonexistent")) is None
