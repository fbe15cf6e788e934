"""Hostile and careless use of every command, in the style of `test_bad_inputs.py`: each case fails with its exit code
and exactly one `error:` line naming the problem (or typer's short usage message), no traceback, nothing new on disk
and nothing lost.

Two parts: the draft config matrix (every field of the native, EAGLE-3 and speculators layouts, each bad value
through `validate`, and a sample through every command that reads a draft: export, evaluate, distill, push,
dump-hidden --draft), and per-command cases aimed at each option's extremes, devices, target identity, output rules
and `run`'s checks before any work. `test_every_command_is_covered` counts cases per command.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from case_tables import COMMANDS
from disk import snapshot
from safetensors.torch import load_file, save_file

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.formats.export import export
from mtp2draft.manifest import mark
from mtp2draft.outputs.claims import claim_output


@dataclass
class World:
    """Inputs shared by every case (never modified: each test checks that)."""

    root: Path
    ds: Path  # runnable DeepSeek-V3-layout target, 6 layers
    mimo: Path  # runnable MiMo target
    ds_mtp: Path  # native draft of ds (fp32)
    ds_e3: Path  # EAGLE-3 draft of ds
    mimo_mtp: Path  # native draft of mimo
    spec_export: Path  # speculators export of ds_e3
    data: Path


@pytest.fixture(scope="module")
def world(target, text_data, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("cmd-world")
    ds, mimo = target("deepseek_v3", num_hidden_layers=6), target("mimo")
    convert(str(ds), root / "ds-mtp", dtype="float32")
    convert(str(ds), root / "ds-e3", to="eagle3")
    convert(str(mimo), root / "mimo-mtp")
    export(root / "ds-e3", "speculators", root / "ds-e3-speculators")
    return World(
        root, ds, mimo, root / "ds-mtp", root / "ds-e3", root / "mimo-mtp", root / "ds-e3-speculators", text_data
    )


@dataclass
class Case:
    argv: list[str]
    needle: str  # what the one line must say
    usage: bool = False  # typer's short usage message rather than an "error:" line
    code: int = 2


CaseFn = Callable[[World, Path, pytest.MonkeyPatch, contextlib.ExitStack], Case]
CASES: dict[str, CaseFn] = {}


def case(fn: CaseFn) -> CaseFn:
    CASES[fn.__name__] = fn
    return fn


# ---- helpers ------------------------------------------------------------------------------------------------------
def _copy(src: Path, tmp: Path, name: str) -> Path:
    dest = tmp / name
    shutil.copytree(src, dest)
    return dest


def _set(cfg: dict, dotted: str, value: Any) -> None:
    """Set (or, with value DELETE, remove) a possibly nested field 'a.b.c' of a config dict."""
    *parents, last = dotted.split(".")
    for p in parents:
        cfg = cfg[p]
    if value is DELETE:
        del cfg[last]
    else:
        cfg[last] = value


DELETE = object()


def _edited(src: Path, tmp: Path, field: str, value: Any, name: str = "draft") -> Path:
    """A copy of draft (or target) `src` whose config.json has `field` set to `value`."""
    dest = _copy(src, tmp, name)
    cfg = json.loads((dest / "config.json").read_text())
    _set(cfg, field, value)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _distill(w: World, tmp: Path, *extra: str, draft: Path | None = None, target: Path | None = None) -> list[str]:
    return [
        "distill", str(draft or w.ds_mtp), "--target", str(target or w.ds), "--data", str(w.data),
        "--out", str(tmp / "out"), "--steps", "2", "--batch-size", "2", "--max-length", "32", "--device", "cpu", *extra,
    ]  # fmt: skip


def _evaluate(w: World, *extra: str, draft: Path | None = None, target: Path | None = None) -> list[str]:
    return ["evaluate", str(draft or w.ds_mtp), "--target", str(target or w.ds), "--data", str(w.data), *extra]


def _export(draft: Path, tmp: Path, fmt: str, *extra: str) -> list[str]:
    return ["export", str(draft), "--format", fmt, "--out", str(tmp / "out"), *extra]


def _run(w: World, tmp: Path, *extra: str, source: Path | None = None) -> list[str]:
    return [
        "run", str(source or w.ds), "--data", str(w.data), "--work", str(tmp / "work"), "--steps", "2",
        "--batch-size", "2", "--max-length", "32", "--max-prompts", "2", "--max-new-tokens", "4", *extra,
    ]  # fmt: skip


def _dump(w: World, tmp: Path, *extra: str) -> list[str]:
    return ["dump-hidden", "--target", str(w.ds), "--data", str(w.data), "--out", str(tmp / "out"), *extra]


def _claimed_elsewhere(out: Path, stack: contextlib.ExitStack) -> None:
    """Hold the claim on `out` from another thread (another run, as far as the command can tell) until the case
    ends."""
    held, release = threading.Event(), threading.Event()

    def other_run() -> None:
        with claim_output(out):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=other_run)
    thread.start()
    held.wait(10)
    stack.callback(thread.join)
    stack.callback(release.set)


def _add(name: str, fn: CaseFn) -> None:
    assert name not in CASES, name
    CASES[name] = fn


# ---- the draft config matrix ----------------------------------------------------------------------------------------
# (field, bad value, what the line must name); each through `validate`.
NATIVE_BAD: list[tuple[str, Any, str]] = [
    ("draft_kind", "medusa", "cannot tell the format"),
    ("format_version", 3, "format_version is 3"),
    ("format_version", "1", "format_version"),
    ("format_version", 2, "format_version 2 needs mtp_layers"),  # a chain draft (draft/chain.py) without its layers
    ("mtp_layers", [0], "need format_version 2"),
    ("num_layers", 1, "need format_version 2"),
    ("mtp_layers", "all", 'mtp_layers is "all" (a string)'),
    ("step_layers", "sideways", 'step_layers is "sideways"'),
    ("architectures", "Mtp2DraftNativeMtp", "architectures"),
    ("spec", "llama-9000", 'spec is "llama-9000"'),
    ("spec", 3, "spec is 3"),
    ("spec", DELETE, "spec is missing"),
    ("mtp_layer", -1, "mtp_layer is -1"),
    ("mtp_layer", "0", "mtp_layer"),
    ("mtp_layer", True, "mtp_layer"),
    ("mtp_layer", 1, "mtp_layer is 1, the target has 1 MTP layer"),
    ("hidden_handover", "sideways", 'hidden_handover is "sideways"'),
    ("hidden_handover", None, "hidden_handover"),
    ("input_hidden", "sideways", "input_hidden"),
    ("final_norm", "yes", "final_norm"),
    ("final_norm", 1, "final_norm"),
    ("engine", {"name": "trt"}, "engine"),
    ("engine", "vllm", "engine"),
    ("hidden_size", "256", 'hidden_size is "256" (a string)'),
    ("hidden_size", 256.5, "hidden_size is 256.5"),
    ("hidden_size", -1, "hidden_size is -1"),
    ("hidden_size", 0, "hidden_size is 0"),
    ("hidden_size", True, "hidden_size is true"),
    ("hidden_size", 128, "hidden_size is 128, its target_config says"),
    ("vocab_size", -1, "vocab_size is -1"),
    ("vocab_size", "4096", "vocab_size"),
    ("target_config", [1], "target_config is [1] (a list)"),
    ("target_config", DELETE, "target_config is missing"),
    ("target_config.hidden_size", "64", "target_config.hidden_size"),
    ("target_config.vocab_size", -1, "target_config.vocab_size"),
    ("target_config.rms_norm_eps", 0, "target_config.rms_norm_eps"),
    ("target_config.rope_theta", -1.0, "target_config.rope_theta"),
    ("target_config.num_attention_heads", 0, "target_config.num_attention_heads"),
    ("target_config.qk_rope_head_dim", 1.5, "target_config.qk_rope_head_dim"),
    ("target_config.n_routed_experts", -4, "target_config.n_routed_experts"),
    ("target_config.max_position_embeddings", "2048", "target_config.max_position_embeddings"),
    ("mtp2draft", [1], "mtp2draft is [1] (a list)"),
]
EAGLE3_BAD: list[tuple[str, Any, str]] = [
    ("hidden_size", "64", "hidden_size"),
    ("intermediate_size", 0, "intermediate_size"),
    ("num_attention_heads", -1, "num_attention_heads"),
    ("num_key_value_heads", 1.5, "num_key_value_heads"),
    ("head_dim", "x", "head_dim"),
    ("num_hidden_layers", 0, "num_hidden_layers"),
    ("max_position_embeddings", -1, "max_position_embeddings"),
    ("vocab_size", True, "vocab_size"),
    ("rms_norm_eps", 0, "rms_norm_eps"),
    ("rope_theta", "1e4", "rope_theta"),
    ("rope_theta", float("inf"), "rope_theta"),
    ("rope_scaling", "linear", "rope_scaling"),
    ("hidden_act", "gelu", 'hidden_act is "gelu"'),
    ("tie_word_embeddings", "no", "tie_word_embeddings"),
    ("torch_dtype", "int8", "torch_dtype"),
    ("bos_token_id", -1, "bos_token_id"),
    ("eos_token_id", "x", "eos_token_id"),
    ("pad_token_id", 1.5, "pad_token_id"),
    ("architectures", "LlamaForCausalLMEagle3", "architectures"),
    ("draft_vocab_size", 0, "draft_vocab_size"),
    ("draft_vocab_size", 10**6, "draft_vocab_size 1000000 exceeds"),
    ("target_hidden_size", -5, "target_hidden_size"),
    ("eagle_aux_hidden_state_layer_ids", [1, 2], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [2, 2, 3], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", ["a", "b", "c"], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [0, 1, 2], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_config", [1], "eagle_config is [1] (a list)"),
    ("eagle_config.eagle_aux_hidden_state_layer_ids", [-1, 2, 3], "eagle_config.eagle_aux_hidden_state_layer_ids"),
    ("eagle_config.use_aux_hidden_state", "yes", "eagle_config.use_aux_hidden_state"),
    ("mtp2draft", "x", "mtp2draft is"),
    ("mtp2draft.spec", "nope", "mtp2draft.spec"),
    ("mtp2draft.target_num_layers", 0, "mtp2draft.target_num_layers"),
    ("mtp2draft.mtp_layer", -1, "mtp2draft.mtp_layer"),
    ("mtp2draft.target_config", [1], "mtp2draft.target_config"),
    ("mtp2draft.target_config.hidden_size", "x", "mtp2draft.target_config.hidden_size"),
]
SPECULATORS_BAD: list[tuple[str, Any, str]] = [
    ("draft_vocab_size", -1, "draft_vocab_size"),
    ("target_hidden_size", "x", "target_hidden_size"),
    ("eagle_aux_hidden_state_layer_ids", [1], "eagle_aux_hidden_state_layer_ids"),
    ("transformer_layer_config", [1], "transformer_layer_config is [1] (a list)"),
    ("transformer_layer_config", DELETE, "1 violation(s) of the speculators format"),  # a format rule
    ("transformer_layer_config.hidden_size", "x", "transformer_layer_config.hidden_size"),
    ("transformer_layer_config.rms_norm_eps", -1, "transformer_layer_config.rms_norm_eps"),
    ("transformer_layer_config.vocab_size", 0, "transformer_layer_config.vocab_size"),
    ("transformer_layer_config.hidden_act", "relu", "transformer_layer_config.hidden_act"),
    ("norm_before_fc", "no", "norm_before_fc"),
    ("norm_output", 0, "norm_output"),
    ("torch_dtype", "x", "torch_dtype"),
    ("speculators_config", [1], "speculators_config"),
]


def _slug(value: Any) -> str:
    text = "deleted" if value is DELETE else json.dumps(value)
    return "".join(c if c.isalnum() else "_" for c in text)[:24]


def _matrix() -> None:
    layouts = (("native", "ds_mtp", NATIVE_BAD), ("eagle3", "ds_e3", EAGLE3_BAD))
    for layout, attr, rows in (*layouts, ("speculators", "spec_export", SPECULATORS_BAD)):
        for field, value, needle in rows:

            def fn(w, tmp, mp, stack, attr=attr, field=field, value=value, needle=needle):
                return Case(["validate", str(_edited(getattr(w, attr), tmp, field, value))], needle)

            _add(f"validate_{layout}_{field.replace('.', '_')}_{_slug(value)}", fn)

    # every command that reads a draft refuses the same fields, before it reads anything else
    def sample(layout: str, field: str, value: Any, needle: str) -> dict[str, Callable]:
        draft_of = {"native": "ds_mtp", "eagle3": "ds_e3"}[layout]
        fmt = "stitched" if layout == "native" else "sglang"

        def edited(w, tmp):
            return _edited(getattr(w, draft_of), tmp, field, value)

        return {
            "export": lambda w, tmp, mp, stack: Case(_export(edited(w, tmp), tmp, fmt, "--target", str(w.ds)), needle),
            "evaluate": lambda w, tmp, mp, stack: Case(_evaluate(w, draft=edited(w, tmp)), needle),
            "distill": lambda w, tmp, mp, stack: Case(_distill(w, tmp, draft=edited(w, tmp)), needle),
            "push": lambda w, tmp, mp, stack: Case(["push", str(edited(w, tmp)), "--repo-id", "me/draft"], needle),
            "dump_hidden": lambda w, tmp, mp, stack: Case(_dump(w, tmp, "--draft", str(edited(w, tmp))), needle),
        }

    for layout, field, value, needle in (
        ("native", "hidden_size", "256", 'hidden_size is "256"'),
        ("native", "hidden_size", 256.5, "hidden_size is 256.5"),
        ("native", "vocab_size", -1, "vocab_size is -1"),
        ("native", "hidden_handover", "sideways", 'hidden_handover is "sideways"'),
        ("eagle3", "hidden_act", "gelu", "hidden_act"),
        ("eagle3", "draft_vocab_size", 0, "draft_vocab_size"),
    ):
        for command, fn in sample(layout, field, value, needle).items():
            _add(f"{command}_{layout}_draft_{field}_{_slug(value)}", fn)


_matrix()


# ---- inspect ------------------------------------------------------------------------------------------------------
@case
def inspect_missing_directory(w, tmp, mp, stack):
    return Case(["inspect", str(tmp / "nope")], "does not exist")


@case
def inspect_revision_of_a_local_directory(w, tmp, mp, stack):
    return Case(["inspect", str(w.ds), "--revision", "main"], "local")


@case
def inspect_config_not_utf8(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp, "ck")
    (ck / "config.json").write_bytes("{}".encode("utf-16"))
    return Case(["inspect", str(ck)], "config.json")


@case
def inspect_source_is_a_file(w, tmp, mp, stack):
    (tmp / "model.safetensors").write_bytes(b"x")
    return Case(["inspect", str(tmp / "model.safetensors")], "is a file")


# ---- convert ------------------------------------------------------------------------------------------------------
def _convert(w: World, tmp: Path, *extra: str) -> list[str]:
    return ["convert", str(w.ds), "--out", str(tmp / "out"), *extra]


@case
def convert_layer_negative(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--layer", "-1"), "--layer -1 is out of range")


@case
def convert_aux_layers_for_a_native_draft(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--aux-layers", "1,2,3"), "--aux-layers applies to --to eagle3")


@case
def convert_aux_layers_two_ids(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--to", "eagle3", "--aux-layers", "1,2"), "aux layer ids must be three")


@case
def convert_aux_layers_repeated(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--to", "eagle3", "--aux-layers", "1,1,2"), "aux layer ids must be three distinct")


@case
def convert_aux_layers_negative(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--to", "eagle3", "--aux-layers", "-1,2,3"), "aux layer ids must be")


@case
def convert_dtype_float64(w, tmp, mp, stack):
    return Case(_convert(w, tmp, "--dtype", "float64"), "--dtype must be one of")


@case
def convert_into_an_out_another_run_is_writing(w, tmp, mp, stack):
    _claimed_elsewhere(tmp / "out", stack)
    return Case(_convert(w, tmp), "is being written by another mtp2draft run")


@case
def convert_out_inside_the_source(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp, "ck")
    return Case(["convert", str(ck), "--out", str(ck / "draft")], "lies inside the input")


# ---- distill ------------------------------------------------------------------------------------------------------
for _name, _args, _needle in (
    ("steps_negative", ("--steps", "-1"), "--steps must be a whole number >= 0"),
    ("batch_size_negative", ("--batch-size", "-1"), "--batch-size must be"),
    ("ttt_steps_negative", ("--ttt-steps", "-1"), "--ttt-steps must be"),
    ("lr_zero", ("--lr", "0"), "--lr must be a finite number > 0"),
    ("lr_inf", ("--lr", "inf"), "--lr must be a finite number > 0"),
    ("lr_negative_fraction", ("--lr", "-0.5"), "--lr must be a finite number > 0"),
    ("max_length_zero", ("--max-length", "0"), "--max-length must be"),
    ("max_length_negative", ("--max-length", "-8"), "--max-length must be"),
    ("save_every_negative", ("--save-every", "-1"), "--save-every must be"),
    ("draft_vocab_size_negative", ("--draft-vocab-size", "-1"), "--draft-vocab-size must be"),
    ("step_weights_negative", ("--step-weights", "1,-1,1"), "--step-weights must be finite, >= 0"),
    ("step_weights_nan", ("--step-weights", "1,nan,1"), "--step-weights must be finite"),
    ("step_weights_all_zero", ("--step-weights", "0,0,0"), "not all zero"),
    ("teacher_temperature_zero", ("--teacher-temperature", "0"), "--teacher-temperature must be a finite number > 0"),
    ("teacher_temperature_nan", ("--teacher-temperature", "nan"), "--teacher-temperature must be a finite number > 0"),
    ("device_cuda_7", ("--device", "cuda:7"), "--device cuda:7"),
    ("device_cuda", ("--device", "cuda"), "--device cuda"),
    ("device_foo", ("--device", "foo"), "--device 'foo': not a device torch knows"),
    ("device_mps", ("--device", "mps"), "--device mps"),
    ("device_meta", ("--device", "meta"), "--device meta"),
    ("precision_fp16", ("--precision", "fp16"), "--precision must be one of"),
    ("train_subset_bogus", ("--train-subset", "bogus"), "--train-subset must be one of"),
    ("serving_engine_bogus", ("--serving-engine", "trt"), "--serving-engine must be one of"),
    ("hidden_handover_sideways", ("--hidden-handover", "sideways"), "--hidden-handover must be"),
    ("draft_vocab_size_for_a_native_draft", ("--draft-vocab-size", "100"), "applies to eagle3 drafts"),
    ("plan_world_size_zero", ("--plan", "--world-size", "0"), "--world-size must be a whole number >= 1"),
    ("plan_world_size_negative", ("--plan", "--world-size", "-2"), "--world-size must be a whole number >= 1"),
    ("patience_zero", ("--patience", "0"), "--patience must be a whole number >= 1"),
    ("patience_without_heldout", ("--patience", "2"), "--patience stops on held-out acceptance: it needs --heldout"),
    ("eval_every_zero", ("--eval-every", "0"), "--eval-every must be a whole number >= 1"),
    ("heldout_examples_zero", ("--heldout-examples", "0"), "--heldout-examples must be a whole number >= 1"),
    ("heldout_missing", ("--heldout", "/nonexistent/heldout.jsonl"), "/nonexistent/heldout.jsonl"),
):
    _add(f"distill_{_name}", lambda w, tmp, mp, stack, a=_args, n=_needle: Case(_distill(w, tmp, *a), n))


@case
def distill_heldout_smaller_than_a_batch(w, tmp, mp, stack):
    small = tmp / "heldout.jsonl"
    small.write_text(json.dumps({"text": "def held_out(x):\n    return x * 2\n"}) + "\n")
    return Case(_distill(w, tmp, "--heldout", str(small)), "fewer than one batch of --batch-size 2")


@case
def distill_heldout_malformed(w, tmp, mp, stack):
    bad = tmp / "heldout.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    return Case(_distill(w, tmp, "--heldout", str(bad)), "heldout.jsonl")


@case
def distill_hidden_handover_for_eagle3(w, tmp, mp, stack):
    argv = _distill(w, tmp, "--hidden-handover", "pre_norm", draft=w.ds_e3)
    return Case(argv, "--hidden-handover applies to native MTP drafts")


@case
def distill_draft_vocab_beyond_the_target(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--draft-vocab-size", "999999", draft=w.ds_e3), "exceeds the target vocabulary")


@case
def distill_into_an_out_another_run_is_writing(w, tmp, mp, stack):
    _claimed_elsewhere(tmp / "out", stack)
    return Case(_distill(w, tmp), "is being written by another mtp2draft run")


@case
def distill_out_is_the_target(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp, "ck")
    argv = _distill(w, tmp, target=ck)
    argv[argv.index("--out") + 1] = str(ck)
    return Case([*argv, "--overwrite"], "is the input")


def _sibling_is_a_draft(*flags: str) -> CaseFn:
    """A draft written at the checkpoint sibling (`convert --out out.checkpoints`) is the user's: distill neither fills
    it with checkpoints nor deletes it when it finishes, whatever the flags."""

    def make(w, tmp, mp, stack):
        _copy(w.ds_mtp, tmp, "out.checkpoints")
        return Case(_distill(w, tmp, *flags), "is not a checkpoint folder")

    return make


for _flags in ((), ("--overwrite",), ("--resume",)):
    _add(
        "distill_checkpoint_sibling_is_a_draft" + "".join("_" + f.strip("-") for f in _flags),
        _sibling_is_a_draft(*_flags),
    )


@case
def distill_checkpoints_another_run_is_writing(w, tmp, mp, stack):
    _claimed_elsewhere(tmp / "out.checkpoints", stack)  # a `convert --out out.checkpoints` under way
    return Case(_distill(w, tmp), "is being written by another mtp2draft run")


@case
def distill_disk_full_while_writing_the_best_weights(w, tmp, mp, stack):
    """The run made the checkpoint folder and ends before its first checkpoint: nothing is left, no half file."""
    heldout = tmp / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": f"class C{i}:\n    y = {i}"}) + "\n" for i in range(2)))

    def full(path, *_a, **_k):
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device", str(path))

    mp.setattr("mtp2draft.train.heldout.save_tensors", full)
    return Case(_distill(w, tmp, "--heldout", str(heldout)), "No space left on device", code=1)


# ---- weights that would give silently wrong results: NaN, integer tensors (tensor_checks.py, every reader) ------------
def _poked(src: Path, tmp: Path, key: str, fn: Callable[[torch.Tensor], torch.Tensor], name: str = "draft") -> Path:
    """A copy of draft `src` whose tensor `key` is `fn` of itself."""
    dest = _copy(src, tmp, name)
    tensors = load_file(str(dest / "model.safetensors"))
    tensors[key] = fn(tensors[key]).contiguous()
    save_file(tensors, str(dest / "model.safetensors"), {"format": "pt"})
    return dest


def _one_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = float("nan")
    return t


def _int32(t: torch.Tensor) -> torch.Tensor:
    return (t.float() * 1000).to(torch.int32)  # the weights an integer tensor would load as: truncated


def _chain(tmp: Path) -> tuple[Path, Path]:
    """(runnable MiMo target with three MTP layers, its chain draft of every layer), built in the case's directory."""
    from support.fixtures import build_fixture, write_char_tokenizer

    src = build_fixture("mimo", tmp / "chain-target", num_nextn_predict_layers=3)
    write_char_tokenizer(src)
    convert(str(src), tmp / "chain", all_layers=True, dtype="float32")
    return src, tmp / "chain"


