"""The draft modules: a native draft read back exactly, the EAGLE-3 layer's layout and exact transfers, the vocabulary
maps. Each family's native layer against its reference computation: tests/test_families.py."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.fixtures import eagle3_depth, fixture_config

from mtp2draft.conversion import convert
from mtp2draft.draft.build import converted_config, native_class, native_draft
from mtp2draft.draft.disk import build_draft, load_draft
from mtp2draft.draft.eagle3 import Eagle3Draft, vocab_maps
from mtp2draft.draft.modules import native_config
from mtp2draft.family.spec import get_spec, registry
from mtp2draft.formats.native import computation_record

LAYER_KINDS = ("deepseek_v3", "deepseek_v4")  # one family per native layer class: one hidden, several streams


def _checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("model-0*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(file)).items()})
    return out


def test_native_draft_in_bf16_keeps_the_router_bias_in_fp32(build, tmp_path: Path) -> None:
    """bf16 output: the weights rounded once, the router's correction bias kept in fp32 (an fp32 draft reads back
    bit for bit: tests/test_families.py::test_convert, every family)."""
    path = build("deepseek_v3")
    convert(str(path), tmp_path / "b")
    stored = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert stored["eh_proj.weight"].dtype == torch.bfloat16
    assert stored["block.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_every_native_layer_class_is_checked_for_its_hand_over() -> None:
    assert {native_class(get_spec(f)) for f in LAYER_KINDS} == {native_class(s) for s in registry().values()}
    # `native_config` has no default of its own that could disagree with a class's `DEFAULT_HANDOVER`
    assert inspect.signature(native_config).parameters["hidden_handover"].default is inspect.Parameter.empty


@pytest.mark.parametrize("family", LAYER_KINDS)
def test_convert_a_default_module_and_a_read_back_agree_on_the_hand_over(family: str) -> None:
    """The hand-over `convert` writes, the one a module built without options takes, and the one a draft config
    without the field reads back as (built, and recorded by export) are all the layer class's `DEFAULT_HANDOVER`."""
    spec, target = get_spec(family), fixture_config(family)
    written = converted_config(spec, target)
    assert written["hidden_handover"] == native_class(spec).DEFAULT_HANDOVER
    assert native_draft(spec, target).draft_config() == written
    unrecorded = {k: v for k, v in written.items() if k != "hidden_handover"}
    assert build_draft(unrecorded).hidden_handover == written["hidden_handover"]
    assert computation_record(spec, unrecorded)["hidden_handover"] == written["hidden_handover"]


@pytest.mark.parametrize("fixture", ["deepseek_v3", "glm4_moe", "mimo"])
def test_eagle3_draft_has_the_sglang_layout(build, tmp_path: Path, fixture: str) -> None:
    path = build(fixture, **eagle3_depth(fixture))
    convert(str(path), tmp_path / "e", to="eagle3")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    h, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    v, vd = cfg["vocab_size"], cfg["draft_vocab_size"]
    expect = {
        "fc.weight": (h, 3 * cfg["target_hidden_size"]),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (cfg["intermediate_size"], h),
        "midlayer.mlp.up_proj.weight": (cfg["intermediate_size"], h),
        "midlayer.mlp.down_proj.weight": (h, cfg["intermediate_size"]),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
    }
    # convert keeps the full vocabulary: no d2t/t2d (vLLM 0.32 refuses a full-vocabulary draft that carries them)
    assert vd == v
    assert {k: tuple(t.shape) for k, t in w.items()} == expect
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]  # vLLM reads 'input of layer' ids
    draft = load_draft(tmp_path / "e")
    assert isinstance(draft, Eagle3Draft) and not any("embed" in k for k in draft.state_dict())
    assert torch.equal(draft.to_target_ids(torch.arange(vd)), torch.arange(vd))  # identity maps put back
    prov = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]
    assert prov["norm.weight"]["exact"] and prov["lm_head.weight"]["exact"]
    assert not prov["midlayer.self_attn.q_proj.weight"]["exact"]


def test_mimo_mlp_transfers_exactly(build, tmp_path: Path) -> None:
    path = build("mimo", num_hidden_layers=4)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    src = _checkpoint_tensors(path)
    assert torch.equal(w["midlayer.mlp.down_proj.weight"], src["model.mtp_layers.0.mlp.down_proj.weight"])
    prov = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]
    assert prov["midlayer.mlp.down_proj.weight"]["exact"]
    assert "bias dropped" in prov["midlayer.self_attn.q_proj.weight"]["how"]


def test_vocab_maps_follow_the_reference_definition() -> None:
    used = torch.tensor([9, 2, 5, 7])
    d2t, t2d = vocab_maps(used, 12)
    assert d2t.tolist() == [2 - 0, 5 - 1, 7 - 2, 9 - 3]  # sorted ascending, d2t[i] = used[i] - i
    assert t2d.tolist() == [i in (2, 5, 7, 9) for i in range(12)]
    assert (torch.arange(4) + d2t).tolist() == [2, 5, 7, 9]
