"""Hostile and careless input to the dump side, through the CLI as a user types it: `dump-hidden`'s options and
outputs, and `distill --hidden-states` over damaged, inconsistent or foreign dumps (every manifest field, shard names
and links, shard headers, NaN / Inf and out-of-vocabulary records, loss masks, resumes). Each case fails with one
`error:` line naming the problem (or typer's short usage message), no traceback, nothing new on disk and nothing
lost; the table style is tests/test_bad_inputs.py's. Then torchrun (CPU, gloo, 2 ranks): ranks that disagree on
their settings, or where one rank's rows are damaged, fail together with the same line on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from disk import snapshot
from safetensors.torch import load_file, save_file

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.target.dump_checks import FIELDS

ROOT = Path(__file__).resolve().parents[1]
LENGTH = 32  # tokens per dumped sequence
TOP_K = 8


@dataclass
class World:
    """Inputs shared by every case (never modified: each test checks that)."""

    root: Path
    ds: Path  # runnable DeepSeek-V3-layout target (6 layers)
    mimo: Path  # runnable MiMo target (its final hidden is pre_norm)
    ds_mtp: Path  # native MTP draft of ds
    ds_e3: Path  # EAGLE-3 draft of ds
    mimo_mtp: Path  # native MTP draft of mimo
    data: Path
    dump: Path  # ds dumped for ds_mtp: 4 sequences in 2 shards
    dump_e3: Path  # ds dumped for ds_e3 (aux layers)
    dump_mimo: Path  # mimo dumped for mimo_mtp


def _dump(target: Path, draft: Path, data: Path, out: Path) -> Path:
    from mtp2draft.data import load_tokenizer, read_examples
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.settings import DumpConfig
    from mtp2draft.target.dumps import dump_hidden_states
    from mtp2draft.target.hidden import TargetModel

    d = load_draft(draft)
    examples, _ = read_examples(data, load_tokenizer(target), LENGTH)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples[:4]]
    aux = d.aux_layer_ids if d.kind == "eagle3" else None
    dumped = DumpConfig(aux_layers=aux, top_k=TOP_K, shard_size=2, final=getattr(d, "input_hidden", None))
    dump_hidden_states(TargetModel(str(target)), seqs, out, dumped)
    return out


@pytest.fixture(scope="module")
def world(target, text_data, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("dumps")
    ds, mimo = target("deepseek_v3", num_hidden_layers=6), target("mimo")
    convert(str(ds), root / "ds-mtp", dtype="float32")
    convert(str(ds), root / "ds-e3", to="eagle3", dtype="float32")
    convert(str(mimo), root / "mimo-mtp", dtype="float32")
    dumps = [_dump(t, root / d, text_data, root / f"dump-{d}") for t, d in ((ds, "ds-mtp"), (ds, "ds-e3"))]
    dumps.append(_dump(mimo, root / "mimo-mtp", text_data, root / "dump-mimo"))
    return World(root, ds, mimo, root / "ds-mtp", root / "ds-e3", root / "mimo-mtp", text_data, *dumps)


@dataclass
class Case:
    argv: list[str]
    needle: str  # what the one line must say
    usage: bool = False  # a typer usage error (short usage message) rather than an "error:" line
    code: int = 2


CaseFn = Callable[[World, Path, pytest.MonkeyPatch], Case]
CASES: dict[str, CaseFn] = {}


def case(fn: CaseFn) -> CaseFn:
    CASES[fn.__name__] = fn
    return fn


# ---- helpers ----------------------------------------------------------------------------------------------------------
def _copy(src: Path, tmp: Path, name: str = "dump") -> Path:
    dest = tmp / name
    shutil.copytree(src, dest, symlinks=True)
    return dest


def _manifest(dump: Path) -> dict:
    return json.loads((dump / "manifest.json").read_text())


def _write_manifest(dump: Path, manifest) -> None:
    (dump / "manifest.json").write_text(json.dumps(manifest))


def _edited(w: World, tmp: Path, src: Path | None = None, **changes) -> Path:
    dump = _copy(src or w.dump, tmp)
    _write_manifest(dump, {**_manifest(dump), **changes})
    return dump


def _distill(w: World, tmp: Path, dump: Path, *extra: str, draft: Path | None = None) -> list[str]:
    argv = ["distill", str(draft or w.ds_mtp), "--hidden-states", str(dump), "--out", str(tmp / "out")]
    return argv + ["--steps", "2", "--batch-size", "2", "--max-length", str(LENGTH), "--device", "cpu", *extra]


def _dump_hidden(w: World, tmp: Path, *extra: str, target: Path | None = None, data: Path | None = None) -> list[str]:
    argv = ["dump-hidden", "--target", str(target or w.ds), "--data", str(data or w.data), "--out", str(tmp / "out")]
    return argv + ["--max-length", str(LENGTH), "--top-k", str(TOP_K), *extra]


def _record(dump: Path, n: int) -> Path:
    """The shard file holding sequence n."""
    return next(dump / s["file"] for s in _manifest(dump)["shards"] if n in s["sequences"])


def _rewrite(dump: Path, n: int, fn: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Apply fn to the tensors of the shard holding sequence n (a dict it may edit), and save the shard."""
    shard = _record(dump, n)
    tensors = load_file(str(shard))
    fn(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard))
    return shard


def _damaged(w: World, tmp: Path, n: int, fn, src: Path | None = None) -> Path:
    dump = _copy(src or w.dump, tmp)
    _rewrite(dump, n, fn)
    return dump


def _set(key: str, fn: Callable[[torch.Tensor], torch.Tensor]):
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[key] = fn(tensors[key])

    return edit


def _poke(value: float, at: tuple[int, ...] = (3, 5)):
    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[at] = value
        return t

    return fn