@case
def evaluate_draft_with_a_nan_weight(w, tmp, mp, stack):
    """Acceptance would read 1.000 and "lossless yes": NaN logits never disagree with the target's argmax."""
    draft = _poked(w.ds_mtp, tmp, "eh_proj.weight", _one_nan)
    return Case(_evaluate(w, draft=draft), "draft/model.safetensors: eh_proj.weight holds non-finite values (1 NaN")


@case
def evaluate_baseline_with_a_nan_weight(w, tmp, mp, stack):
    baseline = _poked(w.ds_mtp, tmp, "enorm.weight", _one_nan, "baseline")
    return Case(_evaluate(w, "--baseline", str(baseline)), "baseline/model.safetensors: enorm.weight holds non-finite")


@case
def evaluate_chain_with_a_nan_in_its_last_layer(w, tmp, mp, stack):
    src, chain = _chain(tmp)
    draft = _poked(chain, tmp, "layers.2.eh_proj.weight", _one_nan)
    return Case(_evaluate(w, draft=draft, target=src), "layers.2.eh_proj.weight holds non-finite values (1 NaN")


@case
def evaluate_draft_with_an_int32_weight(w, tmp, mp, stack):
    draft = _poked(w.ds_mtp, tmp, "eh_proj.weight", _int32)
    return Case(_evaluate(w, draft=draft), "eh_proj.weight is int32: weights must be floating point")


