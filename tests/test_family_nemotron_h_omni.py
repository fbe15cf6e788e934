"""Nemotron 3.5 Super VL (`nemotron_h_omni`): the multimodal Nemotron-H release, a RADIO vision tower around
Nemotron-3 Super's text model under `language_model.` with its config under `llm_config`, shipping the text model's
two-sublayer MTP layer at `language_model.mtp.layers.{0,1}`. One spec file and one fixture row, no code change: the
block kind is nemotron_h's (ComposedBlock of NemotronHAttention + NemotronHMoE, no rotary, fuse_experts_up_down), the
spec differs in key prefixes and the nested config. vLLM serves MTP and captures aux states, SGLang MTP only; no
EAGLE-3 transfer fits a NoPE, non-gated layer, so `--to eagle3` is refused, as for nemotron_h.

The key list: no stored copy of the release's index was found; a stored Megatron-Bridge test of its bridge names
the MTP tensors under language_model.mtp.* and shows its text model is the native Super one, so the list is the Super
text release's under that prefix (tests/data/hub_keys/nemotron_h_omni.json cites both). Both engines strip
language_model. and load it with the text model's MTP class.

The reference: transformers 5.24 has no MTP model for nemotron_h, so the layer is checked against vLLM 0.33's
computation (nemotron_h_mtp.py) with transformers' own NemotronHBlock per sublayer, loaded from the checkpoint's
tensors by their hub names under the language_model. prefix (as test_family_nemotron_h.py does for the text release).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoint_files import config_of, weight_map
from nemotron_h_reference import reference
from support import hub_keys
from support.fixtures import FIXTURES

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import OptionError, UnknownFamilyError
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "nemotron_h_omni"
LM = "language_model."


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list, expert indices abstracted; the same names as the text release."""
    release, text = hub_keys.load(FIXTURE), hub_keys.load("nemotron_h")
    path = build(FIXTURE)
    config = config_of(path)
    ours = [k for k in weight_map(path) if k.startswith(LM + "mtp.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 1040
    assert hub_keys.patterns(ours, "") == hub_keys.patterns(theirs, "")
    assert {k[len(LM) :] for k in theirs} == set(text["mtp_keys"])
    assert hub_keys.experts(ours) == set(range(config["llm_config"]["n_routed_experts"]))
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    assert set(release["config"]["llm_config"]) <= set(FIXTURES[FIXTURE]["config"]["llm_config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.verified and spec.num_mtp_layers(release["config"]) == 1
    # the text model sits under language_model. (transformers' save_pretrained writes it), the towers beside it
    assert {LM + "backbone.embeddings.weight", LM + "lm_head.weight", LM + "backbone.norm_f.weight"} <= set(
        weight_map(path)
    )
    assert any(k.startswith("vision_model.") for k in weight_map(path))
    trunk = {
        k.split(".", 4)[4]
        for k in weight_map(path)
        if k.startswith((LM + "backbone.layers.2.", LM + "backbone.layers.3."))
    }
    sub = {k.split(".", 4)[4] for k in ours} - {
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "final_layernorm.weight",
    }
    assert trunk == sub


def test_other_omni_exports_are_not_taken_for_it() -> None:
    """The Super Omni export keeps mtp.* at top level (Megatron-Bridge's NemotronOmniBridge): another spec. The Nano
    Omni, whose text config vLLM 0.33 does not promote for MTP, none."""
    omni = {**FIXTURES[FIXTURE]["config"], "architectures": ["NemotronH_Super_Omni_Reasoning_V3"]}
    assert find_spec(omni).name == "nemotron_h_super_omni"
    nano = {**FIXTURES[FIXTURE]["config"], "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"]}
    with pytest.raises(UnknownFamilyError, match="NemotronH_Nano_Omni_Reasoning_V3"):
        find_spec(nano)


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith(LM + "mtp.")}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.self_attn).__name__ == "NemotronHAttention" and module.rotary_emb is None
    assert module.block.mlp.experts.up_proj.shape == (8, 32, 32)  # [E, I, latent]


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and prov["draft_kind"] == "mtp"
    with pytest.raises(OptionError, match="nemotron_h_omni has no EAGLE-3 conversion"):
        convert(str(build(FIXTURE)), tmp_path / "e3", to="eagle3")


def _reference(path: Path, nxt, hidden, sublayers: tuple[str, str] | None = None):
    return reference(path, config_of(path)["llm_config"], nxt, hidden, lm=LM, mtp=LM + "mtp.", sublayers=sublayers)


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, 10), generator=gen)
    hidden, pos = torch.randn(2, 10, 64, generator=gen) * 3, torch.arange(10).expand(2, -1)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)
        right, normed = _reference(path, nxt, hidden)
        trunk, _ = _reference(path, nxt, hidden, sublayers=(LM + "backbone.layers.2.", LM + "backbone.layers.3."))
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # both engines hand on the final_layernorm output
    assert (mine - trunk).abs().max().item() > 1e-2  # the check can fail: the sublayers' own weights matter
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
        assert spec.engine(engine).step_layers == "first" and "nemotron_h_mtp.py" in spec.engine(engine).sources
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}}
    assert spec.eagle3.transforms == ()  # vLLM captures aux states, but no transfer fits a NoPE, non-gated layer


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa_nope + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith(LM + "mtp.")}
