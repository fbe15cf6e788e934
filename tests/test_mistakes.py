"""The mistakes and accidents of a working day, as a user makes them: a SOURCE that is neither a directory nor a repo
id, a data path that is a directory or a pipe, a chat that opens with the assistant, an option past what runs, a Hub
endpoint that answers with something that is not the Hub's answer. Each case fails with its exit code and exactly
one `error:` line naming the problem, no traceback, nothing new on disk and nothing lost (the same test as
`test_bad_commands.py`, whose inputs it shares).

A case's name starts with the command it runs (`tests/case_tables.py` counts them for the README's Safety table).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_bad_commands import World, _chain, _distill, _dump, _evaluate, _export, _run, run_case, world  # noqa: F401 - fixture

from mtp2draft.cli.app import main


@dataclass
class Case:
    argv: list[str]
    needle: str  # what the one line must say
    code: int = 2
    stdout: str = ""  # what stdout must say (validate lists violations there)


CaseFn = Callable[[World, Path, pytest.MonkeyPatch, contextlib.ExitStack], Case]
CASES: dict[str, CaseFn] = {}


def _add(name: str, fn: CaseFn) -> None:
    assert name not in CASES, name
    CASES[name] = fn


DS3 = "deepseek-ai/DeepSeek-V3"  # a config shipped with mtp2draft (`speedup --target`)


# ---- a SOURCE or --target that is neither a directory nor a repo id: one resolver, one line ---------------------------
# What each command is given in the place of a checkpoint (its SOURCE, or its --target).
WITH_SOURCE: dict[str, Callable[[World, Path, str], list[str]]] = {
    "inspect": lambda w, tmp, src: ["inspect", src],
    "convert": lambda w, tmp, src: ["convert", src, "--out", str(tmp / "out")],
    "run": lambda w, tmp, src: [*_run(w, tmp)[:1], src, *_run(w, tmp)[2:]],
    "run_target": lambda w, tmp, src: _run(w, tmp, "--target", src),
    "distill_target": lambda w, tmp, src: _distill(w, tmp)[:3] + [src] + _distill(w, tmp)[4:],
    "evaluate_target": lambda w, tmp, src: _evaluate(w)[:3] + [src] + _evaluate(w)[4:],
    "validate_target": lambda w, tmp, src: ["validate", str(w.ds_mtp), "--target", src],
    "export_target": lambda w, tmp, src: _export(w.ds_mtp, tmp, "stitched", "--target", src),
    "dump_hidden_target": lambda w, tmp, src: _dump(w, tmp)[:2] + [src] + _dump(w, tmp)[3:],
}
NOT_A_SOURCE = {"spaced_relative_path": "./my model", "double_dash_id": "org/a--b", "newline": "my\nmodel"}

for _command, _argv in WITH_SOURCE.items():
    for _what, _source in NOT_A_SOURCE.items():

        def _fn(w, tmp, mp, stack, a=_argv, s=_source):
            shown = s if s.isprintable() else repr(s)
            return Case(a(w, tmp, s), f"directory `{shown}` does not exist, and `{shown}` is not a Hub repo id")

        _add(f"{_command}_source_{_what}", _fn)


# ---- a Hub endpoint that answers with something else: one line from every command that talks to the Hub ---------------
def _impostor(kind: str, mp: pytest.MonkeyPatch, stack: contextlib.ExitStack) -> None:
    from support.hub_impostor import ImpostorServer

    server = stack.enter_context(ImpostorServer(kind))
    stack.enter_context(server.activate())
    mp.setenv("MTP2DRAFT_HUB_RETRIES", "0")


def _export_dir(w: World, tmp: Path, name: str = "export") -> Path:
    assert main(["export", str(w.ds_e3), "--format", "sglang", "--out", str(tmp / name)]) == 0
    return tmp / name


for _kind in ("html", "empty", "truncated"):
    for _command, _argv in WITH_SOURCE.items():

        def _fn(w, tmp, mp, stack, a=_argv, k=_kind):
            _impostor(k, mp, stack)
            return Case(a(w, tmp, "org/repo"), "answered model_info (GET ")

        _add(f"{_command}_hub_answers_{_kind}", _fn)

    def _push(w, tmp, mp, stack, k=_kind):
        draft = _export_dir(w, tmp)
        _impostor(k, mp, stack)
        return Case(["push", str(draft), "--repo-id", "me/draft"], "answered create_repo (POST ")

    _add(f"push_hub_answers_{_kind}", _push)


# ---- a Hub that answers well at first and breaks on a later call (a proxy's session ends mid-run) -------------------
def _breaking_hub(w: World, mp: pytest.MonkeyPatch, stack: contextlib.ExitStack, n: int, kind: str):
    """A loopback Hub holding the target as `org/repo` that answers its n-th request and every later one with
    hub_impostor.ANSWERS[kind]; the HF and range caches live outside the case's directory (and start empty)."""
    import tempfile

    from huggingface_hub import constants
    from support.hub_server import HubServer

    cache = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    mp.setattr(constants, "HF_HUB_CACHE", str(cache / "hub"))
    mp.setattr(constants, "HF_HOME", str(cache))
    mp.setenv("MTP2DRAFT_CACHE", str(cache / "ranges"))
    mp.setenv("MTP2DRAFT_HUB_RETRIES", "0")
    server = stack.enter_context(HubServer())
    server.add_repo("org/repo", w.ds)
    stack.enter_context(server.activate())
    server.broken_from = (n, kind)
    return server