@case
def distill_draft_with_an_int32_weight(w, tmp, mp, stack):
    draft = _poked(w.ds_mtp, tmp, "eh_proj.weight", _int32)
    return Case(_distill(w, tmp, draft=draft), "eh_proj.weight is int32: weights must be floating point")


@case
def validate_draft_with_an_int32_weight(w, tmp, mp, stack):
    return Case(["validate", str(_poked(w.ds_mtp, tmp, "eh_proj.weight", _int32))], "1 violation(s)")


@case
def push_draft_with_an_int32_weight(w, tmp, mp, stack):
    """Refused before any request (no Hub is reachable here): the README promises it."""
    return Case(["push", str(_poked(w.ds_mtp, tmp, "eh_proj.weight", _int32)), "--repo-id", "me/d"], "not a valid")


@case
def export_eagle3_with_an_int32_weight(w, tmp, mp, stack):
    draft = _poked(w.ds_e3, tmp, "fc.weight", _int32)
    return Case(_export(draft, tmp, "sglang"), "fc.weight is int32: weights must be floating point")


@case
def export_stitched_chain_with_an_int32_weight(w, tmp, mp, stack):
    src, chain = _chain(tmp)
    draft = _poked(chain, tmp, "layers.1.eh_proj.weight", _int32)
    return Case(_export(draft, tmp, "stitched", "--target", str(src)), "layers.1.eh_proj.weight is int32")


