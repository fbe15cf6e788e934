"""Hostile and careless input, through the CLI as a user types it: every case fails with one line naming the problem
(or typer's short usage message), no traceback, and nothing new on disk; plus the must-never-happen cases: a token
published, a read outside the checkpoint, a user's files deleted.

Each case in CASES builds what it needs under its own directory and returns the command line; the test runs it
in-process and checks the exit code, stderr, and that neither the case's directory nor the shared inputs changed.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from disk import snapshot
from safetensors.torch import load_file, save_file

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert


@dataclass
class World:
    """Inputs shared by every case (never modified: each test checks that)."""

    root: Path
    ds: Path  # runnable DeepSeek-V3-layout target (tokenizer included)
    mimo: Path  # runnable MiMo target
    ds_mtp: Path  # native MTP draft converted from ds
    mimo_mtp: Path  # native MTP draft converted from mimo
    ds_e3: Path  # EAGLE-3 draft converted from ds
    data: Path


@pytest.fixture(scope="module")
def world(target, text_data, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("world")
    ds, mimo = target("deepseek_v3", num_hidden_layers=6), target("mimo")
    convert(str(ds), root / "ds-mtp")
    convert(str(mimo), root / "mimo-mtp")
    convert(str(ds), root / "ds-e3", to="eagle3")
    return World(root, ds, mimo, root / "ds-mtp", root / "mimo-mtp", root / "ds-e3", text_data)


@dataclass
class Case:
    argv: list[str]
    needle: str  # what the one line must say
    usage: bool = False  # a typer usage error (short usage message) rather than an "error:" line
    stdout: str = ""  # what stdout must say (validate lists violations there)
    code: int = 2  # the exit status: 2 for a bad input or usage, 1 for the environment (an OSError: disk, permissions)


CaseFn = Callable[[World, Path, pytest.MonkeyPatch, contextlib.ExitStack], Case]
CASES: dict[str, CaseFn] = {}


def case(fn: CaseFn) -> CaseFn:
    CASES[fn.__name__] = fn
    return fn


# ---- helpers that damage copies ---------------------------------------------------------------------------------------
def _copy(src: Path, tmp: Path, name: str = "ck") -> Path:
    dest = tmp / name
    shutil.copytree(src, dest)
    return dest


def _index(ck: Path) -> dict:
    return json.loads((ck / "model.safetensors.index.json").read_text())


def _write_index(ck: Path, index: dict) -> None:
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))


def _edit_config(ck: Path, **changes) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(changes)
    (ck / "config.json").write_text(json.dumps(cfg))


MTP = "model.layers.6."  # the MTP layer of the 6-layer DeepSeek-V3 fixture (aux ids 1, 2, 4: every engine)


def _rewrite_tensor(ck: Path, key: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    shard = ck / _index(ck)["weight_map"][key]
    tensors = load_file(str(shard))
    tensors[key] = fn(tensors[key]).contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _broken_ds(w: World, tmp: Path, key: str, fn) -> Path:
    ck = _copy(w.ds, tmp)
    _rewrite_tensor(ck, key, fn)
    return ck


def _convert(src: Path | str, tmp: Path, *extra: str) -> list[str]:
    return ["convert", str(src), "--out", str(tmp / "out"), *extra]


def _distill(w: World, tmp: Path, *extra: str, draft: Path | None = None, target: Path | None = None) -> list[str]:
    return [
        "distill",
        str(draft or w.ds_mtp),
        "--target",
        str(target or w.ds),
        "--data",
        str(w.data),
        "--out",
        str(tmp / "out"),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--max-length",
        "32",
        *extra,
    ]


def _evaluate(w: World, *extra: str, draft: Path | None = None, target: Path | None = None) -> list[str]:
    return ["evaluate", str(draft or w.ds_mtp), "--target", str(target or w.ds), "--data", str(w.data), *extra]


def _data(tmp: Path, content: bytes) -> Path:
    path = tmp / "data.jsonl"
    path.write_bytes(content)
    return path


# ---- usage errors (typer's short usage message) ---------------------------------------------------------------------
@case
def usage_convert_without_out(w, tmp, mp, stack):
    return Case(["convert", str(w.ds)], "--out", usage=True)


@case
def usage_convert_without_source(w, tmp, mp, stack):
    return Case(["convert", "--out", str(tmp / "out")], "source", usage=True)


@case
def usage_layer_not_a_number(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--layer", "abc"), "--layer", usage=True)


@case
def usage_unknown_flag(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--bogus"), "--bogus", usage=True)


@case
def usage_unknown_command(w, tmp, mp, stack):
    return Case(["frobnicate"], "frobnicate", usage=True)


@case
def usage_aux_layers_not_numbers(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--to", "eagle3", "--aux-layers", "a,b,c"), "--aux-layers", usage=True)


@case
def usage_step_weights_not_numbers(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--step-weights", "1,x,1"), "--step-weights", usage=True)


@case
def usage_steps_not_a_number(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--steps", "many"), "--steps", usage=True)


@case
def usage_k_not_a_number(w, tmp, mp, stack):
    return Case(_evaluate(w, "-k", "x"), "-k", usage=True)


@case
def usage_export_without_format(w, tmp, mp, stack):
    return Case(["export", str(w.ds_e3), "--out", str(tmp / "out")], "--format", usage=True)


# ---- option values ----------------------------------------------------------------------------------------------------
@case
def steps_zero(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--steps", "0"), "--steps 0 would write an untrained draft")


@case
def batch_size_zero(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--batch-size", "0"), "--batch-size must be")


@case
def ttt_steps_zero(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--ttt-steps", "0"), "--ttt-steps must be")


@case
def save_every_zero(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--save-every", "0"), "--save-every must be")


@case
def lr_nan(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--lr", "nan"), "--lr must be a finite number")


@case
def lr_negative(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--lr", "-1"), "--lr must be a finite number")


@case
def step_weights_wrong_count(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--step-weights", "1,2"), "--step-weights has 2 values for 3")


@case
def max_length_one(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--max-length", "1"), "--max-length must be")


@case
def draft_vocab_size_zero(w, tmp, mp, stack):
    return Case(_distill(w, tmp, "--draft-vocab-size", "0", draft=w.ds_e3), "--draft-vocab-size must be")


@case
def convert_to_unknown_kind(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--to", "medusa"), "--to must be one of")


@case
def convert_unknown_dtype(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--dtype", "int8"), "--dtype must be one of")


@case
def aux_layers_beyond_the_target(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--to", "eagle3", "--aux-layers", "1,2,9"), "aux layer ids must be")


@case
def export_unknown_format(w, tmp, mp, stack):
    return Case(["export", str(w.ds_e3), "--format", "onnx", "--out", str(tmp / "out")], "--format must be one of")


@case
def export_zero_speculative_tokens(w, tmp, mp, stack):
    argv = ["export", str(w.ds_e3), "--format", "speculators", "--out", str(tmp / "out"), "--speculative-tokens", "0"]
    return Case(argv, "--speculative-tokens must be in [1, 64]")


@case
def evaluate_k_zero(w, tmp, mp, stack):
    return Case(_evaluate(w, "-k", "0"), "--num-draft-tokens must be at least 1")


@case
def evaluate_no_new_tokens(w, tmp, mp, stack):
    return Case(_evaluate(w, "--max-new-tokens", "0"), "--max-new-tokens must be at least 1")


@case
def hub_timeout_not_a_number(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_HUB_TIMEOUT", "soon")
    return Case(["inspect", "org/repo"], "MTP2DRAFT_HUB_TIMEOUT='soon' is not a number")


# ---- sources and checkpoints ---------------------------------------------------------------------------------------
@case
def source_missing_directory(w, tmp, mp, stack):
    return Case(_convert(tmp / "nope", tmp), "does not exist")


@case
def source_is_a_file(w, tmp, mp, stack):
    (tmp / "file.bin").write_bytes(b"x")
    return Case(_convert(tmp / "file.bin", tmp), "is a file")


@case
def unknown_family(w, tmp, mp, stack):
    ck = _copy(w.mimo, tmp)
    (ck / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return Case(_convert(ck, tmp), "no spec matches")


@case
def no_mtp_layer(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    _edit_config(ck, num_nextn_predict_layers=0)
    return Case(_convert(ck, tmp), "no MTP layer")


@case
def config_is_a_json_list(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    (ck / "config.json").write_text("[1, 2, 3]")
    return Case(_convert(ck, tmp), "must hold a JSON object")


@case
def config_is_not_json(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    (ck / "config.json").write_text("{not json")
    return Case(_convert(ck, tmp), "is not valid JSON")


@case
def config_hidden_size_is_a_string(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    _edit_config(ck, hidden_size="64")
    return Case(_convert(ck, tmp), "hidden_size")


@case
def index_names_a_parent_path(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    outside = tmp / "outside.safetensors"
    save_file({"x": torch.zeros(2)}, str(outside))
    index = _index(ck)
    index["weight_map"][MTP + "eh_proj.weight"] = "../outside.safetensors"
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "lies outside the checkpoint")


@case
def index_names_an_absolute_path(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    index = _index(ck)
    index["weight_map"][MTP + "eh_proj.weight"] = "/etc/passwd"
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "lies outside the checkpoint")


@case
def inspect_index_traversal(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    index = _index(ck)
    index["weight_map"][MTP + "enorm.weight"] = "sub/../../x.safetensors"
    _write_index(ck, index)
    return Case(["inspect", str(ck)], "lies outside the checkpoint")


@case
def index_without_weight_map(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    _write_index(ck, {"metadata": {}})
    return Case(_convert(ck, tmp), "has no valid 'weight_map'")


@case
def shard_missing(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    shard = _index(ck)["weight_map"][MTP + "eh_proj.weight"]
    (ck / shard).unlink()
    return Case(_convert(ck, tmp), shard)


@case
def shard_truncated(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    shard = ck / _index(ck)["weight_map"][MTP + "eh_proj.weight"]
    shard.write_bytes(shard.read_bytes()[:-100])
    return Case(_convert(ck, tmp), "inconsistent")


@case
def shard_header_corrupt(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    shard = ck / _index(ck)["weight_map"][MTP + "eh_proj.weight"]
    shard.write_bytes(b"\xff" * 8 + shard.read_bytes()[8:])
    return Case(_convert(ck, tmp), "corrupt safetensors header")


@case
def fp8_weight_without_scale(w, tmp, mp, stack, *, fixture: str = "deepseek_v3_fp8"):
    from support.fixtures import build_fixture

    ck = build_fixture(fixture, tmp / "ck")
    index = _index(ck)
    del index["weight_map"]["model.layers.2.self_attn.kv_b_proj.weight_scale_inv"]
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "kv_b_proj.weight_scale_inv")


def _release(w, tmp: Path, scheme: str) -> Path:
    from support.quantised import requantise

    return requantise(w.ds, tmp / "ck", scheme)


def _targets_miss(scheme: str) -> CaseFn:
    """compressed-tensors config groups whose `re:` targets match no packed weight: its bits are unknown."""

    def run(w, tmp, mp, stack):
        ck = _release(w, tmp, scheme)
        q = json.loads((ck / "config.json").read_text())["quantization_config"]
        for group in q["config_groups"].values():
            group["targets"] = ["re:.*never_a_module_name$"]
        _edit_config(ck, quantization_config=q)
        return Case(_convert(ck, tmp), "no quantization_config config group targets")

    run.command = "convert"
    return run


CASES["compressed_tensors_int4_re_targets_miss_a_packed_weight"] = _targets_miss("int4")


def _linked_out(name: str) -> CaseFn:
    """A local checkpoint whose `name` is a link to a copy outside it: not read (no Hub cache snapshot either)."""

    def run(w, tmp, mp, stack):
        ck = _copy(w.ds, tmp)
        elsewhere = _copy(w.ds, tmp, "elsewhere")
        file = name if name != "shard" else sorted(p.name for p in ck.glob("*.safetensors"))[-1]
        (ck / file).unlink()
        (ck / file).symlink_to(elsewhere / file)
        return Case(_convert(ck, tmp), "is a link that leads outside the checkpoint")

    run.command = "convert"
    return run


CASES["shard_is_a_link_out_of_the_checkpoint"] = _linked_out("shard")
CASES["config_is_a_link_out_of_the_checkpoint"] = _linked_out("config.json")


# a quantised re-release of the bundled target whose index lost one part of a quantised weight -> convert's refusal:
# (scheme, the part dropped from the index, the refusal)
_PART_MISSING = {
    "fp4_weight_without_scale": (
        "fp4-e8m0",
        "self_attn.q_a_proj.scale",
        "q_a_proj.weight is stored as I8 (fp4-e8m0) but " + MTP + "self_attn.q_a_proj.scale",
    ),  # DeepSeek-V4's names: int8 `weight` beside an e8m0 `scale`
    "nvfp4_weight_without_scale": (
        "nvfp4",
        "eh_proj.weight_scale_2",
        "eh_proj.weight is stored as U8 (modelopt-nvfp4)",
    ),
    "ct_packed_weight_without_scale": (
        "int4",
        "self_attn.q_a_proj.weight_scale",
        "q_a_proj.weight_packed is ct-int data without",
    ),
}


def _part_missing_case(scheme: str, part: str, needle: str) -> CaseFn:
    def run(w, tmp, mp, stack):
        ck = _release(w, tmp, scheme)
        index = _index(ck)
        del index["weight_map"][MTP + part]
        _write_index(ck, index)
        return Case(_convert(ck, tmp), needle)

    return run


for _name, _row in _PART_MISSING.items():
    CASES[_name] = _part_missing_case(*_row)


@case
def nvfp4_scale_shape_tampered(w, tmp, mp, stack):
    from safetensors.torch import load_file, save_file

    ck = _release(w, tmp, "nvfp4")
    shard = ck / _index(ck)["weight_map"][MTP + "eh_proj.weight_scale"]
    tensors = load_file(shard)
    tensors[MTP + "eh_proj.weight_scale"] = tensors[MTP + "eh_proj.weight_scale"][:, :-1].contiguous()
    save_file(tensors, shard, {"format": "pt"})
    return Case(_convert(ck, tmp), "eh_proj.weight_scale has shape")


@case
def unknown_quant_method(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    config = json.loads((ck / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (ck / "config.json").write_text(json.dumps(config))
    return Case(_convert(ck, tmp), "quant_method 'awq' is not supported")


@case
def foreign_quantised_tensor(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    index = _index(ck)
    index["weight_map"][MTP + "self_attn.q_a_proj.qweight"] = index["weight_map"][MTP + "self_attn.q_a_proj.weight"]
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "q_a_proj.qweight is a qweight tensor of a quantisation mtp2draft does not read")


# ---- per new family: the MTP layer's keys missing, a count field that is wrong -------------------------------------
def _family(tmp: Path, fixture: str) -> Path:
    from support.fixtures import build_fixture

    return build_fixture(fixture, tmp / "ck")


def _drop_key(ck: Path, key: str) -> Path:
    index = _index(ck)
    del index["weight_map"][key]
    _write_index(ck, index)
    return ck


@case
def mimo_v2_qkv_scale_missing(w, tmp, mp, stack):
    """MiMo-V2.5's fused FP8 qkv_proj without its scale, in model_mtp.safetensors (which the index does not list)."""
    ck = _family(tmp, "mimo_v2")
    key = "model.mtp.layers.0.self_attn.qkv_proj.weight"
    kept = {k: v for k, v in load_file(str(ck / "model_mtp.safetensors")).items() if k != key + "_scale_inv"}
    save_file(kept, str(ck / "model_mtp.safetensors"), {"format": "pt"})
    return Case(_convert(ck, tmp), f"FP8 weight {key} has no {key}_scale_inv")