NOT_THE_HUB = "not the Hub's answer"
# Which call breaks: the first file download after model_info, the index or a shard header, a later read. Every
# command here makes at least five requests when the Hub works (validate --target the fewest).
LATER_CALLS = {2: "html", 3: "empty", 5: "truncated"}
for _command, _argv in WITH_SOURCE.items():
    for _n, _kind in LATER_CALLS.items():

        def _fn(w, tmp, mp, stack, a=_argv, n=_n, k=_kind):
            _breaking_hub(w, mp, stack, n, k)
            return Case(a(w, tmp, "org/repo"), NOT_THE_HUB)

        _add(f"{_command}_hub_breaks_at_call_{_n}_{_kind}", _fn)

for _n, _kind in ((3, "empty"), (8, "html")):  # preupload; the commit, once the weights' LFS upload went through

    def _push_later(w, tmp, mp, stack, n=_n, k=_kind):
        draft = _export_dir(w, tmp)
        _breaking_hub(w, mp, stack, n, k)
        return Case(["push", str(draft), "--repo-id", "tester/draft"], NOT_THE_HUB)

    _add(f"push_hub_breaks_at_call_{_n}_{_kind}", _push_later)


def push_link_leading_out_before_any_request(w, tmp, mp, stack):
    """Refused before the repo is created: under an endpoint that answers nothing usable, the line is the link's."""
    draft = _export_dir(w, tmp)
    (tmp / "secret.txt").write_text("mine")
    (draft / "notes.txt").symlink_to(tmp / "secret.txt")
    _impostor("empty", mp, stack)
    return Case(["push", str(draft), "--repo-id", "me/draft"], "leads outside")


def push_token_in_a_weight_file_before_any_request(w, tmp, mp, stack):
    draft = _export_dir(w, tmp)
    _impostor("empty", mp, stack)  # its token is the one push uses
    header = json.dumps({"__metadata__": {"note": "hf_test_token"}}).encode()
    (draft / "extra.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return Case(["push", str(draft), "--repo-id", "me/draft"], "contains a Hub token")


_add("push_link_leading_out_before_any_request", push_link_leading_out_before_any_request)
_add("push_token_in_a_weight_file_before_any_request", push_token_in_a_weight_file_before_any_request)


# ---- a data path that is not a file of records: said what it is ------------------------------------------------------
def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def _folder(tmp: Path) -> str:
    (tmp / "folder").mkdir()
    return str(tmp / "folder")


def _replaced(argv: list[str], option: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(option) + 1] = value
    return out


for _name, _make, _needle in (
    ("distill_data_is_a_directory", lambda w, tmp: _replaced(_distill(w, tmp), "--data", _folder(tmp)), "a directory"),
    ("evaluate_data_is_a_fifo", lambda w, tmp: _replaced(_evaluate(w), "--data", _fifo(tmp)), "a FIFO"),
    ("dump_hidden_data_is_dev_null", lambda w, tmp: _replaced(_dump(w, tmp), "--data", os.devnull), "character device"),
    ("run_data_is_a_directory", lambda w, tmp: _replaced(_run(w, tmp), "--data", _folder(tmp)), "--data"),
    ("run_heldout_is_a_fifo", lambda w, tmp: _run(w, tmp, "--heldout", _fifo(tmp)), "--heldout"),
    ("run_eval_data_is_dev_null", lambda w, tmp: _run(w, tmp, "--eval-data", os.devnull), "character device"),
):
    _add(_name, lambda w, tmp, mp, stack, m=_make, n=_needle: Case(m(w, tmp), n))


# ---- data that cannot be used, found before anything is fetched or trained ------------------------------------------
def _records(tmp: Path, name: str, *records: object, raw: bytes = b"") -> str:
    path = tmp / name
    path.write_bytes(raw + "".join(json.dumps(r) + "\n" for r in records).encode())
    return str(path)


ASSISTANT_FIRST = {"messages": [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}]}
OPENS = "the chat opens with the assistant's turn"