# ---- target identity: evaluate, distill, stitched / nextn export, validate, run -------------------------------------
IDENTITY = (
    ("rope_theta", 20000.0),
    ("rms_norm_eps", 1e-3),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
    ("qk_rope_head_dim", 32),
    ("num_hidden_layers", 7),
    ("routed_scaling_factor", 1.0),
    ("added_field", 1),
)
for _field, _value in IDENTITY:

    def _target(w, tmp, f=_field, v=_value):
        return _edited(w.ds, tmp, f, v, "other-target")

    # a RoPE setting is named in its one spelling (`target/rope_config.py`): the factor that differs, here 16 vs 2
    _needle = "rope.factor 16 (draft) vs 2.0 (target)" if _field == "rope_scaling" else f"{_field} "
    _add(f"evaluate_target_differs_in_{_field}", lambda w, tmp, mp, s, t=_target, n=_needle: Case(
        _evaluate(w, target=t(w, tmp)), n))  # fmt: skip
    _add(f"distill_target_differs_in_{_field}", lambda w, tmp, mp, s, t=_target, n=_needle: Case(
        _distill(w, tmp, target=t(w, tmp)), n))  # fmt: skip
    _add(f"export_stitched_target_differs_in_{_field}", lambda w, tmp, mp, s, t=_target, n=_needle: Case(
        _export(w.ds_mtp, tmp, "stitched", "--target", str(t(w, tmp))), n))  # fmt: skip