# ---- dump-hidden: options ---------------------------------------------------------------------------------------------
@case
def dump_top_k_zero(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--top-k", "0"), "--top-k must be a whole number >= 1, got 0")


@case
def dump_top_k_negative(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--top-k", "-3"), "--top-k must be a whole number >= 1, got -3")


@case
def dump_top_k_not_a_number(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--top-k", "all"), "--top-k", usage=True)


@case
def dump_shard_size_zero(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--shard-size", "0"), "--shard-size must be a whole number >= 1, got 0")


@case
def dump_shard_size_negative(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--shard-size", "-1"), "--shard-size must be a whole number >= 1")


@case
def dump_max_length_one(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--max-length", "1"), "--max-length must be a whole number >= 2, got 1")


@case
def dump_max_length_zero(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--max-length", "0"), "--max-length must be a whole number >= 2, got 0")


@case
def dump_aux_layers_beyond_the_target(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--aux-layers", "1,2,9"), "aux layer ids must be distinct layers in 0..5")


@case
def dump_aux_layers_far_beyond_the_target(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--aux-layers", "1,2,100000"), "--aux-layers 1,2,100000")


@case
def dump_aux_layers_negative(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--aux-layers=-1,2,3"), "--aux-layers -1,2,3: aux layer ids must be distinct")


@case
def dump_aux_layers_repeated(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--aux-layers", "2,2,3"), "--aux-layers 2,2,3: aux layer ids must be distinct")


@case
def dump_aux_layers_not_numbers(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--aux-layers", "a,b"), "--aux-layers", usage=True)


@case
def dump_unknown_engine(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--engine", "sglang"), "--engine must be one of transformers, vllm")


@case
def dump_tensor_parallel_with_transformers(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--tensor-parallel-size", "2"), "--tensor-parallel-size is for --engine vllm")


@case
def dump_draft_of_another_family(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--draft", str(w.mimo_mtp)), "--draft was made for a mimo target")


@case
def dump_missing_draft(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--draft", str(tmp / "no-draft")), "does not exist")


@case
def dump_missing_data(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, data=tmp / "none.jsonl"), "does not exist")


@case
def dump_missing_target(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, target=tmp / "no-target"), "does not exist")


def _data(tmp: Path, lines: list[dict]) -> Path:
    path = tmp / "data.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@case
def dump_data_without_a_loss_token(w, tmp, mp):
    data = _data(tmp, [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}])
    return Case(_dump_hidden(w, tmp, data=data), "no record has enough loss tokens")


@case
def dump_max_length_two(w, tmp, mp):
    return Case(_dump_hidden(w, tmp, "--max-length", "2"), "no record has enough loss tokens after truncation to 2")


@case
def dump_data_is_a_directory(w, tmp, mp):
    (tmp / "data").mkdir()
    return Case(_dump_hidden(w, tmp, data=tmp / "data"), "data file")


@case
def dump_draft_is_a_file(w, tmp, mp):
    (tmp / "draft").write_text("x")
    return Case(_dump_hidden(w, tmp, "--draft", str(tmp / "draft")), "draft directory")


@case
def dump_from_a_target_with_a_nan_weight(w, tmp, mp):
    """A damaged target is run: its NaN hidden states are refused as they come, and no dump is left behind."""
    ck = _copy(w.ds, tmp, "ck")
    index = json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"]
    shard = ck / index["model.norm.weight"]
    tensors = load_file(str(shard))
    tensors["model.norm.weight"] = _poke(float("nan"), (3,))(tensors["model.norm.weight"])
    save_file(tensors, str(shard), {"format": "pt"})
    return Case(_dump_hidden(w, tmp, target=ck), "sequence 0: final holds non-finite values")


# ---- dump-hidden: outputs (never delete an input) --------------------------------------------------------------------
@case
def dump_overwrite_an_earlier_dump_holding_the_data(w, tmp, mp):
    out = _copy(w.dump, tmp, "out")  # an earlier dump (ours: --overwrite may replace it) where the user put the data
    shutil.copyfile(w.data, out / "train.jsonl")
    argv = _dump_hidden(w, tmp, "--overwrite", data=out / "train.jsonl")
    return Case(argv, f"--out {out} contains the input {out / 'train.jsonl'}")


@case
def dump_overwrite_an_earlier_dump_holding_the_draft(w, tmp, mp):
    out = _copy(w.dump, tmp, "out")
    draft = _copy(w.ds_mtp, out, "draft-copy")
    return Case(_dump_hidden(w, tmp, "--overwrite", "--draft", str(draft)), "contains the input")


@case
def dump_out_is_a_link_to_a_directory_holding_the_data(w, tmp, mp):
    earlier = _copy(w.dump, tmp, "earlier")
    shutil.copyfile(w.data, earlier / "train.jsonl")
    (tmp / "out").symlink_to(earlier)
    return Case(_dump_hidden(w, tmp, "--overwrite", data=earlier / "train.jsonl"), "contains the input")


@case
def dump_out_is_the_draft(w, tmp, mp):
    draft = _copy(w.ds_mtp, tmp, "out")  # a draft directory is ours too
    return Case(_dump_hidden(w, tmp, "--overwrite", "--draft", str(draft)), "is the input")


@case
def dump_out_inside_the_target(w, tmp, mp):
    ck = _copy(w.ds, tmp, "ck")
    argv = _dump_hidden(w, tmp, target=ck)
    argv[argv.index("--out") + 1] = str(ck / "dumped")
    return Case(argv, "lies inside the input")


@case
def dump_out_is_the_target(w, tmp, mp):
    ck = _copy(w.ds, tmp, "ck")
    argv = _dump_hidden(w, tmp, "--overwrite", target=ck)
    argv[argv.index("--out") + 1] = str(ck)
    return Case(argv, "is the input")


@case
def dump_out_contains_the_target(w, tmp, mp):
    ck = _copy(w.ds, tmp / "out", "ck")
    (tmp / "out" / ".mtp2draft").write_text("")  # even a directory mtp2draft wrote
    return Case(_dump_hidden(w, tmp, "--overwrite", target=ck), "contains the input")


@case
def dump_out_is_the_data_file(w, tmp, mp):
    data = tmp / "train.jsonl"
    shutil.copyfile(w.data, data)
    argv = _dump_hidden(w, tmp, "--overwrite", data=data)
    argv[argv.index("--out") + 1] = str(data)
    return Case(argv, "is the input")


@case
def dump_out_is_the_working_directory(w, tmp, mp):
    mp.chdir(tmp)
    argv = _dump_hidden(w, tmp, "--overwrite")
    argv[argv.index("--out") + 1] = "."
    return Case(argv, "working directory")


@case
def dump_overwrite_a_users_directory(w, tmp, mp):
    (tmp / "out").mkdir()
    (tmp / "out" / "thesis.tex").write_text("years of work")
    return Case(_dump_hidden(w, tmp, "--overwrite"), "did not write")


@case
def dump_into_a_non_empty_directory(w, tmp, mp):
    _copy(w.dump, tmp, "out")
    return Case(_dump_hidden(w, tmp), "exists and is not empty (pass --overwrite")


@case
def dump_out_is_a_file(w, tmp, mp):
    (tmp / "out").write_text("x")
    return Case(_dump_hidden(w, tmp), "exists and is a file")


# ---- distill --hidden-states: options that only an online run uses ----------------------------------------------------
@case
def offline_with_target(w, tmp, mp):
    argv = _distill(w, tmp, w.dump, "--target", str(w.ds))
    return Case(argv, "--target cannot be used with --hidden-states")


@case
def offline_with_heldout(w, tmp, mp):
    argv = _distill(w, tmp, w.dump, "--heldout", str(w.data))
    return Case(argv, "--heldout needs the online target (--target and --data), not --hidden-states")


@case
def offline_with_data(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--data", str(w.data)), "--data cannot be used with --hidden-states")


@case
def offline_with_target_and_data(w, tmp, mp):
    argv = _distill(w, tmp, w.dump, "--target", str(w.ds), "--data", str(w.data))
    return Case(argv, "--target and --data cannot be used with --hidden-states")


@case
def offline_with_regenerate(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--regenerate"), "--regenerate cannot be used with --hidden-states")


@case
def offline_with_revision(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--revision", "v2"), "--revision cannot be used with --hidden-states")


@case
def offline_with_skip_bad(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--skip-bad"), "--skip-bad cannot be used with --hidden-states")


@case
def offline_with_teacher_temperature(w, tmp, mp):
    argv = _distill(w, tmp, w.dump, "--teacher-temperature", "0.5")
    return Case(argv, "--teacher-temperature needs the online target: a top-k dump keeps no tail to sharpen")


@case
def offline_steps_zero(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--steps", "0"), "--steps 0 would write an untrained draft")


@case
def offline_max_length_one(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--max-length", "1"), "--max-length must be")


@case
def offline_batch_size_negative(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--batch-size", "-2"), "--batch-size must be")


@case
def offline_ttt_steps_zero(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, "--ttt-steps", "0"), "--ttt-steps must be")


@case
def offline_out_is_the_dump(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    argv = _distill(w, tmp, dump, "--overwrite")
    argv[argv.index("--out") + 1] = str(dump)
    return Case(argv, "is the input")


@case
def offline_out_contains_the_dump(w, tmp, mp):
    dump = _copy(w.dump, tmp / "out")
    (tmp / "out" / ".mtp2draft").write_text("")
    return Case(_distill(w, tmp, dump, "--overwrite"), "contains the input")


@case
def offline_resume_with_fewer_steps_than_the_checkpoint(w, tmp, mp):
    _checkpointed(w, tmp)
    return Case(_distill(w, tmp, w.dump, "--resume", "--steps", "1"), "is already at step 2")


@case
def offline_resume_with_the_checkpoints_steps(w, tmp, mp):
    _checkpointed(w, tmp)
    return Case(_distill(w, tmp, w.dump, "--resume", "--steps", "2"), "resume with --steps above 2")


@case
def offline_resume_from_a_checkpoint_whose_state_is_not_json(w, tmp, mp):
    _checkpointed(w, tmp)
    (tmp / "out.checkpoints" / "step-0000002" / "state.json").write_text("{half")
    return Case(_distill(w, tmp, w.dump, "--resume", "--steps", "4"), "state.json is not valid JSON")


@case
def offline_resume_from_a_checkpoint_without_a_step(w, tmp, mp):
    _checkpointed(w, tmp)
    state = tmp / "out.checkpoints" / "step-0000002" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "step": "2"}))
    return Case(_distill(w, tmp, w.dump, "--resume", "--steps", "4"), "records no valid step ('2')")


def _checkpointed(w: World, tmp: Path) -> None:
    """A run of 4 steps from w.dump stopped after its step-2 checkpoint (tmp/out.checkpoints/step-0000002)."""
    from mtp2draft.train.recipe import distill
    from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData

    cfg = DistillConfig(steps=4, batch_size=2, max_length=LENGTH, save_every=2)
    distill(
        DistillJob(
            draft_dir=w.ds_mtp, out=tmp / "out", data=TrainingData(hidden_states=w.dump), config=cfg, stop_after=2
        )
    )
    assert (tmp / "out.checkpoints" / "step-0000002").is_dir()


# ---- the dump directory and its manifest ------------------------------------------------------------------------------
@case
def hidden_states_missing(w, tmp, mp):
    return Case(_distill(w, tmp, tmp / "nope"), "is not a directory")


@case
def hidden_states_is_a_file(w, tmp, mp):
    (tmp / "dump").write_text("x")
    return Case(_distill(w, tmp, tmp / "dump"), "is not a directory")


@case
def hidden_states_without_manifest(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "manifest.json").unlink()
    return Case(_distill(w, tmp, dump), "has no manifest.json: not a dump-hidden directory")


@case
def manifest_not_json(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "manifest.json").write_text("{not json")
    return Case(_distill(w, tmp, dump), "manifest.json is not valid JSON")


@case
def manifest_not_utf8(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "manifest.json").write_bytes(b"\xff\xfe{\x00}\x00")
    return Case(_distill(w, tmp, dump), "manifest.json is not valid JSON")


@case
def manifest_is_a_list(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    _write_manifest(dump, [_manifest(dump)])
    return Case(_distill(w, tmp, dump), "must hold a JSON object, not a list")


@case
def manifest_is_a_number(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    _write_manifest(dump, 1)
    return Case(_distill(w, tmp, dump), "must hold a JSON object, not a int")


def _missing_field(name: str) -> CaseFn:
    def fn(w, tmp, mp):
        dump = _copy(w.dump, tmp)
        manifest = _manifest(dump)
        del manifest[name]
        _write_manifest(dump, manifest)
        return Case(_distill(w, tmp, dump), f"has no {name!r}")

    return fn


# a value of the wrong type for each field (a bool for the numbers: JSON true is not 1 here)
WRONG_TYPES = {
    "schema_version": "1",
    "target": 5,
    "target_commit": 5,
    "target_config": [],
    "spec": ["deepseek_v3"],
    "final": None,
    "aux_layer_ids": "1,2,4",
    "top_k": True,
    "num_sequences": 4.0,
    "hidden_size": "64",
    "vocab_size": 256.5,
    "shards": {"file": "hidden-00000.safetensors"},
}


def _wrong_type(name: str) -> CaseFn:
    def fn(w, tmp, mp):
        return Case(_distill(w, tmp, _edited(w, tmp, **{name: WRONG_TYPES[name]})), f"{name} must be {FIELDS[name][1]}")

    return fn


for _name in FIELDS:
    CASES[f"manifest_without_{_name}"] = _missing_field(_name)
    CASES[f"manifest_{_name}_of_the_wrong_type"] = _wrong_type(_name)


@case
def manifest_schema_version_2(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, schema_version=2)), "schema_version 2 is not supported")


@case
def manifest_top_k_zero(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, top_k=0)), "top_k must be >= 1, got 0")


@case
def manifest_top_k_negative(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, top_k=-8)), "top_k must be >= 1, got -8")


@case
def manifest_top_k_larger_than_stored(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, top_k=TOP_K + 1)), f"expected [{LENGTH}, {TOP_K + 1}]")


@case
def manifest_num_sequences_zero(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, num_sequences=0)), "num_sequences must be >= 1, got 0")


@case
def manifest_num_sequences_more_than_stored(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, num_sequences=5)), "num_sequences is 5 but shards list 4 (missing 4)")


@case
def manifest_num_sequences_fewer_than_stored(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, num_sequences=3)), "lists sequence 3, outside 0..2")


@case
def manifest_num_sequences_huge(w, tmp, mp):
    dump = _edited(w, tmp, num_sequences=10**12)
    return Case(_distill(w, tmp, dump), "num_sequences is 1000000000000 but shards list 4 (missing 4, 5, 6, 7, 8 ...)")


@case
def manifest_top_k_huge(w, tmp, mp):
    dump = _edited(w, tmp, top_k=10**30)  # the writer keeps at most the vocabulary: 256 columns expected, 8 stored
    return Case(_distill(w, tmp, dump), "0.topk_logprobs has shape [32, 8], expected [32, 256]")


@case
def manifest_hidden_size_disagrees_with_its_config(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, hidden_size=65)), "hidden_size 65 disagrees with its target_config")


@case
def manifest_vocab_size_disagrees_with_its_config(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, vocab_size=255)), "vocab_size 255 disagrees with its target_config")


@case
def manifest_hidden_size_negative(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, hidden_size=-64)), "hidden_size must be >= 1")