@case
def glm4_moe_lite_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "glm4_moe_lite"), "model.layers.2.hnorm.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing model.layers.2.hnorm.weight (spec glm4_moe_lite)")


# a family's fixture whose config.json says one thing wrong -> convert's refusal: (family, fields set, refusal)
_CONFIG_EDITS = {
    "glm4_moe_lite_count_field_not_a_number": (
        "glm4_moe_lite",
        {"num_nextn_predict_layers": "one"},
        "num_nextn_predict_layers = 'one' is not a count of MTP layers",
    ),
    "hy_v3_count_field_negative": (
        "hy_v3",
        {"num_nextn_predict_layers": -1},
        "num_nextn_predict_layers = -1 is not a count of MTP layers",
    ),
    "nemotron_h_count_field_zero": (
        "nemotron_h",
        {"num_nextn_predict_layers": 0},
        "has no MTP layer (num_nextn_predict_layers is 0)",
    ),
    "nemotron_h_count_field_not_a_number": (
        "nemotron_h",
        {"num_nextn_predict_layers": "two"},
        "num_nextn_predict_layers = 'two' is not a count of MTP layers",
    ),
    "bailing_hybrid_count_field_fractional": (
        "bailing_hybrid",
        {"num_nextn_predict_layers": 1.5},
        "num_nextn_predict_layers = 1.5 is not a count of MTP layers",
    ),
    "deepseek_v4_wrong_hc_mult": (
        "deepseek_v4",
        {"hc_mult": 2},
        "tensor mtp.0.hc_head_fn has shape [4, 256] but the config implies [2, 128]",
    ),  # config.json says 2 residual streams, the tensors were made for 4.
    "qwen3_5_moe_flat_declares_no_mtp_layer": (
        "qwen3_5_moe_flat",
        {"mtp_num_hidden_layers": 0},
        "mtp_num_hidden_layers is 0",
    ),  # Qwen3.8's flat config: the top-level mtp_num_hidden_layers counts (there is no text_config to read).
    "nemotron_h_lightning_config_says_latent_moe": (
        "nemotron_h_lightning",
        {"moe_latent_size": 32},
        "lacks tensors the nemotron_h block needs: block.mlp.fc1_latent_proj.weight",
    ),  # Super's latent MoE declared over Lightning's latent-free MTP layer
    "nemotron_h_super_config_says_no_latent_moe": (
        "nemotron_h",
        {"moe_latent_size": None},
        "has tensors the nemotron_h block does not use: mtp.layers.1.mixer.fc1_latent_proj.weight",
    ),  # Lightning's config over Super's weights: the latent projections are not dropped silently
    "mimo_v2_qkv_shard_count_not_dividing_the_heads": (
        "mimo_v2",
        {"num_key_value_heads": 3},
        "is pre-sharded at 3 chunks, which do not divide 8 query / 4 key-value heads",
    ),  # MiMo-V2.5's fused qkv is pre-sharded for num_key_value_heads ranks: 3 cannot split it.
    "mimo_v2_qkv_shard_count_disagreeing_with_the_scales": (
        "mimo_v2",
        {"num_key_value_heads": 1},
        "qkv_proj.weight_scale_inv has shape [4, 1], expected [3, 1]",
    ),  # one chunk would split the rows evenly, but the per-chunk scale grid (2 chunks of 2 block rows) says no.
    "mimo_v2_odd_swa_kv_heads": (
        "mimo_v2",
        {"swa_num_key_value_heads": 3},
        "swa_num_key_value_heads is 3, which 'swa_num_key_value_heads / 2' does not divide",
    ),  # transformers doubles num_key_value_heads on SWA layers: an odd SWA count has no transformers config.
    "qwen3_5_flat_declares_no_mtp_layer": (
        "qwen3_5_flat",
        {"mtp_num_hidden_layers": 0},
        "mtp_num_hidden_layers is 0",
    ),  # the dense flat config: its own top-level count as well
}


