"""The command line's own contract (cli/): data on stdout and logs on stderr, one formatter that turns
every known failure into one line with its exit status, option lists parsed into numbers, training options reaching
DistillConfig by name, and the texts the commands print. The stages themselves are tested in their own files."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file, save_file

from mtp2draft.cli import options, output
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
    assert [row["name"] for row in json.loads(out) if row["supported"] and "draft_kind" not in row] == list(registry())
    code, out, _ = run_cli(capsys, "specs")
    names = [line.split()[0] for line in out.split("\n\n")[0].splitlines()]
    assert code == 0 and names == list(registry()) and "engine support" in out


def test_specs_say_whose_key_list_is_verified_by_what_and_the_engines_known_bugs(capsys) -> None:
    """`specs --json`: per family, `verified` and `key_source`, and per engine `known_bug`; the text shows both."""
    code, out, _ = run_cli(capsys, "specs", "--json")
    rows = {r["name"]: r for r in json.loads(out) if r["supported"] and "draft_kind" not in r}
    assert code == 0 and all(isinstance(r["key_source"], str) for r in rows.values())
    assert all(isinstance(f["known_bug"], str) for r in rows.values() for f in r["engines"].values())
    assert "#52688" in rows["qwen3_5_moe_text"]["engines"]["vllm"]["known_bug"]
    assert not rows["qwen3_5_moe_text"]["engines"]["sglang"]["known_bug"]  # the bug is in vLLM's proposer
    code, out, _ = run_cli(capsys, "specs")
    bugs = out.split("known engine bugs\n")[1].split("\n\n")[0].splitlines()
    assert sorted(line.split()[0] for line in bugs) == sorted(
        name for name, r in rows.items() if any(f["known_bug"] for f in r["engines"].values())
    )
    said = out.split("\nkey list")[1].split("\n\n")[0].splitlines()[1:]
    assert {line.split()[0]: line.split()[1] for line in said} == {
        name: "verified:" if r["verified"] else "unverified:" for name, r in rows.items()
    }


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
def test_list_options_parse_to_numbers() -> None:
    from mtp2draft.settings import floats, ints

    assert options.parse_list("1,0.8,0.64", "--step-weights", floats) == [1.0, 0.8, 0.64]
    assert options.parse_list("3,5,7", "--aux-layers", ints) == [3, 5, 7]
    assert options.parse_list(None, "--aux-layers", ints) is None and options.parse_list("", "--x", floats) is None


def test_training_options_reach_the_config_whole(monkeypatch, capsys) -> None:
    """`distill`'s parsed options become one request: one DistillConfig, `--step-weights` parsed to numbers and
    every unset field at its declared default; options that are not training settings (device, dtype) go to their
    own record, whole."""
    import mtp2draft.train.recipe as recipe
    from mtp2draft.errors import OptionError
    from mtp2draft.settings import HubAccess, Placement
    from mtp2draft.train.settings import DistillJob, TrainingData

    seen = {}

    def fake(job):
        seen["job"] = job
        raise OptionError("stopped before training")

    monkeypatch.setattr(recipe, "distill", fake)
    args = ["distill", "d", "--out", "o", "--steps", "7", "--ttt-steps", "2", "--seed", "3", "--step-weights", "1,0.5"]
    assert main([*args, "--compile", "--lr", "0.5", "--device", "cpu", "--dtype", "bfloat16"]) == 2
    assert "stopped before training" in capsys.readouterr().err
    job = seen["job"]
    assert isinstance(job, DistillJob) and job.draft_dir == Path("d") and job.out == Path("o")
    assert job.config == DistillConfig(steps=7, ttt_steps=2, seed=3, lr=0.5, step_weights=[1.0, 0.5], compile=True)
    assert job.where == Placement(device="cpu", dtype="bfloat16")
    assert job.data == TrainingData() and job.hub == HubAccess() and job.new.new_dspark is None


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


def _options(command_name: str) -> dict[str, object]:
    """A command's options by Python name (typer's click command)."""
    import typer.main

    from mtp2draft.cli.app import app

    command = typer.main.get_command(app).commands[command_name]
    return {p.name: p for p in command.params}


# every command that offers a stage's settings, and which of its fields it leaves out (and why, in cli/)
SETTINGS_OFFERED = {
    "ConvertConfig": {"convert": (), "run": ("dtype", "aux_layers")},
    "DistillConfig": {"distill": (), "run": ()},
    "EvaluateConfig": {"evaluate": (), "run": ("seed",)},
    "ExportConfig": {"export": ()},
    "Placement": {
        "distill": ("tensor_parallel_size",),
        "evaluate": (),
        "run": ("tensor_parallel_size",),
        "dump-hidden": ("device", "dtype", "device_map"),
    },
    "HubAccess": {
        **{c: () for c in ("inspect", "convert", "distill", "evaluate", "dump-hidden", "export", "validate")},
        "push": ("revision",),  # push's --revision is the branch it commits to
    },
    "RunConfig": {"run": ()},
    "DumpConfig": {"dump-hidden": ()},
    "DSparkObjective": {"distill": ()},
    "NewDSpark": {"distill": ()},
    "TrainingData": {
        "distill": (),
        "run": ("hidden_states",),
        "dump-hidden": ("data", "hidden_states", "heldout"),  # its --data is the data it dumps
    },
}


def _settings_classes() -> dict[str, type]:
    from mtp2draft.evaluation.settings import EvaluateConfig
    from mtp2draft.formats import ExportConfig
    from mtp2draft.settings import ConvertConfig, DumpConfig, HubAccess, Placement, RunConfig
    from mtp2draft.train.settings import DSparkObjective, NewDSpark, TrainingData

    classes = [ConvertConfig, DistillConfig, EvaluateConfig, ExportConfig, Placement, HubAccess, RunConfig, DumpConfig]
    classes += [TrainingData, DSparkObjective, NewDSpark]
    return {c.__name__: c for c in classes}


@pytest.mark.parametrize("name", sorted(SETTINGS_OFFERED))
def test_every_setting_is_one_option_with_its_declared_default_and_help(name: str) -> None:
    """Each settings field a command offers is exactly one option there, named after the field, with the field's
    default and the field's help; a field no command offers says why (`cli=False`, its help the reason)."""
    import dataclasses

    from mtp2draft.settings import cli_fields, flag_of

    cls = _settings_classes()[name]
    for f in dataclasses.fields(cls):
        if f not in list(cli_fields(cls)):
            assert f.metadata["help"].strip(), f"{name}.{f.name}: library-only without a reason"
    for command, left_out in SETTINGS_OFFERED[name].items():
        params = _options(command)
        for f in cli_fields(cls):
            if f.name in left_out:
                assert f.name not in params or params[f.name].help != options.help_of(f), (command, f.name)
                continue
            param = params[f.name]
            assert param.opts[0] == flag_of(f), (command, f.name)
            assert [o for p in params.values() for o in p.opts].count(flag_of(f)) == 1, (command, f.name)
            if f.default is not dataclasses.MISSING and not f.metadata["parse"]:
                assert param.default == f.default, (command, f.name)
            assert param.help == options.help_of(f), (command, f.name)