@case
def manifest_final_sideways(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, final="sideways")), "final must be one of post_norm, pre_norm")


@case
def manifest_unknown_spec(w, tmp, mp):
    return Case(_distill(w, tmp, _edited(w, tmp, spec="llama3")), "spec / target_config do not describe a target")


@case
def manifest_target_config_without_layers(w, tmp, mp):
    cfg = {k: v for k, v in _manifest(w.dump)["target_config"].items() if k != "num_hidden_layers"}
    return Case(_distill(w, tmp, _edited(w, tmp, target_config=cfg)), "num_hidden_layers")


@case
def manifest_aux_ids_beyond_its_target(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_e3, aux_layer_ids=[1, 2, 6])
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "aux_layer_ids [1, 2, 6] must be distinct layers in 0..5")


@case
def manifest_aux_ids_negative(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_e3, aux_layer_ids=[-1, 2, 4])
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "aux_layer_ids [-1, 2, 4]")


@case
def manifest_aux_ids_repeated(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_e3, aux_layer_ids=[2, 2, 4])
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "aux_layer_ids [2, 2, 4]")


@case
def manifest_aux_ids_not_numbers(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_e3, aux_layer_ids=["1", "2", "4"])
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "aux_layer_ids ['1', '2', '4']")


@case
def manifest_aux_ids_other_than_the_drafts(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_e3, aux_layer_ids=[0, 2, 4])
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "[1, 2, 4]")  # the shapes hold, the ids are not the draft's