def _config_edit_case(family: str, edits: dict, needle: str) -> CaseFn:
    def run(w, tmp, mp, stack):
        ck = _family(tmp, family)
        _edit_config(ck, **edits)
        return Case(_convert(ck, tmp), needle)

    return run


for _name, _row in _CONFIG_EDITS.items():
    CASES[_name] = _config_edit_case(*_row)

# a fixture whose MTP count (in `section`, or at the top level) declares more layers than its weights hold -> the
# refusal of `inspect` (layer None) or of `convert --layer N`: (family, section, count, layer, refusal)
_COUNT_SAYS_MORE = {
    "glm4_moe_lite_count_field_says_two": (
        "glm4_moe_lite",
        None,
        2,
        None,
        "MTP layer 1 is missing model.layers.3.enorm.weight",
    ),
    "glm_moe_dsa_count_field_says_two": (
        "glm_moe_dsa",
        None,
        2,
        1,
        "MTP layer 1 is missing model.layers.5.enorm.weight",
    ),
    "hy_v3_count_field_says_two": ("hy_v3", None, 2, None, "MTP layer 1 is missing model.layers.3.enorm.weight"),
    "glm_ocr_count_field_says_two": (
        "glm_ocr",
        "text_config",
        2,
        1,
        "MTP layer 1 is missing model.language_model.layers.3.enorm.weight",
    ),
    # exaone: layer 1's block keys are absent (its glue is shared)
    "exaone4_5_count_field_says_two": ("exaone4_5", "text_config", 2, 1, "lacks tensors the exaone4_5 block needs"),
    "exaone_moe_count_field_says_two": ("exaone_moe", None, 2, 1, "lacks tensors the exaone_moe block needs"),
    "bailing_hybrid_count_field_says_two": (
        "bailing_hybrid",
        None,
        2,
        None,
        "MTP layer 1 is missing model.layers.5.enorm.weight",
    ),
    # two declared in llm_config, a layer asked for past them: the count is read from llm_config
    "nemotron_h_super_omni_count_field_says_two": (
        "nemotron_h_super_omni",
        "llm_config",
        2,
        2,
        "--layer 2 is out of range",
    ),
    "glm5_next_count_field_says_two": (
        "glm5_next",
        "text_config",
        2,
        None,
        "MTP layer 1 is missing model.language_model.layers.5.enorm.weight",
    ),
    "hy_v4_count_field_says_two": ("hy_v4", None, 2, None, "MTP layer 1 is missing model.mtp_layers.1.enorm.weight"),
    # convert of the layer that is there refuses the checkpoint as inspect does: its config is not whole
    "hy_v3_count_field_says_two_convert_layer_0": (
        "hy_v3",
        None,
        2,
        0,
        "MTP layer 1 is missing model.layers.3.enorm.weight",
    ),
    "glm4_moe_lite_count_field_says_two_convert_layer_0": (
        "glm4_moe_lite",
        None,
        2,
        0,
        "MTP layer 1 is missing model.layers.3.enorm.weight",
    ),
}