for _name, _make, _needle in (
    ("distill_chat_opens_with_the_assistant",
     lambda w, tmp: _replaced(_distill(w, tmp), "--data", _records(tmp, "d.jsonl", ASSISTANT_FIRST)), OPENS),
    ("distill_chat_opens_with_the_assistant_skip_bad",
     lambda w, tmp: _replaced(_distill(w, tmp, "--skip-bad"), "--data", _records(tmp, "d.jsonl", ASSISTANT_FIRST)),
     "holds no usable records (1 malformed lines skipped)"),
    ("distill_heldout_chat_opens_with_the_assistant",
     lambda w, tmp: _distill(w, tmp, "--heldout", _records(tmp, "h.jsonl", ASSISTANT_FIRST, ASSISTANT_FIRST)), OPENS),
    ("dump_hidden_chat_opens_with_the_assistant",
     lambda w, tmp: _replaced(_dump(w, tmp), "--data", _records(tmp, "d.jsonl", ASSISTANT_FIRST)), OPENS),
    ("evaluate_chat_opens_with_the_assistant",
     lambda w, tmp: _replaced(_evaluate(w), "--data", _records(tmp, "d.jsonl", ASSISTANT_FIRST)), OPENS),
    ("run_chat_opens_with_the_assistant",
     lambda w, tmp: _replaced(_run(w, tmp), "--data", _records(tmp, "d.jsonl", ASSISTANT_FIRST)), OPENS),
    ("run_data_empty", lambda w, tmp: _replaced(_run(w, tmp), "--data", _records(tmp, "d.jsonl")), "no usable records"),
    ("run_eval_data_empty", lambda w, tmp: _run(w, tmp, "--eval-data", _records(tmp, "e.jsonl")), "no usable records"),
    ("run_heldout_not_utf8",
     lambda w, tmp: _run(w, tmp, "--heldout", _records(tmp, "h.jsonl", raw=b'{"text": "caf\xe9"}\n')), "not UTF-8"),
):  # fmt: skip
    _add(_name, lambda w, tmp, mp, stack, m=_make, n=_needle: Case(m(w, tmp), n))


# ---- chats the target's template cannot render: one line naming the record, or skipped and counted ------------------
# The target's own ChatML template, made strict as real ones are: it knows `KNOWN` roles, wants a tool turn's
# `tool_call_id`, and raises on a content of "boom" (a template whose own code fails).
STRICT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] not in KNOWN -%}{{ raise_exception('unknown role ' + m['role']) }}{%- endif -%}"
    "{%- if m['role'] == 'tool' and m['tool_call_id'] is not defined -%}"
    "{{ raise_exception('a tool message needs its tool_call_id') }}{%- endif -%}"
    "{%- if m['content'] == 'boom' -%}{{ m['content'] + 1 }}{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def _strict_target(w: World, tmp: Path, known: tuple[str, ...] = ("system", "user", "assistant", "tool")) -> Path:
    """A copy of the target whose chat template is STRICT_TEMPLATE (knowing `known` roles)."""
    import shutil

    target = tmp / "strict-target"
    shutil.copytree(w.ds, target)
    (target / "chat_template.jinja").write_text(STRICT_TEMPLATE.replace("KNOWN", repr(list(known))))
    return target


def _chat(*turns: tuple[str, object], **extra: object) -> dict:
    return {"messages": [{"role": r, "content": c, **extra} for r, c in turns]}


HI, ANSWER = ("user", "hi"), ("assistant", "hello there, how are you")
TOOL_TURN = _chat(HI, ("assistant", "calling"), ("tool", "42"), ANSWER)
BOOM = _chat(("user", "boom"), ANSWER)
CANNOT_RENDER = "the target's chat template cannot render this chat"
NO_TOOL = ("system", "user", "assistant")  # a template that knows no tool role