@case
def evaluate_eagle3_target_differs_in_rope_theta(w, tmp, mp, stack):
    return Case(_evaluate(w, draft=w.ds_e3, target=_edited(w.ds, tmp, "rope_theta", 5.0, "t")), "rope_theta ")


@case
def export_nextn_target_differs_in_rms_norm_eps(w, tmp, mp, stack):
    target = _edited(w.ds, tmp, "rms_norm_eps", 0.5, "t")
    return Case(_export(w.ds_mtp, tmp, "nextn", "--target", str(target)), "rms_norm_eps ")


@case
def validate_against_a_target_that_differs(w, tmp, mp, stack):
    target = _edited(w.ds, tmp, "rope_theta", 5.0, "t")
    return Case(["validate", str(w.ds_mtp), "--target", str(target)], "1 violation(s)")


@case
def evaluate_baseline_of_another_family(w, tmp, mp, stack):
    return Case(_evaluate(w, "--baseline", str(w.mimo_mtp)), "was made for a mimo target")


@case
def evaluate_target_of_another_family(w, tmp, mp, stack):
    return Case(_evaluate(w, target=w.mimo), "was made for a deepseek_v3 target")


# ---- evaluate options -----------------------------------------------------------------------------------------------
for _name, _args, _needle in (
    ("k_negative", ("-k", "-1"), "--num-draft-tokens must be at least 1"),
    ("max_new_tokens_negative", ("--max-new-tokens", "-1"), "--max-new-tokens must be at least 1"),
    ("max_prompts_zero", ("--max-prompts", "0"), "--max-prompts must be at least 1"),
    ("max_prompts_negative", ("--max-prompts", "-3"), "--max-prompts must be at least 1"),
    ("max_prompt_length_zero", ("--max-prompt-length", "0"), "--max-prompt-length must be at least 1"),
    ("max_prompt_length_negative", ("--max-prompt-length", "-1"), "--max-prompt-length must be at least 1"),
):
    _add(f"evaluate_{_name}", lambda w, tmp, mp, stack, a=_args, n=_needle: Case(_evaluate(w, *a), n))


# ---- evaluate --engine: what runs the target -------------------------------------------------------------------------
for _name, _args, _needle in (
    ("engine_unknown", ("--engine", "tgi"), "--engine must be one of transformers, vllm"),
    (
        "tensor_parallel_with_transformers",
        ("--tensor-parallel-size", "2"),
        "--tensor-parallel-size is for --engine vllm",
    ),
    ("vllm_tensor_parallel_zero", ("--engine", "vllm", "--tensor-parallel-size", "0"), "must be at least 1, got 0"),
    ("vllm_with_device", ("--engine", "vllm", "--device", "cpu"), "--device is for --engine transformers"),
    ("vllm_with_device_map", ("--engine", "vllm", "--device-map", "auto"), "--device-map is for --engine transformers"),
    ("vllm_dtype_unknown", ("--engine", "vllm", "--dtype", "int8"), "--dtype must be one of"),
):
    _add(f"evaluate_{_name}", lambda w, tmp, mp, stack, a=_args, n=_needle: Case(_evaluate(w, *a), n))


@case
def evaluate_vllm_without_its_venv(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_VLLM_VENV", str(tmp / "no-venv"))
    return Case(_evaluate(w, "--engine", "vllm"), "create it with `mtp2draft engine install vllm`")


@case
def evaluate_vllm_kind_the_family_table_refuses(w, tmp, mp, stack):
    from support.fixtures import build_fixture, write_char_tokenizer

    mimo = build_fixture("mimo", tmp / "mimo", num_hidden_layers=6)  # deep enough for three aux layers
    write_char_tokenizer(mimo)
    convert(str(mimo), tmp / "mimo-e3", to="eagle3")  # vLLM's MiMo class captures no aux hidden states
    argv = _evaluate(w, "--engine", "vllm", draft=tmp / "mimo-e3", target=mimo)
    return Case(argv, "serves no eagle3 draft for mimo")


# ---- export / validate options --------------------------------------------------------------------------------------
@case
def export_speculative_tokens_negative(w, tmp, mp, stack):
    return Case(_export(w.ds_e3, tmp, "speculators", "--speculative-tokens", "-3"), "--speculative-tokens must be")


@case
def export_format_mtp_is_not_written(w, tmp, mp, stack):
    return Case(_export(w.ds_mtp, tmp, "mtp"), "--format must be one of")


@case
def export_stitched_without_target(w, tmp, mp, stack):
    return Case(_export(w.ds_mtp, tmp, "stitched"), "needs --target")


@case
def export_kind_clash(w, tmp, mp, stack):
    return Case(_export(w.ds_mtp, tmp, "sglang"), "takes an EAGLE-3 draft")


@case
def export_into_an_out_another_run_is_writing(w, tmp, mp, stack):
    _claimed_elsewhere(tmp / "out", stack)
    return Case(_export(w.ds_e3, tmp, "sglang"), "is being written by another mtp2draft run")


@case
def validate_unknown_format(w, tmp, mp, stack):
    return Case(["validate", str(w.ds_e3), "--format", "onnx"], "--format must be one of")


@case
def validate_config_is_a_list(w, tmp, mp, stack):
    d = _copy(w.ds_mtp, tmp, "draft")
    (d / "config.json").write_text("[1, 2]")
    return Case(["validate", str(d)], "config.json")


# ---- push ------------------------------------------------------------------------------------------------------------
@case
def push_readme_utf16(w, tmp, mp, stack):
    d = _copy(w.spec_export, tmp, "export")
    (d / "README.md").write_bytes("# notes\n".encode("utf-16"))
    mp.setenv("HF_TOKEN", "hf_" + "x" * 34)
    return Case(["push", str(d), "--repo-id", "me/draft"], "README.md is UTF-16")


@case
def push_readme_latin1(w, tmp, mp, stack):
    d = _copy(w.spec_export, tmp, "export")
    (d / "README.md").write_bytes("caf\xe9\n".encode("latin-1"))
    mp.setenv("HF_TOKEN", "hf_" + "x" * 34)
    return Case(["push", str(d), "--repo-id", "me/draft"], "README.md is not UTF-8")


@case
def push_directory_without_config(w, tmp, mp, stack):
    (tmp / "empty").mkdir()
    return Case(["push", str(tmp / "empty"), "--repo-id", "me/draft"], "has no config.json")


# ---- run: everything checked before the first byte is fetched ---------------------------------------------------------
for _name, _args, _needle in (
    ("format_kind_clash_mtp_sglang", ("--to", "mtp", "--format", "sglang"), "--format sglang takes an EAGLE-3 draft"),
    ("format_kind_clash_eagle3_nextn", ("--to", "eagle3", "--format", "nextn"), "--format nextn takes a native MTP"),
    ("unknown_kind", ("--to", "medusa"), "--to must be one of"),
    ("unknown_format", ("--format", "onnx"), "--format must be one of"),
    ("k_zero", ("-k", "0"), "--num-draft-tokens must be at least 1"),
    ("k_negative", ("-k", "-2"), "--num-draft-tokens must be at least 1"),
    ("max_new_tokens_zero", ("--max-new-tokens", "0"), "--max-new-tokens must be at least 1"),
    ("max_prompts_zero", ("--max-prompts", "0"), "--max-prompts must be at least 1"),
    ("steps_negative", ("--steps", "-1"), "--steps must be a whole number >= 0"),
    ("steps_zero_native", ("--to", "mtp", "--steps", "0"), "--steps 0 would write an untrained draft"),
    ("batch_size_zero", ("--batch-size", "0"), "--batch-size must be"),
    ("ttt_steps_zero", ("--ttt-steps", "0"), "--ttt-steps must be"),
    ("lr_negative", ("--lr", "-1"), "--lr must be a finite number"),
    ("max_length_one", ("--max-length", "1"), "--max-length must be"),
    ("draft_vocab_size_zero", ("--draft-vocab-size", "0"), "--draft-vocab-size must be"),
    ("draft_vocab_size_for_mtp", ("--to", "mtp", "--draft-vocab-size", "100"), "applies to eagle3 drafts"),
    ("draft_vocab_size_beyond_vocab", ("--to", "eagle3", "--draft-vocab-size", "999999"), "exceeds the target"),
    ("serving_engine_bogus", ("--serving-engine", "trt"), "--serving-engine must be one of"),
    ("layer_out_of_range", ("--layer", "5"), "--layer 5 is out of range"),
    ("layer_negative", ("--layer", "-1"), "--layer -1 is out of range"),
    ("push_not_a_repo_id", ("--push", "not a repo"), "is not a Hub repo id"),
):
    _add(f"run_{_name}", lambda w, tmp, mp, stack, a=_args, n=_needle: Case(_run(w, tmp, *a), n))


@case
def run_push_without_a_token(w, tmp, mp, stack):
    from huggingface_hub import constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        mp.delenv(var, raising=False)
    mp.setattr(constants, "HF_TOKEN_PATH", str(tmp / "no-token"))
    mp.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp / "no-tokens"))
    return Case(_run(w, tmp, "--push", "me/draft"), "no Hugging Face token")