def _count_case(family: str, section: str | None, count: int, layer: int | None, needle: str) -> CaseFn:
    def run(w, tmp, mp, stack):
        ck = _family(tmp, family)
        if section:
            cfg = json.loads((ck / "config.json").read_text())
            _edit_config(ck, **{section: {**cfg[section], "num_nextn_predict_layers": count}})
        else:
            _edit_config(ck, num_nextn_predict_layers=count)
        argv = ["inspect", str(ck)] if layer is None else _convert(ck, tmp, "--layer", str(layer))
        return Case(argv, needle)

    run.command = "inspect" if layer is None else "convert"  # for the case table (case_tables.command_of)
    return run


def _count_moved_case(family: str) -> CaseFn:
    """The count lives in text_config; a config that moved it to the top level declares no MTP layer."""

    def run(w, tmp, mp, stack):
        ck = _family(tmp, family)
        cfg = json.loads((ck / "config.json").read_text())
        text = {k: v for k, v in cfg["text_config"].items() if k != "num_nextn_predict_layers"}
        _edit_config(ck, text_config=text, num_nextn_predict_layers=1)
        return Case(_convert(ck, tmp), "has no MTP layer (num_nextn_predict_layers is absent)")

    return run


for _name, _row in _COUNT_SAYS_MORE.items():
    CASES[_name] = _count_case(*_row)
for _family_name in ("glm_ocr", "glm5_next"):
    CASES[f"{_family_name}_count_field_at_the_top_level_only"] = _count_moved_case(_family_name)


@case
def nemotron_h_lightning_mtp_file_missing(w, tmp, mp, stack):
    """Lightning's MTP layer lives in model_mtp.safetensors, outside the index: without the file there is none."""
    ck = _family(tmp, "nemotron_h_lightning")
    (ck / "model_mtp.safetensors").unlink()
    return Case(_convert(ck, tmp), "its index holds no MTP weights (looked for mtp.layers.0.eh_proj.weight)")


@case
def glm_moe_dsa_indexer_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "glm_moe_dsa"), "model.layers.4.self_attn.indexer.wk.weight")
    return Case(_convert(ck, tmp), "lacks tensors the glm_moe_dsa block needs: block.self_attn.indexer.wk.weight")


@case
def hy_v3_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "hy_v3"), "model.layers.2.final_layernorm.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing model.layers.2.final_layernorm.weight (spec hy_v3)")


@case
def hy_v3_router_bias_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "hy_v3"), "model.layers.2.mlp.expert_bias")
    return Case(_convert(ck, tmp), "lacks tensors the hy_v3 block needs: block.mlp.e_score_correction_bias")


@case
def glm_ocr_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "glm_ocr"), "model.language_model.layers.2.post_mlp_layernorm.weight")
    return Case(_convert(ck, tmp), "lacks tensors the glm_ocr block needs: block.post_mlp_layernorm.weight")


@case
def glm_ocr_to_eagle3(w, tmp, mp, stack):
    ck = _family(tmp, "glm_ocr")
    return Case(_convert(ck, tmp, "--to", "eagle3"), "glm_ocr has no EAGLE-3 conversion")


@case
def exaone4_5_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "exaone4_5"), "mtp.pre_fc_norm_hidden.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing mtp.pre_fc_norm_hidden.weight (spec exaone4_5)")


@case
def exaone4_5_block_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "exaone4_5"), "mtp.layers.0.post_feedforward_layernorm.weight")
    return Case(_convert(ck, tmp), "lacks tensors the exaone4_5 block needs: block.post_feedforward_layernorm.weight")


@case
def exaone4_5_count_field_not_a_number(w, tmp, mp, stack):
    ck = _family(tmp, "exaone4_5")
    cfg = json.loads((ck / "config.json").read_text())
    _edit_config(ck, text_config={**cfg["text_config"], "num_nextn_predict_layers": "1"})
    return Case(_convert(ck, tmp), "num_nextn_predict_layers = '1' is not a count of MTP layers")


@case
def nemotron_h_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "nemotron_h"), "mtp.layers.1.final_layernorm.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing mtp.layers.1.final_layernorm.weight (spec nemotron_h)")


@case
def nemotron_h_expert_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "nemotron_h"), "mtp.layers.1.mixer.experts.3.down_proj.weight")
    return Case(_convert(ck, tmp), "mlp.experts: incomplete expert weights")  # the module name, after the rename


@case
def exaone_moe_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "exaone_moe"), "mtp.pre_fc_norm_embedding.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing mtp.pre_fc_norm_embedding.weight (spec exaone_moe)")


@case
def exaone_moe_block_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "exaone_moe"), "mtp.layers.0.self_attn.k_norm.weight")
    return Case(_convert(ck, tmp), "lacks tensors the exaone_moe block needs: block.self_attn.k_norm.weight")


@case
def exaone_moe_count_field_not_a_number(w, tmp, mp, stack):
    ck = _family(tmp, "exaone_moe")
    _edit_config(ck, num_nextn_predict_layers=[1])
    return Case(["inspect", str(ck)], "num_nextn_predict_layers = [1] is not a count of MTP layers")


@case
def bailing_hybrid_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "bailing_hybrid"), "model.layers.4.final_layernorm.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing model.layers.4.final_layernorm.weight (spec bailing_hybrid)")


