"""Nemotron-3 Super Omni (`nemotron_h_super_omni`): the multimodal Nemotron-H export Megatron-Bridge's
NemotronOmniBridge writes, the Nemotron-H text model under `language_model.` with its config under `llm_config`, but
the MTP layer at top-level `mtp.layers.{0,1}`. One spec file and one fixture row, no code change: the block kind is
nemotron_h's; the spec differs from nemotron_h_omni only in the MTP keys' prefix. vLLM serves MTP (and captures aux
states); SGLang 0.5.23 has no MTP path for this architecture. `--to eagle3` is refused, as for nemotron_h.

The key list: no stored copy of a release's index or config was found. The fixture's MTP keys are diffed against the
Super text release's list at the top level, as a stored test of Megatron-Bridge's NemotronOmniBridge maps them, and
that mapping is what vLLM 0.33's nemotron_h_mtp.py loads (tests/data/hub_keys/nemotron_h_super_omni.json cites
both); the spec says verified = false.

The reference: vLLM 0.33's computation (nemotron_h_mtp.py) with transformers' own NemotronHBlock per sublayer, from
the checkpoint's tensors by their hub names (as test_family_nemotron_h.py does for the text release).
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

FIXTURE = "nemotron_h_super_omni"
LM = "language_model."
MTP = "mtp."


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list, expert indices abstracted; the same names as the text release."""
    release, text = hub_keys.load(FIXTURE), hub_keys.load("nemotron_h")
    path = build(FIXTURE)
    config = config_of(path)
    ours = [k for k in weight_map(path) if k.startswith(MTP)]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 1040
    assert hub_keys.patterns(ours, "") == hub_keys.patterns(theirs, "")
    assert set(theirs) == set(text["mtp_keys"])  # the text release's names, at the top level
    assert hub_keys.experts(ours) == set(range(config["llm_config"]["n_routed_experts"]))
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    assert set(release["config"]["llm_config"]) <= set(FIXTURES[FIXTURE]["config"]["llm_config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and not spec.verified and spec.num_mtp_layers(release["config"]) == 1
    # the text model sits under language_model. (transformers' save_pretrained writes it), the towers beside it
    assert {LM + "backbone.embeddings.weight", LM + "lm_head.weight", LM + "backbone.norm_f.weight"} <= set(
        weight_map(path)
    )
    assert any(k.startswith("vision_model.") for k in weight_map(path))
    assert not any(k.startswith(LM + "mtp.") for k in weight_map(path))
    trunk = {
        k.split(".", 4)[4]
        for k in weight_map(path)
        if k.startswith((LM + "backbone.layers.2.", LM + "backbone.layers.3."))
    }
    sub = {k.split(".", 3)[3] for k in ours} - {
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "final_layernorm.weight",
    }
    assert trunk == sub


def test_the_two_omni_layouts_are_told_apart_by_architecture() -> None:
    """Super VL (NemotronH_Omni_Reasoning_V3) keeps the MTP layer under language_model., this export at the top."""
    vl = {**FIXTURES[FIXTURE]["config"], "architectures": ["NemotronH_Omni_Reasoning_V3"]}
    assert find_spec(vl).name == "nemotron_h_omni" and find_spec(FIXTURES[FIXTURE]["config"]).name == FIXTURE
    nano = {**FIXTURES[FIXTURE]["config"], "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"]}
    with pytest.raises(UnknownFamilyError, match="NemotronH_Nano_Omni_Reasoning_V3"):
        find_spec(nano)  # vLLM 0.33 does not promote its text config for MTP


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith(MTP)}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.self_attn).__name__ == "NemotronHAttention" and module.rotary_emb is None
    assert module.block.mlp.experts.up_proj.shape == (8, 32, 32)  # [E, I, latent]


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and not prov["spec_verified"] and prov["draft_kind"] == "mtp"
    with pytest.raises(OptionError, match="nemotron_h_super_omni has no EAGLE-3 conversion"):
        convert(str(build(FIXTURE)), tmp_path / "e3", to="eagle3")


def _reference(path: Path, nxt, hidden, sublayers: tuple[str, str] | None = None):
    return reference(path, config_of(path)["llm_config"], nxt, hidden, lm=LM, mtp=MTP, sublayers=sublayers)


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
    assert spec.engine_computation("vllm") == {"input_hidden": "post_norm", "final_norm": True,
                                               "hidden_handover": "post_norm"}  # fmt: skip
    assert spec.engine("vllm").step_layers == "first" and "nemotron_h_mtp.py" in spec.engine("vllm").sources
    assert spec.engine("sglang") is None and "model_config.py" in spec.engine("vllm").notes
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": False, "eagle3": False}}
    assert spec.eagle3.transforms == ()  # vLLM captures aux states, but no transfer fits a NoPE, non-gated layer


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa_nope + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith(MTP)}