@case
def run_target_differs_from_the_source(w, tmp, mp, stack):
    target = _edited(w.ds, tmp, "rope_theta", 5.0, "t")
    return Case(_run(w, tmp, "--target", str(target)), "is not the checkpoint")


@case
def run_target_of_another_family(w, tmp, mp, stack):
    return Case(_run(w, tmp, "--target", str(w.mimo)), "is not the checkpoint")


@case
def run_data_missing(w, tmp, mp, stack):
    argv = _run(w, tmp)
    argv[argv.index("--data") + 1] = str(tmp / "missing.jsonl")
    return Case(argv, "--data")


@case
def run_eval_data_missing(w, tmp, mp, stack):
    return Case(_run(w, tmp, "--eval-data", str(tmp / "missing.jsonl")), "--eval-data")


@case
def run_heldout_missing(w, tmp, mp, stack):
    return Case(_run(w, tmp, "--heldout", str(tmp / "missing.jsonl")), "--heldout")


@case
def run_patience_without_heldout(w, tmp, mp, stack):
    return Case(_run(w, tmp, "--patience", "2"), "it needs --heldout")


@case
def run_work_holds_the_heldout(w, tmp, mp, stack):
    """A work directory mtp2draft wrote, holding the user's held-out file: --overwrite would delete an input."""
    work = tmp / "work"
    work.mkdir()
    mark(work)
    shutil.copy(w.data, work / "pick.jsonl")
    return Case(_run(w, tmp, "--overwrite", "--heldout", str(work / "pick.jsonl")), "contains the input")


@case
def run_work_is_a_file(w, tmp, mp, stack):
    (tmp / "work").write_text("x")
    return Case(_run(w, tmp), "is a file")


@case
def run_work_holds_a_users_files(w, tmp, mp, stack):
    (tmp / "work").mkdir()
    (tmp / "work" / "notes.txt").write_text("mine")
    return Case(_run(w, tmp, "--overwrite"), "did not write")


@case
def run_work_is_the_source(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp, "ck")
    argv = _run(w, tmp, "--overwrite", source=ck)
    argv[argv.index("--work") + 1] = str(ck)
    return Case(argv, "is the input")


@case
def run_work_another_run_is_writing(w, tmp, mp, stack):
    _claimed_elsewhere(tmp / "work", stack)
    return Case(_run(w, tmp), "is being written by another mtp2draft run")


@case
def run_source_missing(w, tmp, mp, stack):
    return Case(_run(w, tmp, source=tmp / "nope"), "does not exist")


# ---- dump-hidden (its options outside the dump files) -------------------------------------------------------------
@case
def dump_hidden_draft_missing(w, tmp, mp, stack):
    return Case(_dump(w, tmp, "--draft", str(tmp / "nope")), "does not exist")


@case
def dump_hidden_data_missing(w, tmp, mp, stack):
    argv = _dump(w, tmp)
    argv[argv.index("--data") + 1] = str(tmp / "missing.jsonl")
    return Case(argv, "does not exist")


@case
def dump_hidden_max_length_zero(w, tmp, mp, stack):
    return Case(_dump(w, tmp, "--max-length", "0"), "--max-length must be a whole number >= 2")


@case
def dump_hidden_aux_layers_not_numbers(w, tmp, mp, stack):
    return Case(_dump(w, tmp, "--aux-layers", "a,b,c"), "--aux-layers", usage=True)


# ---- speedup (evaluation, target and draft configs, options) --------------------------------------------------------
DS3 = "deepseek-ai/DeepSeek-V3"  # a config shipped with mtp2draft: no file needed


def _evaluation(tmp: Path, text: str) -> Path:
    (tmp / "evaluation.json").write_text(text)
    return tmp / "evaluation.json"


def _speedup(tmp: Path, *extra: str, per: str = "[0.9, 0.6]", target: str = DS3) -> list[str]:
    ev = _evaluation(tmp, f'{{"acceptance_per_position": {per}}}')
    return ["speedup", str(ev), "--target", target, "--gpu", "h200", "--tp", "8", *extra]