@case
def bailing_hybrid_gate_missing(w, tmp, mp, stack):
    """The MLA layer's head-wise output gate (attention.g_proj) absent: named by its module key, not ignored."""
    ck = _drop_key(_family(tmp, "bailing_hybrid"), "model.layers.4.attention.g_proj.weight")
    return Case(_convert(ck, tmp), "lacks tensors the bailing_hybrid block needs: block.self_attn.g_proj.weight")


@case
def nemotron_h_omni_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "nemotron_h_omni"), "language_model.mtp.layers.0.hnorm.weight")
    return Case(
        _convert(ck, tmp), "MTP layer 0 is missing language_model.mtp.layers.0.hnorm.weight (spec nemotron_h_omni)"
    )


@case
def nemotron_h_omni_sublayer_norm_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "nemotron_h_omni"), "language_model.mtp.layers.1.norm.weight")
    return Case(
        _convert(ck, tmp), "lacks tensors the nemotron_h_omni block needs: block.post_attention_layernorm.weight"
    )


@case
def nemotron_h_omni_count_field_zero(w, tmp, mp, stack):
    """The count is read from llm_config, not the top level: 0 there means no MTP layer, whatever the weights."""
    ck = _family(tmp, "nemotron_h_omni")
    cfg = json.loads((ck / "config.json").read_text())
    _edit_config(ck, llm_config={**cfg["llm_config"], "num_nextn_predict_layers": 0})
    return Case(_convert(ck, tmp), "has no MTP layer (num_nextn_predict_layers is 0)")


@case
def nemotron_h_omni_count_field_not_a_number(w, tmp, mp, stack):
    ck = _family(tmp, "nemotron_h_omni")
    cfg = json.loads((ck / "config.json").read_text())
    _edit_config(ck, llm_config={**cfg["llm_config"], "num_nextn_predict_layers": "one"})
    return Case(["inspect", str(ck)], "num_nextn_predict_layers = 'one' is not a count of MTP layers")


@case
def nemotron_h_super_omni_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "nemotron_h_super_omni"), "mtp.layers.1.final_layernorm.weight")
    return Case(
        _convert(ck, tmp), "MTP layer 0 is missing mtp.layers.1.final_layernorm.weight (spec nemotron_h_super_omni)"
    )


@case
def nemotron_h_super_omni_mtp_under_language_model(w, tmp, mp, stack):
    """The Super VL layout (MTP under language_model.) with this architecture: no MTP weights where the spec looks."""
    ck = _family(tmp, "nemotron_h_super_omni")
    index = _index(ck)
    index["weight_map"] = {
        ("language_model." + k if k.startswith("mtp.") else k): v for k, v in index["weight_map"].items()
    }
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "holds no MTP weights (looked for mtp.layers.0.eh_proj.weight)")


@case
def nemotron_h_super_omni_count_field_negative(w, tmp, mp, stack):
    ck = _family(tmp, "nemotron_h_super_omni")
    cfg = json.loads((ck / "config.json").read_text())
    _edit_config(ck, llm_config={**cfg["llm_config"], "num_nextn_predict_layers": -2})
    return Case(["inspect", str(ck)], "num_nextn_predict_layers = -2 is not a count of MTP layers")


@case
def dspark_under_mtp_convert(w, tmp, mp, stack):
    """DeepSeek-V4-0731: a DSpark block drafter under mtp.*, num_nextn_predict_layers 1 all the same; --to asks for a
    draft made from an MTP layer, which it is not."""
    return Case(_convert(_family(tmp, "deepseek_v4_0731_dspark"), tmp, "--to", "eagle3"), "are a DSpark block drafter")


@case
def dspark_target_layers_disagree_with_main_proj(w, tmp, mp, stack):
    """Two target layers in config.json, a context projection fed three: inspect names both."""
    ck = _family(tmp, "deepseek_v4_0731_dspark")
    _edit_config(ck, dspark_target_layer_ids=[1, 2])
    return Case(["inspect", str(ck)], "mtp.0.main_proj.weight is [64, 192], but 2 target layers")


@case
def dspark_without_markov_head_convert(w, tmp, mp, stack):
    """DeepSeek-V4.1 naming (model_type deepseek_v41), the DSpark fields, and a last stage that lost its Markov head
    (a partial download): the tensors are not the drafter the config declares."""
    ck = _family(tmp, "deepseek_v4_0731_dspark")
    _edit_config(ck, model_type="deepseek_v41")
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if ".markov_head." not in k}
    _write_index(ck, index)
    return Case(_convert(ck, tmp), "mtp.* is not one: no mtp.2.markov_head.markov_w1.weight")


@case
def dspark_v41_stage_experts_disagree_convert(w, tmp, mp, stack):
    """DeepSeek-V4.1: each stage holds dspark_n_routed_experts (3) experts; a config saying 5 is not the drafter the
    tensors hold (vLLM 0.32 builds the stages from the config and would not load them)."""
    ck = _family(tmp, "deepseek_v41_dspark")
    cfg = json.loads((ck / "config.json").read_text())
    _edit_config(ck, text_config={**cfg["text_config"], "dspark_n_routed_experts": 5})
    return Case(_convert(ck, tmp), "holds 3 routed experts (ids 0..2), but config.json says 5")


@case
def dspark_target_for_distill(w, tmp, mp, stack):
    return Case(_distill(w, tmp, target=_family(tmp, "deepseek_v4_0731_dspark")), "DSpark block drafter")


@case
def deepseek_v4_e_proj_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "deepseek_v4"), "mtp.0.e_proj.weight")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing mtp.0.e_proj.weight (spec deepseek_v4)")


@case
def deepseek_v4_hc_head_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "deepseek_v4"), "mtp.0.hc_head_fn")
    return Case(_convert(ck, tmp), "MTP layer 0 is missing mtp.0.hc_head_fn (spec deepseek_v4)")