# ---- the manifest's shard list ---------------------------------------------------------------------------------------
def _shards(w: World, tmp: Path, fn: Callable[[list], object], src: Path | None = None) -> Path:
    dump = _copy(src or w.dump, tmp)
    manifest = _manifest(dump)
    manifest["shards"] = fn(manifest["shards"]) or manifest["shards"]
    _write_manifest(dump, manifest)
    return dump


def _name_shard(file: str) -> Callable[[list], None]:
    def fn(shards: list) -> None:
        shards[0]["file"] = file

    return fn


@case
def shards_empty(w, tmp, mp):
    dump = _edited(w, tmp, shards=[])
    return Case(_distill(w, tmp, dump), "num_sequences is 4 but shards list 0")


@case
def shard_entry_not_an_object(w, tmp, mp):
    return Case(
        _distill(w, tmp, _shards(w, tmp, lambda s: ["hidden-00000.safetensors", s[1]])), "every entry of shards"
    )


@case
def shard_entry_without_file(w, tmp, mp):
    return Case(_distill(w, tmp, _shards(w, tmp, lambda s: [{"sequences": [0, 1]}, s[1]])), "every entry of shards")


@case
def shard_file_not_a_string(w, tmp, mp):
    return Case(_distill(w, tmp, _shards(w, tmp, _name_shard(5))), "every entry of shards")  # type: ignore[arg-type]


@case
def shard_sequences_not_a_list(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"] = "0,1"

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "must list its sequences as whole numbers")


@case
def shard_sequences_not_numbers(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"] = [0, "1"]

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "must list its sequences as whole numbers")


@case
def shard_sequence_out_of_range(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"] = [0, 9]

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "lists sequence 9, outside 0..3")


@case
def shard_sequence_negative(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"] = [-1, 1]

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "lists sequence -1, outside 0..3")