# flags the command modules declare by hand although a settings field has the same flag: each means another thing
# in the command that declares it (its help says which), so it is not that setting written twice
OTHER_MEANINGS = {
    "--data": "evaluate / dump-hidden: the prompts run through the target",
    "--format": "export / validate: the format written or checked (required there)",
    "--overwrite": "each command: replace its own output",
    "--private": "push: the visibility of the repo it creates",
    "--revision": "push: the branch it commits to",
    "--skip-bad": "distill / dump-hidden: their data reader's",
    "--steps": "demo: its own short run",
    "--target": "evaluate / export / validate / speedup: the target each reads",
    "--work": "demo: where it keeps its drafts",
}
# flags two commands declare by hand, each with its own meaning
REUSED = {"--draft", "--engine", "--format", "--out", "--target"}


def test_no_setting_or_option_is_declared_twice_in_the_cli() -> None:
    """The command modules declare no settings field's option by hand (only flags of another meaning, listed with
    it), and a flag they do declare lives once, in cli/options.py or the one command that takes it."""
    import re

    from mtp2draft.settings import cli_fields, flag_of

    setting_flags = {flag_of(f) for cls in _settings_classes().values() for f in cli_fields(cls)}
    sources = [p.read_text() for p in Path(options.__file__).parent.glob("*.py")]
    declared = [m for text in sources for m in re.findall(r'typer\.Option\(\s*"(--[a-z-]+)"', text)]
    assert set(declared) & setting_flags == set(OTHER_MEANINGS)
    assert {f for f in declared if declared.count(f) > 1} == REUSED