for _name, _record, _known, _needle in (
    ("role_the_template_does_not_know", TOOL_TURN, NO_TOOL, "unknown role tool"),
    ("tool_message_without_its_fields", TOOL_TURN, None, "a tool message needs its tool_call_id"),
    ("template_that_raises", BOOM, None, CANNOT_RENDER),
    (
        "content_a_list",
        _chat(("user", [{"type": "text", "text": "hi"}]), ANSWER),
        None,
        "message 0's 'content' is a list",
    ),
    ("content_null", _chat(("user", None), ANSWER), None, "message 0's 'content' is null"),
    ("system_only", _chat(("system", "be brief")), None, "the chat holds system messages only"),
):

    def _target_for(w, tmp, known=_known):
        return _strict_target(w, tmp, known or ("system", "user", "assistant", "tool"))

    def _distill_chat(w, tmp, mp, stack, r=_record, n=_needle, t=_target_for):
        data = _records(tmp, "d.jsonl", {"text": "plain text is fine"}, r)
        argv = _replaced(_distill(w, tmp, target=t(w, tmp)), "--data", data)
        by_template = n == CANNOT_RENDER or r in (TOOL_TURN, BOOM)  # else refused as it is read, before the template
        return Case(argv, f"d.jsonl:2: {CANNOT_RENDER if by_template else n}")

    def _distill_chat_skipped(w, tmp, mp, stack, r=_record, t=_target_for):
        argv = _replaced(_distill(w, tmp, "--skip-bad", target=t(w, tmp)), "--data", _records(tmp, "d.jsonl", r, r))
        return Case(argv, "holds no usable records")  # every line skipped and counted

    def _dump_chat(w, tmp, mp, stack, r=_record, n=_needle, t=_target_for):
        argv = _dump(w, tmp)
        argv[argv.index("--target") + 1] = str(t(w, tmp))
        return Case(_replaced(argv, "--data", _records(tmp, "d.jsonl", r)), n)

    def _run_chat(w, tmp, mp, stack, r=_record, n=_needle, t=_target_for):
        return Case(_replaced(_run(w, tmp, source=t(w, tmp)), "--data", _records(tmp, "d.jsonl", r)), n)

    _add(f"distill_chat_{_name}", _distill_chat)
    _add(f"distill_chat_{_name}_skip_bad", _distill_chat_skipped)
    _add(f"dump_hidden_chat_{_name}", _dump_chat)
    _add(f"run_chat_{_name}", _run_chat)


def evaluate_chat_template_that_raises(w, tmp, mp, stack):
    return Case(_replaced(_evaluate(w, target=_strict_target(w, tmp)), "--data", _records(tmp, "e.jsonl", BOOM)),
                CANNOT_RENDER)  # fmt: skip


_add("evaluate_chat_template_that_raises", evaluate_chat_template_that_raises)


# ---- options past what runs: refused, saying the bound ---------------------------------------------------------------
SEED_2_64 = str(2**64)
SEED_BOUND = "--seed must be a whole number in [0, 2**63 - 1]"
for _name, _make, _needle in (
    ("evaluate_k_beyond_what_runs", lambda w, tmp: _evaluate(w, "-k", "2000"), "--num-draft-tokens must be at most 64"),
    ("evaluate_max_new_tokens_1e8", lambda w, tmp: _evaluate(w, "--max-new-tokens", "100000000"), "at most 65536"),
    ("evaluate_seed_beyond_64_bits", lambda w, tmp: _evaluate(w, "--seed", SEED_2_64), SEED_BOUND),
    ("evaluate_seed_negative", lambda w, tmp: _evaluate(w, "--seed", "-1"), SEED_BOUND),
    ("distill_seed_beyond_64_bits", lambda w, tmp: _distill(w, tmp, "--seed", SEED_2_64), SEED_BOUND),
    ("run_k_beyond_what_runs", lambda w, tmp: _run(w, tmp, "-k", "65"), "--num-draft-tokens must be at most 64"),
    ("run_seed_beyond_64_bits", lambda w, tmp: _run(w, tmp, "--seed", SEED_2_64), SEED_BOUND),
    ("export_speculative_tokens_1e20",
     lambda w, tmp: _export(w.ds_e3, tmp, "speculators", "--speculative-tokens", str(10**20)), "must be in [1, 64]"),
    ("export_verifier_with_a_newline",
     lambda w, tmp: _export(w.ds_e3, tmp, "speculators", "--verifier", "org/m\nx"), "--verifier must be one line"),
):  # fmt: skip
    _add(_name, lambda w, tmp, mp, stack, m=_make, n=_needle: Case(m(w, tmp), n))