@case
def shard_sequences_booleans(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"] = [False, True]  # JSON false / true are not 0 / 1 here

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "must list its sequences as whole numbers, got [False, True]")


@case
def shard_sequence_listed_twice(w, tmp, mp):
    def fn(shards):
        shards[1]["sequences"] = [1, 3]

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "sequence 1 is listed twice")


@case
def shard_lists_a_sequence_it_does_not_hold(w, tmp, mp):
    def fn(shards):
        shards[0]["sequences"], shards[1]["sequences"] = [0, 2], [1, 3]

    return Case(_distill(w, tmp, _shards(w, tmp, fn)), "record 2 has no 2.input_ids")


@case
def shard_named_by_a_parent_path(w, tmp, mp):
    dump = _shards(w, tmp, _name_shard("../other/hidden-00000.safetensors"))
    _copy(w.dump, tmp, "other")
    return Case(_distill(w, tmp, dump), "lies outside the dump: refusing to read it")


@case
def shard_named_by_an_absolute_path(w, tmp, mp):
    return Case(_distill(w, tmp, _shards(w, tmp, _name_shard("/etc/passwd"))), "'/etc/passwd', which lies outside")


@case
def shard_named_by_a_traversal_inside(w, tmp, mp):
    dump = _shards(w, tmp, _name_shard("sub/../../dump/hidden-00000.safetensors"))
    return Case(_distill(w, tmp, dump), "lies outside the dump")


@case
def shard_named_with_a_backslash(w, tmp, mp):
    return Case(_distill(w, tmp, _shards(w, tmp, _name_shard("..\\x.safetensors"))), "lies outside the dump")


@case
def shard_named_by_an_empty_string(w, tmp, mp):
    return Case(_distill(w, tmp, _shards(w, tmp, _name_shard(""))), "lies outside the dump")