def _v4_shipped(tmp: Path, key: str | None = None, fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Path:
    """DeepSeek-V4 in the release's quantisation (FP4 / FP8 with e8m0 `.scale`), one stored tensor rewritten."""
    ck = _family(tmp, "deepseek_v4_fp4")
    if key is not None:
        _rewrite_tensor(ck, key, fn)
    return ck


def _v4_draft_and_target(tmp: Path, key: str, fn: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """(a native draft of the shipped V4 fixture, a copy of that target with `key` rewritten or, without `fn`,
    dropped from its index)."""
    from mtp2draft.conversion import convert

    convert(str(_v4_shipped(tmp)), tmp / "draft", to="mtp")
    target = _copy(tmp / "ck", tmp, "target")
    if fn is None:
        return tmp / "draft", _drop_key(target, key)
    _rewrite_tensor(target, key, fn)
    return tmp / "draft", target


@case
def deepseek_v4_expert_scale_tampered(w, tmp, mp, stack):
    """An FP4 expert whose e8m0 `.scale` lost a column (one per 32 inputs): refused before anything is written."""
    ck = _v4_shipped(tmp, "mtp.0.ffn.experts.3.w2.scale", lambda t: t[:, :-1].contiguous())
    return Case(_convert(ck, tmp), "mtp.0.ffn.experts.3.w2.scale has shape [64, 0], expected [64, 1]")


@case
def deepseek_v4_fp8_scale_nan(w, tmp, mp, stack):
    """An e8m0 scale byte 255 is NaN: the dequantised weight is refused as damaged."""
    ck = _v4_shipped(tmp, "mtp.0.h_proj.scale", lambda t: torch.full_like(t.view(torch.uint8), 255).view(t.dtype))
    return Case(_convert(ck, tmp), "mtp.0.h_proj.weight holds non-finite values")


@case
def deepseek_v4_fp8_scale_stored_as_bf16(w, tmp, mp, stack):
    """An e8m0 `.scale` rewritten as bf16 (the same powers of two): the refusal names the tensor."""
    ck = _v4_shipped(tmp, "mtp.0.h_proj.scale", lambda t: t.float().to(torch.bfloat16))
    return Case(_convert(ck, tmp), "mtp.0.h_proj.scale is stored as torch.bfloat16: an e8m0 scale must be")


# `export --format stitched` of a V4 draft over a damaged target: the tensor damaged (how; None: removed) -> the refusal
_V4_STITCHED = {
    # the e_proj `.scale` is not the [ceil(N/128), ceil(K/128)] its FP8 weight needs: the export would write a scale
    # the engine reads differently from the target's
    "over_a_tampered_scale": (
        "mtp.0.e_proj.scale",
        lambda t: torch.cat([t, t]).contiguous(),
        "the draft's mtp.0.e_proj.scale would be [1, 1], the target stores [2, 1]",
    ),
    "target_without_hc_head": ("mtp.0.hc_head_base", None, "the draft's mtp.0.hc_head_base has no counterpart"),
    # a stream tensor's FP8 weight without its `.scale`: not readable, not writable back
    "target_without_e_proj_scale": ("mtp.0.e_proj.scale", None, "mtp.0.e_proj.weight"),
}


def _v4_stitched_case(key: str, damage: Callable | None, needle: str) -> CaseFn:
    def run(w, tmp, mp, stack):
        draft, target = _v4_draft_and_target(tmp, key, damage)
        argv = ["export", str(draft), "--format", "stitched", "--target", str(target), "--out", str(tmp / "o")]
        return Case(argv, needle)

    return run


for _name, _row in _V4_STITCHED.items():
    CASES[f"deepseek_v4_stitched_{_name}"] = _v4_stitched_case(*_row)


@case
def deepseek_v4_hc_mult_not_a_count(w, tmp, mp, stack):
    ck = _family(tmp, "deepseek_v4")
    _edit_config(ck, hc_mult=0)
    return Case(["inspect", str(ck)], "hc_mult = 0 is not a count of residual streams")


@case
def deepseek_v4_config_with_dspark_fields(w, tmp, mp, stack):
    """A V4 checkpoint whose config.json carries V4-0731's DSpark fields over an MTP layer: the tensors disagree."""
    from support import hub_keys

    ck = _family(tmp, "deepseek_v4")
    dspark = hub_keys.load("deepseek_v4_0731_dspark")["config"]
    _edit_config(ck, **{k: v for k, v in dspark.items() if k.startswith("dspark_")})
    return Case(["inspect", str(ck)], "declares a DSpark drafter (dspark_block_size = 5) but mtp.* is not one")


_GLM5 = "model.language_model.layers.4."  # glm5_next's MTP layer in the fixture (4 trunk layers; 45 on the release)


@case
def glm5_next_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "glm5_next"), _GLM5 + "hnorm.weight")
    return Case(_convert(ck, tmp), f"MTP layer 0 is missing {_GLM5}hnorm.weight (spec glm5_next)")


@case
def glm5_next_indexer_kpool_gate_missing(w, tmp, mp, stack):
    """The k-pool indexer's compression gate (GLM-5.3's own, not GLM-5's) absent: named by its module key."""
    ck = _drop_key(_family(tmp, "glm5_next"), _GLM5 + "self_attn.indexer.index_kpool_compress_gate")
    return Case(
        _convert(ck, tmp), "lacks tensors the glm5_next block needs: block.self_attn.indexer.index_kpool_compress_gate"
    )


@case
def glm5_next_fp8_weight_without_scale(w, tmp, mp, stack):
    """The FP8 release's q_a_proj (an FP8 block) with its `_scale_inv` gone from the index: not dequantised blind."""
    ck = _drop_key(_family(tmp, "glm5_next_fp8"), _GLM5 + "self_attn.q_a_proj.weight_scale_inv")
    return Case(_convert(ck, tmp), f"FP8 weight {_GLM5}self_attn.q_a_proj.weight has no {_GLM5}self_attn.q_a_proj")


@case
def qwen3_5_flat_mlp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "qwen3_5_flat"), "mtp.layers.0.mlp.up_proj.weight")
    return Case(_convert(ck, tmp), "lacks tensors the qwen3_5_flat block needs: block.mlp.up_proj.weight")