def test_research_knobs_sit_in_the_advanced_panel() -> None:
    from mtp2draft.cli.options import ADVANCED

    for command, names in (("distill", ("step_weights", "teacher_temperature", "hidden_handover")),
                           ("evaluate", ("step_layers",))):  # fmt: skip
        params = _options(command)
        assert all(params[n].rich_help_panel == ADVANCED for n in names)
        assert params["steps" if command == "distill" else "num_draft_tokens"].rich_help_panel is None


def test_settings_refuse_a_bad_value_on_construction() -> None:
    from mtp2draft.errors import OptionError, SourceError
    from mtp2draft.evaluation.settings import EvaluateConfig
    from mtp2draft.formats import ExportConfig

    with pytest.raises(SourceError, match=r"--speculative-tokens must be in \[1, 64\]"):
        ExportConfig(speculative_tokens=0)
    for bad, line in (({"max_new_tokens": 0}, "--max-new-tokens must be at least 1"), ({"top_p": 0}, "--top-p")):
        with pytest.raises(OptionError, match=line):
            EvaluateConfig(**bad)
    cfg = DistillConfig(steps=7)
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


def test_ctrl_c_is_one_line_and_exit_130(build, tmp_path: Path, monkeypatch, capsys) -> None:
    """Ctrl-C inside a command (typer turns it into a silent Exit(130)) and a real SIGINT to a running process:
    one `error:` line, exit 130, no traceback, and nothing half-written at --out."""
    import signal
    import subprocess

    import mtp2draft.conversion as conversion

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(conversion, "plan_mtp_layer", stop)
    assert main(["convert", str(build("mimo")), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert "interrupted (Ctrl-C)" in err and "Traceback" not in err and not (tmp_path / "o").exists()
    argv = [sys.executable, "-m", "mtp2draft", "convert", str(build("mimo")), "--out", str(tmp_path / "p")]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None and "resolving" in proc.stderr.readline()  # the command is running
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
    assert proc.returncode == 130 and "Traceback" not in rest
    assert rest.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C)"), rest


def test_specs_marks_an_engine_that_computes_the_family_differently(capsys) -> None:
    """MiMo: SGLang's MTP layer reads the post-norm hidden, the checkpoint's was trained on the pre-norm one (run
    warns, the card notes it); `specs` used to show the same hand-over for both engines and nothing else."""
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("mimo ") and "mtp [" in line)
    sglang, vllm = row.split("mtp [")[1:]
    assert sglang.rstrip().endswith("*") and "*" not in vllm  # columns: sglang, then vllm
    assert "*: this engine's MTP layer reads another target hidden" in out


# Imports in cli/ that keep a name other than the library's, each for a reason: `rows` alone says nothing.
RENAMED_IMPORTS = {("mtp2draft.family.not_supported", "rows")}


def renamed_imports(source: str) -> list[tuple[str, str, str]]:
    """(module, name, alias) of each `from mtp2draft... import name as alias` not in RENAMED_IMPORTS."""
    import ast

    return [
        (node.module, a.name, a.asname)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mtp2draft")
        for a in node.names
        if a.asname and (node.module, a.name) not in RENAMED_IMPORTS
    ]


def test_commands_call_the_library_by_its_own_names() -> None:
    """A command calls `convert`, `export`, `push`..., never `run`: grep for a library function finds its callers."""
    assert renamed_imports("from mtp2draft.conversion import convert as run") == [
        ("mtp2draft.conversion", "convert", "run")
    ]
    cli = Path(__file__).resolve().parents[1] / "mtp2draft" / "cli"
    found = {p.name: hits for p in sorted(cli.glob("*.py")) if (hits := renamed_imports(p.read_text()))}
    assert found == {}
