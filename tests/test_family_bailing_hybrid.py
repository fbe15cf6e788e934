"""Ling 3 / Bailing V3 (`bailing_hybrid`): a KDA linear-attention trunk with one MLA layer per group, whose MTP layer
at model.layers.{N} is a head-wise gated MLA layer + MoE (sigmoid grouped router with expert bias, one shared
expert) under the release's own names (attention.*, attention.dense, mlp.gate.expert_bias, model.word_embeddings).
One spec file and one fixture row, no code change: the block is transformers' BailingHybridDecoderLayer, the hub
names are `[block] rename`, the experts the existing `fuse_experts`. Both engines serve native MTP only; neither
captures its aux states, so `--to eagle3` is refused in one line.

The key list: no stored copy of the release's index was found; the fixture's MTP keys are diffed against the list
composed from two stored sources read against the release (tests/data/hub_keys/bailing_hybrid.json cites both),
and checked against the names vLLM 0.33's BailingMoeV3MTPModel.load_weights maps onto its module.

The reference: transformers' own MtpModel (modeling_layers.py), loaded by transformers' own loader from the
fixture's checkpoint (its conversion_mapping "bailing_hybrid" renames the hub names; MtpModel adds the mtp_block
prefix and builds the block as the trunk's last-layer class). Two gaps of transformers 5.24 are bridged in the
test, not in the oracle's computation: its get_mtp_config needs mtp_layer_types and mtp_mlp_layer_types, which the
release's config lacks (set to what both engines build: MLA + MoE), and its MtpModel mapping names the final norm
only as DeepSeek's shared_head.norm (Ling's final_layernorm is renamed onto post_norm).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from checkpoint_files import config_of, weight_map
from support import hub_keys
from support.fixtures import FIXTURES

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import OptionError, UnknownFamilyError
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "bailing_hybrid"
MTP = "model.layers.4."


def _as_vllm_loads(key: str) -> str:
    """A non-expert MTP key as vLLM's BailingMoeV3MTPModel.load_weights maps it (attention. -> self_attn., the
    shared expert's gate / up stacked into gate_up_proj)."""
    key = key.replace(".attention.", ".self_attn.")
    for w in ("gate_proj", "up_proj"):
        key = key.replace(f"shared_experts.{w}", "shared_experts.gate_up_proj")
    return key


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list, layer and expert indices abstracted."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    n, rn = config["num_hidden_layers"], release["config"]["num_hidden_layers"]
    ours = [k for k in weight_map(path) if k.startswith(f"model.layers.{n}.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 17 + 3 * 512
    assert hub_keys.patterns(ours, f"model.layers.{n}.") == hub_keys.patterns(theirs, f"model.layers.{rn}.")
    assert hub_keys.experts(ours) == set(range(config["num_experts"]))
    assert hub_keys.experts(theirs) == set(range(release["config"]["num_experts"]))
    assert {_as_vllm_loads(k) for k in theirs if ".experts." not in k} == set(release["vllm_params"])
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.verified and spec.num_mtp_layers(release["config"]) == 1
    assert spec.key(spec.keys.block, release["config"], 0) == "model.layers.42."
    # the trunk's MLA + MoE layer (the last of its group) carries the same hub names
    last = f"model.layers.{n - 1}."
    trunk = {k[len(last) :] for k in weight_map(path) if k.startswith(last)}
    glue = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight"}
    assert trunk == {k[len(MTP) :] for k in ours} - glue


def test_ling_2_5_is_not_taken_for_ling_3() -> None:
    """Ling 2.5 (vLLM: a bailing_hybrid config with BailingMoeV2_5ForCausalLM) has another MTP block: no spec."""
    ling25 = {**FIXTURES[FIXTURE]["config"], "architectures": ["BailingMoeV2_5ForCausalLM"]}
    with pytest.raises(UnknownFamilyError, match="no spec matches this checkpoint .BailingMoeV2_5ForCausalLM"):
        find_spec(ling25)


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith(MTP)}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    # block_overrides: MLA + MoE, not the trunk's KDA + dense layer 0
    assert type(module.block.self_attn).__name__ == "BailingHybridAttention"
    assert type(module.block.mlp).__name__ == "BailingHybridMoE"
    assert module.block.mlp.gate.e_score_correction_bias.dtype == torch.float32


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and prov["draft_kind"] == "mtp"
    with pytest.raises(OptionError, match="bailing_hybrid has no EAGLE-3 conversion"):
        convert(str(build(FIXTURE)), tmp_path / "e3", to="eagle3")


def test_native_layer_matches_transformers_mtp_model(build, monkeypatch) -> None:
    """Oracle: transformers' own MtpModel on the same checkpoint, max |diff| <= 1e-4 in fp32."""
    from transformers.core_model_loading import WeightRenaming
    from transformers.modeling_layers import MtpModel

    path = build(FIXTURE)
    config = config_of(path)
    n = config["num_hidden_layers"]
    # transformers finds MTP keys through this attribute (BailingHybridModel sets it on the inner model only)
    monkeypatch.setattr(
        transformers.BailingHybridForCausalLM, "_keys_to_ignore_on_load_unexpected", [rf"layers\.{n}\."]
    )
    fields = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.BailingHybridConfig(**fields, mtp_layer_types=["full_attention"], mtp_mlp_layer_types=["sparse"])
    cfg._attn_implementation = "eager"
    target = transformers.BailingHybridForCausalLM.from_pretrained(str(path), config=cfg, dtype=torch.float32).eval()
    # transformers 5.24's MtpModel mapping reads the final norm as DeepSeek's shared_head.norm only; Ling keeps it as
    # final_layernorm (which it would leave missing): one renaming more, next to MtpModel's own enorm / hnorm ones
    conversions = MtpModel.get_weight_conversions

    def with_final_layernorm(self, main_model):
        rename = WeightRenaming(source_patterns=".mtp_block.final_layernorm.", target_patterns=".post_norm.")
        first, *rest = conversions(self, main_model)  # first: layers.{N}. -> layers.0.mtp_block.
        return [first, rename, *rest]

    monkeypatch.setattr(MtpModel, "get_weight_conversions", with_final_layernorm)
    oracle = MtpModel.from_pretrained(target).float().eval()
    assert torch.equal(
        oracle.layers[0].mtp_block.mlp.gate.e_score_correction_bias,
        load_native(str(path)).block.mlp.gate.e_score_correction_bias,
    )
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, config["vocab_size"], (2, 10), generator=gen)
    hidden = torch.randn(2, 10, config["hidden_size"], generator=gen) * 3
    pos = torch.arange(10).expand(2, -1)
    with torch.no_grad():
        theirs_hidden = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
        theirs = oracle._project_to_logits(theirs_hidden)
        mine, handover = ours(nxt, hidden, pos)
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - theirs).abs().max().item() <= 1e-4
    assert torch.allclose(handover, theirs_hidden, atol=1e-5)  # the post-final-norm hand-over, as both engines
    assert (mine_reversed - theirs).abs().max().item() > 1e-2  # the check can fail: the hidden matters


def test_engine_rows() -> None:
    """Both engines serve native MTP with the post-norm hand-over; neither captures aux states for EAGLE-3."""
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
        assert spec.engine(engine).version == {"vllm": "0.33.0", "sglang": "0.5.23"}[engine]
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    assert "bailing_moe_v3_mtp.py" in spec.engine("vllm").sources
    assert "bailing_moe_nextn.py" in spec.engine("sglang").sources
    assert spec.nextn.architecture == "BailingMoeForCausalLMNextN" and not spec.eagle3.transforms


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gated_mla + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith(MTP)}