def _speculators_edited(w: World, tmp: Path, edit: Callable[[dict], None]) -> str:
    out = tmp / "export"
    assert main(["export", str(w.ds_e3), "--format", "speculators", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg["speculators_config"])
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def _k(section: dict) -> None:
    section["proposal_methods"][0]["speculative_tokens"] = 10**20


def _verifier(section: dict) -> None:
    section["verifier"]["name_or_path"] = "org/m\nrm -rf ~"


for _name, _edit, _stdout in (
    ("validate_speculative_tokens_1e20", _k, "speculative_tokens must be in [1, 64]"),
    ("validate_verifier_with_a_newline", _verifier, "is not one line naming a model"),
):
    _add(
        _name,
        lambda w, tmp, mp, stack, e=_edit, o=_stdout: Case(
            ["validate", _speculators_edited(w, tmp, e)], "1 violation(s)", stdout=o
        ),
    )


# ---- engine rules as data, honoured: an engine that runs no chain for a family is not trained for with one ---------
NO_CHAIN_LINE = "sglang 0.5.23 runs no chain of MTP layers for mimo targets"


def distill_chain_for_an_engine_that_runs_no_chain(w, tmp, mp, stack):
    src, chain = _chain(tmp)
    return Case(_distill(w, tmp, "--serving-engine", "sglang", draft=chain, target=src), NO_CHAIN_LINE)


def run_all_layers_for_an_engine_that_runs_no_chain(w, tmp, mp, stack):
    src, _ = _chain(tmp)
    argv = _run(w, tmp, "--all-layers", "--format", "stitched", "--serving-engine", "sglang", source=src)
    return Case(argv, NO_CHAIN_LINE)


_add("distill_chain_for_an_engine_that_runs_no_chain", distill_chain_for_an_engine_that_runs_no_chain)
_add("run_all_layers_for_an_engine_that_runs_no_chain", run_all_layers_for_an_engine_that_runs_no_chain)


# ---- accidents: a full disk at a periodic checkpoint, a target shard cut short ----------------------------------------
def distill_periodic_checkpoint_on_a_full_disk(w, tmp, mp, stack):
    """DCP wraps the stream writer's failure (`inline_container.cc`) in a CheckpointException: one line, the
    half-written checkpoint and the folder the run made are gone."""
    from torch.distributed.checkpoint.api import CheckpointException

    def full(*_a, **_k):
        cause = RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file "
                             "data/0: file write failed")  # fmt: skip
        raise CheckpointException("write_data", {0: (cause, None)})

    mp.setattr("torch.distributed.checkpoint.save", full)
    return Case(_distill(w, tmp, "--save-every", "1"), "could not write checkpoint step-0000001", code=1)


def _cut_short(w: World, tmp: Path) -> Path:
    """A copy of the target whose last shard lost its last 64 bytes (a download cut short)."""
    import shutil

    target = tmp / "target"
    shutil.copytree(w.ds, target)
    shard = sorted(target.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-64])
    return target


for _name, _make in (
    ("distill_target_shard_cut_short", lambda w, tmp: _distill(w, tmp, target=_cut_short(w, tmp))),
    ("evaluate_target_shard_cut_short", lambda w, tmp: _evaluate(w, target=_cut_short(w, tmp))),
    ("dump_hidden_target_shard_cut_short",
     lambda w, tmp: (lambda t: _dump(w, tmp)[:2] + [str(t)] + _dump(w, tmp)[3:])(_cut_short(w, tmp))),
):  # fmt: skip
    _add(_name, lambda w, tmp, mp, stack, m=_make: Case(m(w, tmp), "is inconsistent"))
_add("distill_periodic_checkpoint_on_a_full_disk", distill_periodic_checkpoint_on_a_full_disk)


# ---- speedup reads an evaluation with the typed reader `evaluate --save` writes with --------------------------------
for _name, _results, _needle in (
    ("results_a_string", '"0.9, 0.6"', "results must be a non-empty list of the drafts' figures, got str"),
    ("results_null_entry", "[null]", "results[0] must be an object holding a draft's figures, got null"),
    ("results_a_number_entry", "[5]", "results[0] must be an object holding a draft's figures, got int"),
    ("results_an_object", '{"acceptance_per_position": [0.9]}', "results must be a non-empty list"),
    ("results_nan_mean", '[{"acceptance_per_position": [0.9], "mean_acceptance_length": NaN}]', "must be a number"),
):

    def _fn(w, tmp, mp, stack, r=_results, n=_needle):
        (tmp / "evaluation.json").write_text(f'{{"acceptance_per_position": [0.9], "results": {r}}}')
        return Case(["speedup", str(tmp / "evaluation.json"), "--target", DS3, "--gpu", "h200"], n)

    _add(f"speedup_{_name}", _fn)