def _config_file(tmp: Path, name: str, **changes: Any) -> str:
    from mtp2draft.speed.published import load_config

    cfg = {**load_config(DS3), **changes}
    (tmp / name).write_text(json.dumps(cfg))
    return str(tmp / name)


@case
def engine_install_unknown_engine(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_VLLM_VENV", str(tmp / "venv"))
    return Case(["engine", "install", "sglang"], "no engine environment 'sglang'; known: vllm, speculators")


@case
def engine_install_unknown_platform(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_VLLM_VENV", str(tmp / "venv"))  # nothing is created there: the pins are refused first
    return Case(["engine", "install", "vllm", "--platform", "tpu"], "platform 'tpu' is not one of cpu, cuda")


def _no_shell(mp: pytest.MonkeyPatch) -> None:
    """No venv is ever made by a row: a command that got past its refusal fails loudly instead of building one."""
    from mtp2draft.engines import environments

    def refuse(*args, **kwargs):
        raise AssertionError(f"engine install ran {args[0] if args else kwargs}")

    mp.setattr(environments.subprocess, "run", refuse)


@case
def engine_install_into_a_directory_it_did_not_make(w, tmp, mp, stack):
    _no_shell(mp)
    (tmp / "venv").mkdir()
    (tmp / "venv" / "thesis.tex").write_text("mine")
    mp.setenv("MTP2DRAFT_VLLM_VENV", str(tmp / "venv"))
    return Case(["engine", "install", "vllm", "--platform", "cpu"], "did not put there (thesis.tex)")


@case
def engine_install_while_another_install_builds_it(w, tmp, mp, stack):
    _no_shell(mp)
    mp.setenv("MTP2DRAFT_VLLM_VENV", str(tmp / "venv"))
    _claimed_elsewhere(tmp / "venv", stack)
    return Case(["engine", "install", "vllm", "--platform", "cpu"], "is building")


@case
def speedup_evaluation_missing(w, tmp, mp, stack):
    return Case(["speedup", str(tmp / "nowhere"), "--target", DS3, "--gpu", "h200"], "no evaluation")


@case
def speedup_evaluation_not_json(w, tmp, mp, stack):
    ev = _evaluation(tmp, "{")
    return Case(["speedup", str(ev), "--target", DS3, "--gpu", "h200"], "evaluation.json: not JSON")


@case
def speedup_evaluation_a_list(w, tmp, mp, stack):
    ev = _evaluation(tmp, "[0.9, 0.6]")
    return Case(["speedup", str(ev), "--target", DS3, "--gpu", "h200"], "not an `mtp2draft evaluate --save` report")


@case
def speedup_target_missing(w, tmp, mp, stack):
    return Case(_speedup(tmp, target=str(tmp / "none")), "no config.json at")


@case
def speedup_target_config_a_list(w, tmp, mp, stack):
    (tmp / "list.json").write_text("[1, 2]")
    return Case(_speedup(tmp, target=str(tmp / "list.json")), "list.json: not a model config (a JSON object)")


@case
def speedup_draft_config_a_list(w, tmp, mp, stack):
    (tmp / "list.json").write_text("[1, 2]")
    return Case(_speedup(tmp, "--draft", str(tmp / "list.json")), "not a model config")


@case
def speedup_unknown_gpu(w, tmp, mp, stack):
    argv = _speedup(tmp)
    argv[argv.index("--gpu") + 1] = "a100"
    return Case(argv, "a100")


@case
def speedup_context_beyond_the_target(w, tmp, mp, stack):
    cfg = _config_file(tmp, "cfg.json", max_position_embeddings=163840)
    return Case(_speedup(tmp, "--context", "200000", target=cfg), "beyond the target's max_position_embeddings")


# an evaluation's acceptance, a target config field, an option: one line each
for _name, _per, _needle in (
    ("acceptance_empty", "[]", "has no acceptance_per_position"),
    ("acceptance_strings", '["0.9"]', "acceptance_per_position must be numbers in [0, 1]"),
    ("acceptance_booleans", "[true, false]", "acceptance_per_position must be numbers in [0, 1]"),
    ("acceptance_above_one", "[1.5]", "must be numbers in [0, 1]"),
    ("acceptance_nan", "[NaN]", "must be numbers in [0, 1]"),
):
    _add(f"speedup_{_name}", lambda w, tmp, mp, stack, p=_per, n=_needle: Case(_speedup(tmp, per=p), n))
for _name, _field, _needle in (
    ("target_size_a_string", {"hidden_size": "7168"}, "cfg.json: hidden_size must be a whole number >= 1, got '7168'"),
    ("target_layers_negative", {"num_hidden_layers": -1}, "num_hidden_layers must be a whole number >= 1, got -1"),
    ("target_without_hidden_size", {"hidden_size": None}, "has none of hidden_size"),
):
    _add(
        f"speedup_{_name}",
        lambda w, tmp, mp, stack, f=_field, n=_needle: Case(
            _speedup(tmp, target=_config_file(tmp, "cfg.json", **f)), n
        ),
    )
for _name, _args, _needle, _usage in (
    ("tp_zero", ("--tp", "0"), "--tp must be a whole number >= 1, got 0", False),
    ("draft_tp_zero", ("--draft-tp", "0"), "--draft-tp must be a whole number >= 1, got 0", False),
    ("context_negative", ("--context", "-1"), "--context must be a whole number >= 0, got -1", False),
    ("batch_zero", ("--batch", "0,8"), "--batch sizes must be whole numbers >= 1", False),
    ("batch_not_numbers", ("--batch", "x"), "--batch", True),
):
    _add(
        f"speedup_{_name}", lambda w, tmp, mp, stack, a=_args, n=_needle, u=_usage: Case(_speedup(tmp, *a), n, usage=u)
    )


# ---- specs / demo ------------------------------------------------------------------------------------------------------
@case
def specs_extra_argument(w, tmp, mp, stack):
    return Case(["specs", "extra"], "extra", usage=True)


@case
def specs_malformed_user_spec(w, tmp, mp, stack):
    from mtp2draft.family.spec import registry

    (tmp / "specs").mkdir()
    (tmp / "specs" / "broken.toml").write_text("name = [unclosed\n")
    mp.setenv("MTP2DRAFT_SPEC_PATH", str(tmp / "specs"))
    registry.cache_clear()
    stack.callback(registry.cache_clear)
    return Case(["specs"], "broken.toml")


@case
def demo_steps_negative(w, tmp, mp, stack):
    return Case(["demo", "--steps", "-1", "--work", str(tmp / "demo")], "--steps must be a whole number >= 0")


@case
def demo_steps_zero(w, tmp, mp, stack):
    return Case(["demo", "--steps", "0", "--work", str(tmp / "demo")], "--steps 0 would write an untrained draft")


@case
def demo_work_holds_a_users_files(w, tmp, mp, stack):
    (tmp / "demo").mkdir()
    (tmp / "demo" / "notes.txt").write_text("mine")
    return Case(["demo", "--work", str(tmp / "demo")], "did not write")


@case
def demo_work_is_a_file(w, tmp, mp, stack):
    (tmp / "demo").write_text("x")
    return Case(["demo", "--work", str(tmp / "demo")], "is a file")


@case
def demo_work_is_the_working_directory(w, tmp, mp, stack):
    mp.chdir(tmp)
    return Case(["demo", "--work", "."], "working directory")


# ---- what mtp2draft wrote, what the user named ------------------------------------------------------------------
@case
def convert_overwrite_a_draft_holding_a_users_file(w, tmp, mp, stack):
    convert(str(w.mimo), tmp / "out")  # a draft mtp2draft wrote, then a file of the user's put in it
    (tmp / "out" / "notes.txt").write_text("mine")
    return Case(["convert", str(w.mimo), "--out", str(tmp / "out"), "--overwrite"], "did not write (notes.txt)")


@case
def export_overwrite_a_subfolder_the_user_added(w, tmp, mp, stack):
    export(w.ds_e3, "sglang", tmp / "out")
    (tmp / "out" / "mine").mkdir()
    (tmp / "out" / "mine" / "a.safetensors").write_bytes(b"x")
    return Case(_export(w.ds_e3, tmp, "sglang", "--overwrite"), "did not write (mine/a.safetensors)")


def _linked_out(name: str) -> CaseFn:
    def fn(w, tmp, mp, stack):
        draft = _copy(w.ds_e3, tmp, "draft")
        (tmp / "outside").write_text('{"results": []}')
        (draft / "evaluation.json").write_text(json.dumps({"results": []}))
        (draft / name).unlink(missing_ok=True)
        (draft / name).symlink_to(tmp / "outside")
        return Case(_export(draft, tmp, "sglang"), f"{name} leads outside")

    return fn


_add("export_evaluation_json_links_outside_the_draft", _linked_out("evaluation.json"))
_add("export_acceptance_chart_links_outside_the_draft", _linked_out("acceptance.png"))


@case
def export_draft_replaced_while_it_is_read(w, tmp, mp, stack):
    import mtp2draft.formats.export as stage

    draft = _copy(w.ds_e3, tmp, "draft")
    refuse = stage._refuse_violations

    def swapped(*args):  # config.json replaced by another file while the export reads the draft
        _swap_config(draft, tmp)
        return refuse(*args)

    mp.setattr(stage, "_refuse_violations", swapped)
    return Case(_export(draft, tmp, "sglang"), "changed while it was exported")


def _swap_config(draft: Path, tmp: Path) -> None:
    """config.json replaced by a copy (a new inode; same bytes, size and mtime, so the case's snapshot holds)."""
    cfg = draft / "config.json"
    info = cfg.stat()
    shutil.copyfile(cfg, tmp / "cfg")
    os.replace(tmp / "cfg", cfg)
    os.utime(cfg, ns=(info.st_atime_ns, info.st_mtime_ns))


@case
def push_draft_replaced_while_it_is_staged(w, tmp, mp, stack):
    """Refused before any request (no Hub is reachable here): the staged files are not the draft validated."""
    from mtp2draft.hub import upload as hub

    draft = _copy(w.ds_e3, tmp, "draft")
    stage = hub._stage

    def swapped(*args):
        files = stage(*args)
        _swap_config(draft, tmp)
        return files

    mp.setattr(hub, "_stage", swapped)
    mp.setenv("HF_TOKEN", "hf_" + "x" * 34)
    return Case(["push", str(draft), "--repo-id", "me/d"], "changed while it was pushed")


# ---- what validate checks that would go out wrong: dtypes against the config, figures against their range ----------
@case
def validate_fp16_tensor_under_a_bf16_config(w, tmp, mp, stack):
    draft = _poked(w.mimo_mtp, tmp, "eh_proj.weight", lambda t: t.to(torch.float16))
    return Case(["validate", str(draft)], "1 violation(s) of the mtp format")


def _evaluated(mean: float) -> CaseFn:
    def fn(w, tmp, mp, stack):
        draft = _copy(w.mimo_mtp, tmp, "draft")
        figures = {"name": "d", "acceptance_per_position": [0.5, 0.4, 0.3], "mean_acceptance_length": mean}
        (draft / "evaluation.json").write_text(json.dumps({"results": [figures]}))
        return Case(["validate", str(draft)], "1 violation(s) of the mtp format")

    return fn


_add("validate_mean_acceptance_length_below_one", _evaluated(0.5))
_add("validate_mean_acceptance_length_beyond_k_plus_one", _evaluated(9))
_add("push_mean_acceptance_length_beyond_k_plus_one", lambda *a: _push_of(_evaluated(9)(*a)))


def _push_of(case: Case) -> Case:
    return Case(["push", case.argv[1], "--repo-id", "me/d"], "mean_acceptance_length 9 is impossible at k = 3")


# ---- refused in run's checks, before any work, as the stage would refuse it later ------------------------------------
@case
def run_speculators_mtp_for_a_family_speculators_does_not_build(w, tmp, mp, stack):
    from support.fixtures import build_fixture, write_char_tokenizer

    v4 = build_fixture("deepseek_v4", tmp / "v4")
    write_char_tokenizer(v4)
    return Case(_run(w, tmp, "--format", "speculators-mtp", source=v4), "no mtp speculator type for deepseek_v4")


# ---- the test ---------------------------------------------------------------------------------------------------------


def command_counts() -> dict[str, int]:
    return dict(collections.Counter(name.split("_", 1)[0].replace("dump", "dump-hidden") for name in CASES))


def test_every_command_is_covered() -> None:
    counts = command_counts()
    assert all(counts.get(c, 0) >= 1 for c in COMMANDS), counts
    assert len(CASES) >= 150, counts


def run_case(fn: CaseFn, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple:
    """Run one hostile case: (its Case, stdout, stderr), after checking its exit status, that no traceback was
    printed and that nothing under the case's directory or the shared inputs changed."""
    with contextlib.ExitStack() as stack:
        spec = fn(world, tmp_path, monkeypatch, stack)
        capsys.readouterr()
        before = snapshot(tmp_path, world.root, world.ds, world.mimo)
        code = main(spec.argv)
        out, err = capsys.readouterr()
        after = snapshot(tmp_path, world.root, world.ds, world.mimo)
    assert code == spec.code, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert after == before, sorted(set(after) ^ set(before))
    return spec, out, err


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_command_fails_in_one_line_and_writes_nothing(
    name: str, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    spec, _, err = run_case(CASES[name], world, tmp_path, monkeypatch, capsys)
    if spec.usage:
        assert "Usage:" in err and "Error:" in err and spec.needle in err, err
    else:
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and spec.needle in lines[0], err