@case
def qwen3_5_flat_tied_with_the_vl_prefix(w, tmp, mp, stack):
    """A tied text-only export whose trunk keeps the VL prefix (model.language_model.*, no lm_head.weight): the spec
    names the clean embedding key, so the head EAGLE-3 copies (the embedding) is not found; refused, not guessed.
    (The native draft converts: it reads only mtp.*.)"""
    ck = _family(tmp, "qwen3_5_flat")
    index = _index(ck)
    for shard in set(index["weight_map"].values()):
        tensors = load_file(str(ck / shard))
        renamed = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in tensors.items()}
        save_file(renamed, str(ck / shard), metadata={"format": "pt"})
    index["weight_map"] = {
        ("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in index["weight_map"].items()
    }
    _write_index(ck, index)
    return Case(_convert(ck, tmp, "--to", "eagle3"), "the checkpoint has no embedding (model.embed_tokens.weight)")


@case
def unindexed_mtp_file_holds_an_indexed_tensor(w, tmp, mp, stack):
    """model_mtp.safetensors (not in the index) holding a tensor the index also places: which copy counts is unknown."""
    from mtp2draft.outputs.writer import save_tensors

    ck = _family(tmp, "nemotron_h")
    save_tensors(ck / "model_mtp.safetensors", {"mtp.layers.0.eh_proj.weight": torch.zeros(2, 2)}, {"format": "pt"})
    return Case(_convert(ck, tmp), "refusing to guess which copy is the checkpoint's")


@case
def unindexed_mtp_file_is_garbage(w, tmp, mp, stack):
    ck = _family(tmp, "nemotron_h")
    (ck / "model_mtp.safetensors").write_bytes(b"\xff" * 64)
    return Case(_convert(ck, tmp), "model_mtp.safetensors: corrupt safetensors header")


@case
def not_supported_family_convert(w, tmp, mp, stack):
    """Kimi-K3 (model_specs/not_supported/): its reason, not "no spec matches"."""
    return Case(_convert(_family(tmp, "kimi_k3"), tmp), "not supported, because transformers 5.24 has no kimi_k3")


@case
def not_supported_family_inspect(w, tmp, mp, stack):
    return Case(
        ["inspect", str(_family(tmp, "gemma4_assistant"))], "separate draft checkpoint that reads the target's KV"
    )


@case
def not_supported_target_for_distill(w, tmp, mp, stack):
    """MiniMax-M2's config declares three MTP modules; the release holds none."""
    return Case(_distill(w, tmp, target=_family(tmp, "minimax_m2")), "its MTP weights are unpublished")


@case
def expert_of_the_wrong_shape(w, tmp, mp, stack):
    key = MTP + "mlp.experts.0.gate_proj.weight"
    ck = _broken_ds(w, tmp, key, lambda t: torch.zeros(t.shape[0] + 3, t.shape[1], dtype=t.dtype))
    return Case(_convert(ck, tmp), "gate_proj")


@case
def nan_in_an_mtp_tensor(w, tmp, mp, stack):
    ck = _broken_ds(w, tmp, MTP + "eh_proj.weight", lambda t: t.index_fill(0, torch.tensor([0]), float("nan")))
    return Case(_convert(ck, tmp), MTP + "eh_proj.weight holds non-finite values (128 NaN")


@case
def inf_in_an_mtp_tensor_eagle3(w, tmp, mp, stack):
    ck = _broken_ds(w, tmp, MTP + "enorm.weight", lambda t: t.index_fill(0, torch.tensor([1]), float("inf")))
    return Case(_convert(ck, tmp, "--to", "eagle3"), MTP + "enorm.weight holds non-finite values (0 NaN, 1 Inf")


@case
def int16_weight(w, tmp, mp, stack):
    ck = _broken_ds(w, tmp, MTP + "eh_proj.weight", lambda t: (t * 100).to(torch.int16))
    return Case(_convert(ck, tmp), "must be floating point")


@case
def layer_out_of_range(w, tmp, mp, stack):
    return Case(_convert(w.ds, tmp, "--layer", "5"), "out of range")


# ---- outputs ---------------------------------------------------------------------------------------------------------
@case
def out_is_the_source(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    return Case(["convert", str(ck), "--out", str(ck), "--overwrite"], "is the input")


@case
def out_contains_the_source(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp / "models")
    return Case(["convert", str(ck), "--out", str(tmp / "models"), "--overwrite"], "contains the input")


@case
def out_inside_the_source(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    return Case(["convert", str(ck), "--out", str(ck / "draft")], "lies inside the input")


@case
def out_is_the_working_directory(w, tmp, mp, stack):
    mp.chdir(tmp)
    return Case(["convert", str(w.ds), "--out", ".", "--overwrite"], "working directory")


@case
def overwrite_a_directory_we_did_not_write(w, tmp, mp, stack):
    (tmp / "out").mkdir()
    (tmp / "out" / "thesis.tex").write_text("years of work")
    return Case(_convert(w.ds, tmp, "--overwrite"), "did not write")


@case
def out_is_a_file(w, tmp, mp, stack):
    (tmp / "out").write_text("x")
    return Case(_convert(w.ds, tmp), "is a file")


@case
def resume_into_a_users_directory(w, tmp, mp, stack):
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("mine")
    return Case(_distill(w, tmp, "--resume"), "not empty")


@case
def export_over_its_own_input(w, tmp, mp, stack):
    draft = _copy(w.ds_e3, tmp, "draft")
    return Case(["export", str(draft), "--format", "sglang", "--out", str(draft), "--overwrite"], "is the input")


@case
def disk_full_while_converting(w, tmp, mp, stack):
    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    mp.setattr("mtp2draft.outputs.writer.SafetensorsWriter.write", full)
    return Case(_convert(w.ds, tmp), "No space left on device", code=1)


@case
def disk_full_while_saving_a_distill_checkpoint(w, tmp, mp, stack):
    def full(*_a, checkpoint_id=None, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(checkpoint_id))

    mp.setattr("torch.distributed.checkpoint.save", full)  # checkpoints are DCP folders
    return Case(_distill(w, tmp, "--save-every", "1"), "No space left on device", code=1)


@case
def read_only_export_location(w, tmp, mp, stack):
    real = os.replace

    def read_only(src, dst):
        if ".out.tmp-" in str(src):
            raise OSError(errno.EROFS, "Read-only file system", str(dst))
        return real(src, dst)

    mp.setattr("mtp2draft.outputs.directories.os.replace", read_only)
    return Case(
        ["export", str(w.ds_e3), "--format", "sglang", "--out", str(tmp / "out")], "Read-only file system", code=1
    )


# ---- data ------------------------------------------------------------------------------------------------------------
@case
def data_file_missing(w, tmp, mp, stack):
    argv = _distill(w, tmp)
    argv[argv.index("--data") + 1] = str(tmp / "missing.jsonl")
    return Case(argv, "does not exist")


@case
def data_not_utf8(w, tmp, mp, stack):
    argv = _distill(w, tmp)
    argv[argv.index("--data") + 1] = str(_data(tmp, b'{"text": "ok"}\n\xff\xfe{"text": 1}\n'))
    return Case(argv, ":2: not UTF-8")


@case
def data_not_utf8_even_skipped_leaves_nothing(w, tmp, mp, stack):
    argv = _distill(w, tmp, "--skip-bad")
    argv[argv.index("--data") + 1] = str(_data(tmp, b"\xff\xfe\n\xc3\x28\n"))
    return Case(argv, "holds no usable records (2 malformed lines skipped)")


@case
def data_not_json(w, tmp, mp, stack):
    argv = _distill(w, tmp)
    argv[argv.index("--data") + 1] = str(_data(tmp, b"def f(): pass\n"))
    return Case(argv, ":1: not valid JSON")


@case
def data_record_without_text(w, tmp, mp, stack):
    argv = _distill(w, tmp)
    argv[argv.index("--data") + 1] = str(_data(tmp, b'{"prompt": "x"}\n'))
    return Case(argv, "needs 'text' or 'messages'")


@case
def data_unknown_role(w, tmp, mp, stack):
    argv = _evaluate(w)
    argv[argv.index("--data") + 1] = str(_data(tmp, b'{"messages": [{"role": "wizard", "content": "x"}]}\n'))
    return Case(argv, "unknown role")


@case
def distill_without_data_or_target(w, tmp, mp, stack):
    return Case(["distill", str(w.ds_mtp), "--out", str(tmp / "out")], "needs --data and --target")


@case
def distill_hidden_states_missing(w, tmp, mp, stack):
    return Case(["distill", str(w.ds_mtp), "--hidden-states", str(tmp / "nope"), "--out", str(tmp / "out")], "nope")


# ---- targets ---------------------------------------------------------------------------------------------------------
@case
def target_with_pickle_weights_only(w, tmp, mp, stack):
    ck = tmp / "pickled"
    ck.mkdir()
    shutil.copyfile(w.ds / "config.json", ck / "config.json")
    (ck / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    return Case(_distill(w, tmp, target=ck), "never loads pickles")


@case
def target_index_reads_outside(w, tmp, mp, stack):
    ck = _copy(w.ds, tmp)
    index = _index(ck)
    index["weight_map"]["model.embed_tokens.weight"] = "../../../etc/passwd"
    _write_index(ck, index)
    return Case(_evaluate(w, target=ck), "lies outside the checkpoint")


@case
def draft_from_another_family(w, tmp, mp, stack):
    return Case(_distill(w, tmp, draft=w.mimo_mtp), "was made for a mimo target")


@case
def evaluate_draft_from_another_family(w, tmp, mp, stack):
    return Case(_evaluate(w, draft=w.mimo_mtp), "was made for a mimo target")


@case
def evaluate_missing_draft(w, tmp, mp, stack):
    return Case(_evaluate(w, draft=tmp / "no-draft"), "does not exist")


# ---- validate ----------------------------------------------------------------------------------------------------------
@case
def validate_aux_ids_beyond_the_target(w, tmp, mp, stack):
    draft = _copy(w.ds_e3, tmp, "draft")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]  # SGLang's terms for DeepSeek (first id 1)
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 3, 10]  # vLLM's: the same layers' outputs, as inputs of i + 1
    cfg["mtp2draft"].pop("target_num_layers")  # only the target tells
    (draft / "config.json").write_text(json.dumps(cfg))
    return Case(["validate", str(draft), "--target", str(w.ds)], "violation", stdout="beyond the target's 6 layers")


@case
def validate_missing_directory(w, tmp, mp, stack):
    return Case(["validate", str(tmp / "nothing")], "is not a directory")


@case
def validate_without_config(w, tmp, mp, stack):
    (tmp / "empty").mkdir()
    return Case(["validate", str(tmp / "empty")], "has no config.json")


# ---- network ---------------------------------------------------------------------------------------------------------
@case
def hub_endpoint_refuses_connections(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_HUB_RETRIES", "0")  # conftest points HF_ENDPOINT at a closed loopback port
    return Case(["inspect", "org/repo"], "unreachable: cannot connect")


@case
def hub_endpoint_refuses_convert(w, tmp, mp, stack):
    mp.setenv("MTP2DRAFT_HUB_RETRIES", "0")
    return Case(_convert("org/repo", tmp), "unreachable: cannot connect")


@case
def hub_endpoint_never_answers_convert(w, tmp, mp, stack):
    from support.hub_server import SilentServer

    server = stack.enter_context(SilentServer())
    stack.enter_context(server.activate())
    mp.setenv("MTP2DRAFT_HUB_TIMEOUT", "0.5")
    mp.setenv("MTP2DRAFT_HUB_RETRIES", "0")
    return Case(_convert("org/repo", tmp), "no answer within 0.5 s")


@case
def hub_endpoint_never_answers_push(w, tmp, mp, stack):
    from support.hub_server import SilentServer

    export = tmp / "export"
    assert main(["export", str(w.ds_e3), "--format", "sglang", "--out", str(export)]) == 0
    server = stack.enter_context(SilentServer())
    stack.enter_context(server.activate())
    mp.setenv("MTP2DRAFT_HUB_TIMEOUT", "0.5")
    return Case(["push", str(export), "--repo-id", "me/draft"], "no answer within 0.5 s")


@case
def push_without_a_token(w, tmp, mp, stack):
    from huggingface_hub import constants

    export = tmp / "export"
    assert main(["export", str(w.ds_e3), "--format", "sglang", "--out", str(export)]) == 0
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        mp.delenv(var, raising=False)
    mp.setattr(constants, "HF_TOKEN_PATH", str(tmp / "no-token"))
    mp.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp / "no-tokens"))
    return Case(["push", str(export), "--repo-id", "me/draft"], "no Hugging Face token")


def _edit_text_config(ck: Path, **changes) -> Path:
    cfg = json.loads((ck / "config.json").read_text())
    cfg["text_config"].update(changes)
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


@case
def step3p7_own_head_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "step3p7"), "model.layers.5.transformer.shared_head.output.weight")
    return Case(
        _convert(ck, tmp, "--layer", "1"), "MTP layer 1 is missing model.layers.5.transformer.shared_head.output"
    )