def push_evaluation_results_a_string(w, tmp, mp, stack):
    """The card carries the evaluation's figures: read by the typed reader, before any request."""
    draft = _export_dir(w, tmp)
    (draft / "evaluation.json").write_text('{"results": "0.9"}')
    mp.setenv("HF_TOKEN", "hf_" + "x" * 34)
    return Case(["push", str(draft), "--repo-id", "me/draft"], "results must be a non-empty list")


_add("push_evaluation_results_a_string", push_evaluation_results_a_string)


# ---- a directory one command reads, replaced under it by another: never carried over or mixed ------------------------
def _own_draft(w: World, tmp: Path) -> Path:
    """A copy of the draft the case may see replaced (the shared one is never touched)."""
    import shutil

    shutil.copytree(w.ds_mtp, tmp / "draft")
    return tmp / "draft"


def _small_dump(w: World, tmp: Path, name: str = "dump", *extra: str) -> Path:
    argv = ["dump-hidden", "--target", str(w.ds), "--data", str(w.data), "--out", str(tmp / name)]
    assert main([*argv, "--max-length", "32", "--shard-size", "4", *extra]) == 0
    return tmp / name


def evaluate_save_while_another_run_replaces_the_draft(w, tmp, mp, stack):
    """`convert --overwrite` holds the draft's claim: evaluate refuses before reading, so no figures can land in the
    draft that replaces it."""
    from test_bad_commands import _claimed_elsewhere

    draft = _own_draft(w, tmp)
    _claimed_elsewhere(draft, stack)
    return Case(_evaluate(w, "--save", draft=draft), "is being replaced by another mtp2draft run")


def distill_hidden_states_while_dump_hidden_overwrites_them(w, tmp, mp, stack):
    from test_bad_commands import _claimed_elsewhere

    dump = _small_dump(w, tmp)
    _claimed_elsewhere(dump, stack)
    argv = ["distill", str(w.ds_mtp), "--hidden-states", str(dump), "--out", str(tmp / "out"), "--steps", "2"]
    return Case([*argv, "--batch-size", "2", "--max-length", "32"], "is being written by another mtp2draft run")


_add("evaluate_save_while_another_run_replaces_the_draft", evaluate_save_while_another_run_replaces_the_draft)
_add("distill_hidden_states_while_dump_hidden_overwrites_them", distill_hidden_states_while_dump_hidden_overwrites_them)


# ---- the test ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_mistake_fails_in_one_line_and_writes_nothing(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    w: World = request.getfixturevalue("world")  # test_bad_commands' inputs, imported above
    spec, out, err = run_case(CASES[name], w, tmp_path, monkeypatch, capsys)
    assert spec.stdout in out, out
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and spec.needle in lines[0], err


# ---- speedup's notes and defaults --------------------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "targets"