@case
def shard_is_a_link_out_of_the_dump(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    outside = _copy(w.dump, tmp, "elsewhere")
    (dump / "hidden-00000.safetensors").unlink()
    (dump / "hidden-00000.safetensors").symlink_to(outside / "hidden-00000.safetensors")
    return Case(_distill(w, tmp, dump), "a link that leads outside the dump")


@case
def shared_file_is_a_link_out_of_the_dump(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    outside = _copy(w.dump, tmp, "elsewhere")
    (dump / "shared.safetensors").unlink()
    (dump / "shared.safetensors").symlink_to(outside / "shared.safetensors")
    return Case(_distill(w, tmp, dump), "a link that leads outside the dump")


@case
def shard_file_missing(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "hidden-00001.safetensors").unlink()
    return Case(_distill(w, tmp, dump), "shard hidden-00001.safetensors is named in")


@case
def shared_file_missing(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "shared.safetensors").unlink()
    return Case(_distill(w, tmp, dump), "shared.safetensors does not exist")


# ---- shard files: headers, dtypes, shapes ----------------------------------------------------------------------------
@case
def shard_truncated(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    shard = dump / "hidden-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    return Case(_distill(w, tmp, dump), "hidden-00001.safetensors: header entry for")


@case
def shard_cut_inside_its_header(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    shard = dump / "hidden-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    return Case(_distill(w, tmp, dump), "hidden-00000.safetensors: corrupt safetensors header")


@case
def shard_of_three_bytes(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "hidden-00000.safetensors").write_bytes(b"abc")
    return Case(_distill(w, tmp, dump), "hidden-00000.safetensors: truncated safetensors file")


@case
def shard_empty(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "hidden-00000.safetensors").write_bytes(b"")
    return Case(_distill(w, tmp, dump), "hidden-00000.safetensors: truncated safetensors file")


@case
def shard_header_not_json(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    shard = dump / "hidden-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:12] = b"\xff\xfe\x00!"
    shard.write_bytes(bytes(data))
    return Case(_distill(w, tmp, dump), "hidden-00000.safetensors: corrupt safetensors header")


@case
def shard_header_length_huge(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    shard = dump / "hidden-00000.safetensors"
    shard.write_bytes(b"\xff" * 8 + shard.read_bytes()[8:])
    return Case(_distill(w, tmp, dump), "corrupt safetensors header (declares")


@case
def shard_is_a_directory(w, tmp, mp):
    dump = _copy(w.dump, tmp)
    (dump / "hidden-00000.safetensors").unlink()
    (dump / "hidden-00000.safetensors").mkdir()
    return Case(_distill(w, tmp, dump), "hidden-00000.safetensors is named in")


def _drop(key: str):
    def edit(tensors):
        del tensors[key]

    return edit


@case
def record_without_final(w, tmp, mp):
    return Case(_distill(w, tmp, _damaged(w, tmp, 1, _drop("1.final"))), "record 1 has no 1.final")


@case
def record_without_loss_mask(w, tmp, mp):
    return Case(_distill(w, tmp, _damaged(w, tmp, 2, _drop("2.loss_mask"))), "record 2 has no 2.loss_mask")


@case
def record_without_topk_ids(w, tmp, mp):
    return Case(_distill(w, tmp, _damaged(w, tmp, 3, _drop("3.topk_ids"))), "record 3 has no 3.topk_ids")


@case
def record_without_aux(w, tmp, mp):
    dump = _damaged(w, tmp, 0, _drop("0.aux"), src=w.dump_e3)
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "record 0 has no 0.aux")


@case
def record_final_in_half_precision(w, tmp, mp):
    dump = _damaged(w, tmp, 0, _set("0.final", lambda t: t.half()))
    return Case(_distill(w, tmp, dump), "0.final is F16, the schema says F32")


@case
def record_ids_as_int32(w, tmp, mp):
    dump = _damaged(w, tmp, 1, _set("1.input_ids", lambda t: t.int()))
    return Case(_distill(w, tmp, dump), "1.input_ids is I32, the schema says I64")


@case
def record_loss_mask_as_bytes(w, tmp, mp):
    dump = _damaged(w, tmp, 1, _set("1.loss_mask", lambda t: t.to(torch.uint8)))
    return Case(_distill(w, tmp, dump), "1.loss_mask is U8, the schema says BOOL")


@case
def record_final_too_wide(w, tmp, mp):
    dump = _damaged(w, tmp, 1, _set("1.final", lambda t: torch.cat([t, t[:, :1]], 1)))
    return Case(_distill(w, tmp, dump), "1.final has shape [32, 65], expected [32, 64]")


@case
def record_final_too_short(w, tmp, mp):
    dump = _damaged(w, tmp, 1, _set("1.final", lambda t: t[:-1]))
    return Case(_distill(w, tmp, dump), "1.final has shape [31, 64], expected [32, 64]")


@case
def record_aux_of_two_layers(w, tmp, mp):
    dump = _damaged(w, tmp, 2, _set("2.aux", lambda t: t[:, : 2 * 64]), src=w.dump_e3)
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "2.aux has shape [32, 128], expected [32, 192]")


@case
def record_loss_mask_longer(w, tmp, mp):
    dump = _damaged(w, tmp, 0, _set("0.loss_mask", lambda t: torch.cat([t, t])))
    return Case(_distill(w, tmp, dump), "0.loss_mask has shape [64], expected [32]")


@case
def record_input_ids_two_dimensional(w, tmp, mp):
    dump = _damaged(w, tmp, 0, _set("0.input_ids", lambda t: t[None]))
    return Case(_distill(w, tmp, dump), "0.input_ids has shape [1, 32]: a record holds [T] ids")


@case
def record_of_no_tokens(w, tmp, mp):
    def empty(tensors):
        for key in [k for k in tensors if k.startswith("3.")]:
            tensors[key] = tensors[key][:0]

    return Case(
        _distill(w, tmp, _damaged(w, tmp, 3, empty)), "3.input_ids has shape [0]: a record holds [T] ids, T >= 1"
    )


@case
def record_topk_narrower_than_declared(w, tmp, mp):
    dump = _damaged(w, tmp, 1, _set("1.topk_logprobs", lambda t: t[:, :-1]))
    return Case(_distill(w, tmp, dump), f"1.topk_logprobs has shape [32, {TOP_K - 1}], expected [32, {TOP_K}]")


@case
def record_topk_ids_and_logprobs_disagree(w, tmp, mp):
    dump = _damaged(w, tmp, 2, _set("2.topk_ids", lambda t: t[:, :4]))
    return Case(_distill(w, tmp, dump), "2.topk_ids has shape [32, 4]")


def _shared(w: World, tmp: Path, fn) -> Path:
    dump = _copy(w.dump, tmp)
    tensors = load_file(str(dump / "shared.safetensors"))
    fn(tensors)
    save_file(tensors, str(dump / "shared.safetensors"))
    return dump


@case
def shared_embed_of_another_shape(w, tmp, mp):
    dump = _shared(w, tmp, _set("embed", lambda t: t[:-1].contiguous()))
    return Case(_distill(w, tmp, dump), "embed must be a float tensor [256, 64], got F32 [255, 64]")


@case
def shared_without_lm_head(w, tmp, mp):
    return Case(
        _distill(w, tmp, _shared(w, tmp, _drop("lm_head"))), "lm_head must be a float tensor [256, 64], got missing"
    )


@case
def shared_lm_head_as_integers(w, tmp, mp):
    dump = _shared(w, tmp, _set("lm_head", lambda t: t.to(torch.int32)))
    return Case(_distill(w, tmp, dump), "lm_head must be a float tensor")


@case
def shared_lm_head_with_nan(w, tmp, mp):
    dump = _shared(w, tmp, _set("lm_head", _poke(float("nan"))))
    return Case(_distill(w, tmp, dump), "shared.safetensors: lm_head holds non-finite values (1 NaN, 0 Inf")


@case
def shared_embed_with_inf(w, tmp, mp):
    dump = _shared(w, tmp, _set("embed", _poke(float("-inf"))))
    return Case(_distill(w, tmp, dump), "embed holds non-finite values (0 NaN, 1 Inf")


# ---- loss masks: something to train on -------------------------------------------------------------------------------
def _masks(w: World, tmp: Path, fn: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    dump = _copy(w.dump, tmp)
    for n in range(4):
        _rewrite(dump, n, _set(f"{n}.loss_mask", fn))
    return dump


@case
def loss_mask_all_false(w, tmp, mp):
    dump = _masks(w, tmp, torch.zeros_like)
    return Case(_distill(w, tmp, dump), "the loss mask is false at every position within --max-length 32")


@case
def loss_mask_only_beyond_max_length(w, tmp, mp):
    def late(t):
        out = torch.zeros_like(t)
        out[20:] = True
        return out

    dump = _masks(w, tmp, late)
    return Case(_distill(w, tmp, dump, "--max-length", "16"), "false at every position within --max-length 16")


# ---- records: values, checked per batch as it is consumed -------------------------------------------------------------
def _first_batch_record(w: World) -> int:
    from mtp2draft.train.teacher import batch_indices

    return batch_indices(0, 2, 4, 0)[0]


@case
def record_final_with_nan(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.final", _poke(float("nan"))))
    return Case(_distill(w, tmp, dump), f"record {n}: final holds non-finite values (1 NaN, 0 Inf of 2048)")


@case
def record_final_with_inf(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.final", _poke(float("inf"))))
    return Case(_distill(w, tmp, dump), f"record {n}: final holds non-finite values (0 NaN, 1 Inf")


@case
def record_nan_in_a_later_step(w, tmp, mp):
    from mtp2draft.train.teacher import batch_indices

    n = batch_indices(1, 2, 4, 0)[1]  # step 2's second row: step 1 trains, step 2 is refused
    dump = _damaged(w, tmp, n, _set(f"{n}.final", _poke(float("nan"), (0, 0))))
    return Case(_distill(w, tmp, dump), f"hidden-0000{n // 2}.safetensors: record {n}: final holds non-finite")


@case
def record_every_final_nan(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.final", lambda t: torch.full_like(t, float("nan"))))
    return Case(_distill(w, tmp, dump), f"record {n}: final holds non-finite values (2048 NaN")


@case
def record_aux_with_inf(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.aux", _poke(float("-inf"))), src=w.dump_e3)
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), f"record {n}: aux holds non-finite values (0 NaN, 1 Inf")


@case
def record_topk_logprobs_with_nan(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.topk_logprobs", _poke(float("nan"), (2, 0))))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_logprobs holds non-finite values (1 NaN, 0 +Inf")


@case
def record_topk_logprobs_with_plus_inf(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.topk_logprobs", _poke(float("inf"), (2, 0))))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_logprobs holds non-finite values (0 NaN, 1 +Inf")


@case
def record_topk_logprob_above_zero(w, tmp, mp):
    """A log-prob of 0.5 is a probability of 1.65: logits written as log-probs, not a distribution."""
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.topk_logprobs", _poke(0.5, (2, 0))))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_logprobs holds 1 value(s) above 0 (max 0.5)")


@case
def record_topk_id_repeated(w, tmp, mp):
    """One id twice in a position's top-k: its probability would count twice."""
    n = _first_batch_record(w)

    def repeat(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[2, 1] = t[2, 0]
        return t

    dump = _damaged(w, tmp, n, _set(f"{n}.topk_ids", repeat))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_ids repeats id")


@case
def record_topk_id_beyond_the_vocabulary(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.topk_ids", _poke(256, (1, 1))))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_ids holds ids in 0..256, outside the vocabulary 0..255")


@case
def record_topk_id_negative(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.topk_ids", _poke(-1, (1, 1))))
    return Case(_distill(w, tmp, dump), f"record {n}: topk_ids holds ids in -1..")


@case
def record_input_id_beyond_the_vocabulary(w, tmp, mp):
    n = _first_batch_record(w)
    dump = _damaged(w, tmp, n, _set(f"{n}.input_ids", lambda t: t.index_fill(0, torch.tensor([4]), 10**9)))
    return Case(_distill(w, tmp, dump), f"record {n}: input_ids holds ids in")


@case
def draft_with_nan_weights(w, tmp, mp):
    """The dump is fine, the draft is not: refused as it loads, before any step."""
    draft = _copy(w.ds_mtp, tmp, "draft")
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["eh_proj.weight"] = _poke(float("nan"), (0, 0))(tensors["eh_proj.weight"])
    save_file(tensors, str(draft / "model.safetensors"), {"format": "pt"})
    return Case(_distill(w, tmp, w.dump, draft=draft), "eh_proj.weight holds non-finite values (1 NaN, 0 Inf")


# ---- identity: a dump of another target than the draft's ---------------------------------------------------------------
@case
def dump_of_another_family(w, tmp, mp):
    return Case(
        _distill(w, tmp, w.dump_mimo), "holds a mimo target's hidden states; the draft was made for a deepseek_v3"
    )


@case
def dump_of_another_family_with_final_edited(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_mimo, final="post_norm")  # the draft reads post_norm: only the family tells now
    return Case(_distill(w, tmp, dump), "holds a mimo target's hidden states")


@case
def dump_of_another_family_for_an_eagle3_draft(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump_mimo, draft=w.ds_e3), "holds a mimo target's hidden states")


@case
def dump_with_spec_edited_to_the_drafts(w, tmp, mp):
    dump = _edited(w, tmp, w.dump_mimo, spec="deepseek_v3", final="post_norm")
    return Case(_distill(w, tmp, dump), "was dumped from a target of 2 layers; the draft's has 6")


@case
def dump_with_the_other_final_hidden(w, tmp, mp):
    dump = _edited(w, tmp, final="pre_norm")
    return Case(_distill(w, tmp, dump), "holds the pre_norm final hidden, the draft reads the post_norm one")


def _config_edited(key: str, value, named: str) -> CaseFn:
    def fn(w, tmp, mp):
        cfg = {**_manifest(w.dump)["target_config"], key: value}
        dump = _edited(w, tmp, target_config=cfg)
        return Case(_distill(w, tmp, dump), f"its target_config has {named}={value!r}")

    return fn


# one key of the target's config.json edited in the manifest: each changes what the target computed (the message
# names RoPE fields as the comparison reads them, gathered under `rope.`)
for _key, _value, _named in (
    ("rope_theta", 12345.0, "rope.rope_theta"),
    ("rms_norm_eps", 1e-3, "rms_norm_eps"),
    ("num_attention_heads", 8, "num_attention_heads"),
    ("max_position_embeddings", 77, "max_position_embeddings"),
):
    CASES[f"dump_target_config_{_key}_differs"] = _config_edited(_key, _value, _named)


@case
def dump_target_config_gains_a_key(w, tmp, mp):
    cfg = {**_manifest(w.dump)["target_config"], "rope_scaling": {"type": "yarn", "factor": 4.0}}
    return Case(_distill(w, tmp, _edited(w, tmp, target_config=cfg)), "its target_config has rope.beta_fast=None")


@case
def eagle3_dump_of_a_deeper_target(w, tmp, mp):
    cfg = {**_manifest(w.dump_e3)["target_config"], "num_hidden_layers": 7}
    dump = _edited(w, tmp, w.dump_e3, target_config=cfg)
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "was dumped from a target of 7 layers; the draft's has 6")


@case
def eagle3_dump_with_other_token_ids(w, tmp, mp):
    cfg = {**_manifest(w.dump_e3)["target_config"], "eos_token_id": 7}
    dump = _edited(w, tmp, w.dump_e3, target_config=cfg)
    return Case(_distill(w, tmp, dump, draft=w.ds_e3), "eos_token_id 7")


@case
def eagle3_dump_without_aux(w, tmp, mp):
    return Case(_distill(w, tmp, w.dump, draft=w.ds_e3), "holds aux layers [], the draft reads [1, 2, 4]")


@case
def dump_of_another_commit(w, tmp, mp):
    draft = _copy(w.ds_e3, tmp, "draft")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["mtp2draft"]["commit"] = "a" * 40
    (draft / "config.json").write_text(json.dumps(cfg))
    dump = _edited(w, tmp, w.dump_e3, target_commit="b" * 40)
    return Case(_distill(w, tmp, dump, draft=draft), f"was dumped from commit {'b' * 40}")


# ---- the table --------------------------------------------------------------------------------------------------------


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 130


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_dump_fails_in_one_line_and_writes_nothing(
    name: str, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    with contextlib.ExitStack():
        spec = CASES[name](world, tmp_path, monkeypatch)
        capsys.readouterr()
        before = snapshot(tmp_path, world.root, world.ds, world.mimo)
        code = main(spec.argv)
        out, err = capsys.readouterr()
    assert code == spec.code, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    if spec.usage:
        assert "Usage:" in err and "Error:" in err and spec.needle in err, err
    else:
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and spec.needle in lines[0], err
    after = snapshot(tmp_path, world.root, world.ds, world.mimo)
    assert after == before, sorted(set(after) ^ set(before))


def test_a_good_dump_still_trains_and_writes_finite_weights(world: World, tmp_path: Path, capsys) -> None:
    """The checks refuse only what is wrong: the dumps the table damages train as before."""
    from mtp2draft.target.dump_checks import check_finite_state

    for draft, dump in ((world.ds_mtp, world.dump), (world.ds_e3, world.dump_e3)):
        out = tmp_path / draft.name
        argv = _distill(world, tmp_path, dump, draft=draft)
        argv[argv.index("--out") + 1] = str(out)
        assert main(argv) == 0, capsys.readouterr().err
        check_finite_state(load_file(str(out / "model.safetensors")), str(out))


# ---- torchrun: ranks fail together -------------------------------------------------------------------------------------
def _torchrun(*args: str, timeout: float = 300, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--tee=3"]
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    started = time.perf_counter()
    done = subprocess.run(
        [*launcher, str(ROOT / "tests" / "rank_options.py"), "distill", *args],
        capture_output=True,
        text=True,
        env={**clean, "OMP_NUM_THREADS": "1", **env},
        timeout=timeout,
    )
    return done, time.perf_counter() - started


def _rank_tracebacks(output: str) -> list[str]:
    """Tracebacks printed by the ranks (torchrun's own launcher reports a failed child with one; that is its way)."""
    return [line for line in output.splitlines() if line.startswith(("[default", "[rank")) and "Traceback" in line]


def _rank_errors(output: str) -> dict[str, list[str]]:
    """{rank: its error lines} from torchrun --tee output ('[default0]:error: ...' or '[rank0]:error: ...')."""
    import re

    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        m = re.match(r"\[(?:default|rank)(\d+)\]:(error: .*)", line)
        if m:
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


@pytest.mark.slow
def test_torchrun_ranks_with_other_settings_fail_together(world: World, tmp_path: Path) -> None:
    """One rank started with another --ttt-steps: both ranks print the same one line and exit, nothing is written."""
    argv = _distill(world, tmp_path, world.dump)[1:]
    done, seconds = _torchrun(*argv, timeout=240, RANK_1_OPTIONS="--ttt-steps 2")
    output = done.stdout + done.stderr
    errors = _rank_errors(output)
    assert done.returncode != 0 and not _rank_tracebacks(output), output
    assert sorted(errors) == ["0", "1"] and all(len(e) == 1 for e in errors.values()), output
    assert errors["0"] == errors["1"], errors
    assert "ranks disagree on their settings: rank 1 has ttt_steps 2 (rank 0: 3)" in errors["0"][0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.checkpoints").exists()
    print(f"torchrun mismatch refused on both ranks in {seconds:.1f} s (process start included)")


@pytest.mark.slow
def test_torchrun_a_rank_refused_before_it_joins_hangs_no_one(world: World, tmp_path: Path) -> None:
    """Rank 1 refuses its options before the process group exists: torchrun stops rank 0, nothing waits forever."""
    done, seconds = _torchrun(*_distill(world, tmp_path, world.dump)[1:], timeout=240, RANK_1_OPTIONS="--ttt-steps 0")
    output = done.stdout + done.stderr
    errors = _rank_errors(output)
    assert done.returncode != 0 and not _rank_tracebacks(output), output
    assert errors.get("1") == ["error: --ttt-steps must be a whole number >= 1, got 0"], output
    assert not (tmp_path / "out").exists()
    print(f"torchrun: rank 1's refusal ended the run in {seconds:.1f} s (process start included)")


@pytest.mark.slow
def test_torchrun_an_out_claimed_by_another_run_fails_every_rank(world: World, tmp_path: Path) -> None:
    """Rank 0 (the writer) finds --out claimed by a live run: rank 1 does not wait for it, both print one line."""
    from mtp2draft.outputs.claims import claim_output

    with claim_output(tmp_path / "out"):  # this test's process is the other run (alive, so its claim is not stale)
        done, seconds = _torchrun(*_distill(world, tmp_path, world.dump)[1:], timeout=240)
    output = done.stdout + done.stderr
    errors = _rank_errors(output)
    assert done.returncode != 0 and not _rank_tracebacks(output), output
    assert sorted(errors) == ["0", "1"] and all(len(e) == 1 for e in errors.values()), output
    assert "is being written by another mtp2draft run" in errors["0"][0], errors
    assert errors["1"][0].startswith("error: rank 0: --out ") and "another mtp2draft run" in errors["1"][0], errors
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.checkpoints").exists()
    print(f"torchrun: a claimed --out refused on both ranks in {seconds:.1f} s (process start included)")


@pytest.mark.slow
def test_torchrun_a_damaged_row_on_one_rank_fails_every_rank(world: World, tmp_path: Path) -> None:
    """NaN in the row rank 1 reads at step 1: rank 0's rows are fine, yet both ranks fail at once with one line."""
    from mtp2draft.train.teacher import batch_indices

    n = batch_indices(0, 2, 4, 0)[1]  # rank 1's row of the first global batch
    dump = _damaged(world, tmp_path, n, _set(f"{n}.final", _poke(float("nan"))))
    done, seconds = _torchrun(*_distill(world, tmp_path, dump)[1:], timeout=240)
    output = done.stdout + done.stderr
    errors = _rank_errors(output)
    assert done.returncode != 0 and not _rank_tracebacks(output), output
    assert sorted(errors) == ["0", "1"] and all(len(e) == 1 for e in errors.values()), output
    assert f"record {n}: final holds non-finite values" in errors["1"][0]
    assert errors["0"][0].startswith("error: rank 1: ") and f"record {n}:" in errors["0"][0]
    assert not (tmp_path / "out").exists()
    print(f"torchrun damaged row refused on both ranks in {seconds:.1f} s (process start included)")