@case
def step3p7_layer_list_without_mtp_entries(w, tmp, mp, stack):
    ck = _family(tmp, "step3p7")
    layer_types = json.loads((ck / "config.json").read_text())["text_config"]["layer_types"]
    _edit_text_config(ck, layer_types=layer_types[:6])  # the trunk's 4 and 2 of the 3 MTP layers' entries
    return Case(_convert(ck, tmp), "layer_types has 6 entries; MTP layer 0 needs 4 trunk + 3 MTP entries")


@case
def step3p7_sliding_heads_not_the_checkpoints(w, tmp, mp, stack):
    ck = _family(tmp, "step3p7")
    other = {"attention_type": "sliding_attention", "num_attention_heads": 4, "num_attention_groups": 2, "head_dim": 16}
    _edit_text_config(ck, attention_other_setting=other)  # the sliding layers' heads said to be the full layers' 4
    return Case(
        _convert(ck, tmp, "--layer", "1"),
        "tensor model.layers.5.self_attn.g_proj.weight has shape [8, 64] but the config implies [4, 64]",  # a gate per head
    )


_HY4 = "model.mtp_layers.0."  # hy_v4's MTP layer (outside model.layers, at any trunk depth)


@case
def hy_v4_mtp_key_missing(w, tmp, mp, stack):
    ck = _drop_key(_family(tmp, "hy_v4"), _HY4 + "final_layernorm.weight")
    return Case(_convert(ck, tmp), f"MTP layer 0 is missing {_HY4}final_layernorm.weight (spec hy_v4)")


@case
def hy_v4_attention_sinks_missing(w, tmp, mp, stack):
    """The attention sinks (learnable_sink_param on the hub) absent: named by their module key, never left at init."""
    ck = _drop_key(_family(tmp, "hy_v4"), _HY4 + "self_attn.learnable_sink_param")
    return Case(_convert(ck, tmp), "lacks tensors the hy_v4 block needs: block.self_attn.sinks")


@case
def hy_v4_transformers_too_old(w, tmp, mp, stack):
    """transformers 5.24 rotates HY-V4's RoPE slice NeoX-style, not interleaved as vLLM 0.34: refused, not converted."""
    ck = _family(tmp, "hy_v4")
    mp.setattr(importlib.import_module("transformers"), "__version__", "5.24.0")
    return Case(_convert(ck, tmp), "hy_v4 needs transformers >= 5.25, not 5.24.0")


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 50


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_fails_in_one_line_and_writes_nothing(
    name: str, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    with contextlib.ExitStack() as stack:
        spec = CASES[name](world, tmp_path, monkeypatch, stack)
        capsys.readouterr()
        before = snapshot(tmp_path, world.root, world.ds, world.mimo)
        code = main(spec.argv)
        out, err = capsys.readouterr()
    assert code == spec.code, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert spec.stdout in out
    if spec.usage:
        assert "Usage:" in err and "Error:" in err and spec.needle in err, err
        assert len([line for line in err.splitlines() if line.strip()]) <= 4, err
    else:
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and spec.needle in lines[0], err
    after = snapshot(tmp_path, world.root, world.ds, world.mimo)
    assert after == before, sorted(set(after) ^ set(before))