def _speedup_json(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_speedup_says_when_acceptance_was_measured_on_another_family(tmp_path: Path, capsys) -> None:
    report = {"target": "tiny-mimo", "target_family": "mimo", "results": [{"acceptance_per_position": [0.8, 0.6]}]}
    (tmp_path / "evaluation.json").write_text(json.dumps(report))
    argv = ["speedup", str(tmp_path / "evaluation.json"), "--gpu", "h200", "--tp", "8"]
    notes = _speedup_json([*argv, "--target", DS3], capsys)["notes"]
    assert any("measured on a mimo target" in n and "deepseek_v3 config" in n for n in notes), notes
    same = _speedup_json([*argv, "--target", str(EXAMPLES / "tiny-mimo")], capsys)["notes"]
    assert not any("measured on a" in n for n in same), same


@pytest.mark.parametrize("target", sorted(p.name for p in EXAMPLES.iterdir() if (p / "config.json").is_file()))
def test_speedup_default_context_fits_every_bundled_target(target: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "evaluation.json").write_text('{"results": [{"acceptance_per_position": [0.8, 0.6]}]}')
    config = json.loads((EXAMPLES / target / "config.json").read_text())
    argv = ["speedup", str(tmp_path / "evaluation.json"), "--target", str(EXAMPLES / target), "--gpu", "h200"]
    out = _speedup_json(argv, capsys)
    assert out["context"] == min(4096, config["max_position_embeddings"])


# ---- redaction by value: a token inside a path the user named is never written or printed -----------------------------
def test_a_token_in_a_source_path_is_never_written_or_printed(target, tmp_path: Path, monkeypatch, capsys) -> None:
    import shutil

    secret = "s3cr3tNotShapedLikeAToken"  # redacted because it is the token, not because of its shape
    monkeypatch.setenv("HF_TOKEN", secret)
    source = tmp_path / f"models-{secret}"
    shutil.copytree(target("deepseek_v3", num_hidden_layers=6), source)
    draft, export = tmp_path / f"draft-{secret}", tmp_path / "export"
    capsys.readouterr()
    assert main(["convert", str(source), "--out", str(draft), "--dtype", "float32"]) == 0
    assert main(["export", str(draft), "--format", "stitched", "--target", str(source), "--out", str(export)]) == 0
    assert main(["inspect", str(source), "--json"]) == 0
    out, err = capsys.readouterr()
    assert secret not in out and secret not in err and "***" in err, err
    for root in (draft, export):
        for file in root.rglob("*"):
            if file.is_file():
                assert secret.encode() not in file.read_bytes(), file
    readme = (export / "README.md").read_text()
    assert "models-***" in readme and "## Serve" in readme


def test_a_chain_is_offered_only_the_launch_lines_of_engines_that_run_a_chain(tmp_path: Path) -> None:
    """MiMo: SGLang 0.5.23 serves one MTP layer (`step_layers = "neither"` in its spec), vLLM runs layer 0 at every
    step: the card of a three-layer stitched export and the export's README offer vLLM's line, not SGLang's."""
    from mtp2draft.family.spec import get_spec
    from mtp2draft.formats.serving import launch_lines
    from mtp2draft.hub.card import model_card

    spec = get_spec("mimo")
    assert set(launch_lines("stitched", "org/mimo", "me/d", 3, spec, layers=3)) == {"overlay", "vLLM"}
    assert {"vLLM", "SGLang"} <= set(launch_lines("stitched", "org/mimo", "me/d", 3, spec, layers=1))
    src, chain = _chain(tmp_path)
    export = tmp_path / "export"
    assert main(["export", str(chain), "--format", "stitched", "--target", str(src), "--out", str(export)]) == 0
    readme = (export / "README.md").read_text()
    assert "vllm serve" in readme and "sglang" not in readme.split("## Serve", 1)[1]
    card = str(model_card(export, "me/d"))
    serve = card.split("## Serve it", 1)[1].split("## Provenance", 1)[0]
    assert "vllm serve" in serve and "sglang.launch_server" not in serve
    assert "sglang 0.5.23 cannot serve a chain of 3 MTP layers" in serve


# ---- outputs are readable by the group as the umask allows ------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_are_as_readable_as_the_umask_allows(target, tmp_path: Path, umask: int) -> None:
    """A serving process run as another user of the group reads the draft: not the 0700 of a private temp dir."""
    old = os.umask(umask)
    try:
        out = tmp_path / "draft"
        assert main(["convert", str(target("deepseek_v3", num_hidden_layers=6)), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    for file in out.iterdir():
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file


# ---- races: the other command runs in the middle of this one (a patched reader runs it; no sleeps) -------------------
def _one_error(err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def test_evaluate_save_never_gives_its_figures_to_the_draft_that_replaced_it(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`convert --overwrite` puts a new draft at the evaluated directory after evaluate read the old one: the save is
    refused in one line and the new draft carries no evaluation.json (push and speedup would trust it)."""
    from mtp2draft.engines import choice

    w: World = request.getfixturevalue("world")
    draft = _own_draft(w, tmp_path)
    real = choice.evaluate_with

    def evaluate_then_replaced(*args, **kwargs):
        report = real(*args, **kwargs)  # the old draft measured
        argv = ["convert", str(w.ds), "--out", str(draft), "--overwrite", "--to", "eagle3"]
        assert main(argv) == 0
        return report

    monkeypatch.setattr(choice, "evaluate_with", evaluate_then_replaced)
    capsys.readouterr()
    assert main(_evaluate(w, "--save", "--max-prompts", "1", draft=draft)) == 2
    _one_error(capsys.readouterr().err, "was replaced by another draft while it was evaluated")
    assert "draft_vocab_size" in json.loads((draft / "config.json").read_text())  # the new (EAGLE-3) draft, whole
    assert not (draft / "evaluation.json").exists()
    assert not list(tmp_path.glob(".*lock")), list(tmp_path.iterdir())
    monkeypatch.setattr(choice, "evaluate_with", real)  # unraced, the same command saves
    assert main(_evaluate(w, "--save", "--max-prompts", "1", draft=draft)) == 0
    assert (draft / "evaluation.json").is_file()


def test_distill_never_mixes_records_of_two_dumps(request, tmp_path: Path, monkeypatch, capsys) -> None:
    """`dump-hidden --out D --overwrite` (other data) replaces D after distill read its first record: the next record
    read is refused in one line, nothing of the run is written, and the new dump is whole."""
    from mtp2draft.target.dumps import OfflineHiddenStates

    w: World = request.getfixturevalue("world")
    dump = _small_dump(w, tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": f"other text {i} " * 8}) + "\n" for i in range(6)))
    real, reads = OfflineHiddenStates.sequence, []

    def sequence_then_replaced(self, n):
        record = real(self, n)
        reads.append(n)
        if len(reads) == 1:
            argv = ["dump-hidden", "--target", str(w.ds), "--data", str(other), "--out", str(dump)]
            assert main([*argv, "--max-length", "32", "--shard-size", "4", "--overwrite"]) == 0
        return record

    monkeypatch.setattr(OfflineHiddenStates, "sequence", sequence_then_replaced)
    argv = ["distill", str(w.ds_mtp), "--hidden-states", str(dump), "--out", str(tmp_path / "out")]
    capsys.readouterr()
    assert main([*argv, "--steps", "2", "--batch-size", "2", "--max-length", "32", "--device", "cpu"]) == 2
    _one_error(capsys.readouterr().err, f"the dump {dump} was replaced while this run read it")
    assert len(reads) == 1 and not (tmp_path / "out").exists()
    assert not (tmp_path / "out.checkpoints").exists()
    assert json.loads((dump / "manifest.json").read_text())["num_sequences"] == 6


def test_a_chat_the_template_cannot_render_is_skipped_and_counted(request, tmp_path: Path) -> None:
    """With --skip-bad, each chat the template refuses is one skipped line; the others are kept, in order."""
    from mtp2draft.data import load_tokenizer, read_examples

    w: World = request.getfixturevalue("world")
    tokenizer = load_tokenizer(_strict_target(w, tmp_path, NO_TOOL))
    good = _chat(HI, ANSWER)
    data = _records(tmp_path, "d.jsonl", good, TOOL_TURN, BOOM, good, _chat(("system", "x")))
    examples, skipped = read_examples(data, tokenizer, 64, skip_bad=True)
    assert skipped == 3 and len(examples) == 2 and [e.record for e in examples] == [good, good]


# ---- a real full filesystem: a tmpfs of a few KiB, mounted in a private mount namespace (no root needed) -------------
def _private_tmpfs_works() -> bool:
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _on_a_small_filesystem(mount: Path, size: str, argv: list[str]) -> tuple[int, str, list[str]]:
    """Run `mtp2draft argv` with a `size` tmpfs mounted at `mount`, seen by that process only (`unshare -rm`: a user
    and mount namespace of its own, so nothing any other process uses fills up): (exit code, stderr, what was left
    on the filesystem afterwards)."""
    import subprocess
    import sys

    mount.mkdir()
    script = (
        'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; shift 2; "$@"; rc=$?; find "$MNT" -mindepth 1; exit $rc'
    )
    env = {**os.environ, "MNT": str(mount), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", size, str(mount), sys.executable, "-m", "mtp2draft", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 99, done.stderr
    return done.returncode, done.stderr, done.stdout.split()


@pytest.mark.skipif(not _private_tmpfs_works(), reason="no unprivileged user + mount namespaces here")
def test_a_real_full_filesystem_leaves_one_line_and_nothing_half_written(request, tmp_path: Path) -> None:
    """The ENOSPC rows above patch the writer; here the filesystem is really full. convert into 128 KiB (the draft
    is ~320 KiB), and distill into 1 MiB (its draft fits, a checkpoint with the optimizer's state does not): each is
    one `error:` line naming what did not fit, exit 1, no traceback, and the filesystem is left empty."""
    w: World = request.getfixturevalue("world")
    code, err, left = _on_a_small_filesystem(
        tmp_path / "small",
        "128k",
        ["convert", str(w.ds), "--out", str(tmp_path / "small" / "draft"), "--dtype", "float32"],
    )
    _one_error(err, "No space left on device")
    assert code == 1 and left == [], (code, left)
    argv = _distill(w, tmp_path, "--save-every", "1")
    argv[argv.index("--out") + 1] = str(tmp_path / "fs" / "out")
    code, err, left = _on_a_small_filesystem(tmp_path / "fs", "1m", argv)
    _one_error(err, "No space left on device: ")
    assert "step-0000001" in err, err  # the checkpoint that did not fit
    assert code == 1 and left == [], (code, left)
