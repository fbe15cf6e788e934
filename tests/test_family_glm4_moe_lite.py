"""GLM-4.7-Flash (`glm4_moe_lite`): a family whose block kind (MLA + MoE) already exists, so it is one spec file and
one fixture row. Checked here: the fixture's MTP keys against the release's key list (committed test data, cited in
the file), the keys a conversion reads, both conversions, the native layer against transformers' own MTP computation,
the `inspect --json` row and the engine rows.

The oracle: transformers 5.24 has no MTP model for glm4_moe_lite (its config has no num_mtp_layers), but
Glm4MoeLiteDecoderLayer is DeepSeek-V3's decoder layer (same MLA with rope_interleave, same sigmoid router with
e_score_correction_bias, same shared expert) under the same config field names, so DeepSeek-V3's MtpModel loaded on the
GLM-4.7-Flash checkpoint computes the layer. The test checks the premise (both trunks give the same hidden states).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from checkpoint_files import config_of, weight_map
from support import hub_keys
from support.fixtures import FIXTURES, eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "glm4_moe_lite"


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list (tests/data/hub_keys/glm4_moe_lite.json: a stored weights report of
    zai-org/GLM-4.7-Flash), with the layer index and expert indices abstracted."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    n = config["num_hidden_layers"]
    ours = [k for k in weight_map(path) if k.startswith(f"model.layers.{n}.")]
    theirs = release["mtp_keys"]
    rn = release["config"]["num_hidden_layers"]
    assert hub_keys.patterns(ours, f"model.layers.{n}.") == hub_keys.patterns(theirs, f"model.layers.{rn}.")
    assert hub_keys.experts(ours) == set(range(config["n_routed_experts"]))
    assert hub_keys.experts(theirs) == set(range(release["config"]["n_routed_experts"]))
    # the config fields the spec reads carry the release's names
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.num_mtp_layers(release["config"]) == 1
    assert spec.key(spec.keys.block, release["config"], 0) == "model.layers.47."
    assert set(release["trunk_keys_outside_layers"]) <= set(weight_map(path))


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    path = build(FIXTURE)
    ckpt = open_checkpoint(str(path))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    layer = {k for k in ckpt.weight_map if k.startswith("model.layers.2.")}
    stored = {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"}
    assert stored <= layer and set(plan.checkpoint_keys) == layer - stored
    assert plan.stored_embed == "model.layers.2.embed_tokens.weight"
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.mlp).__name__ == "Glm4MoeLiteMoE"  # block_overrides: not the trunk's dense layer 0
    assert type(module.block.self_attn).__name__ == "Glm4MoeLiteAttention"


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_both_kinds(build, tmp_path: Path, kind: str) -> None:
    result = convert(str(build(FIXTURE, **eagle3_depth(FIXTURE, kind))), tmp_path / "out", to=kind)
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and not prov["dequantised_fp8"]
    assert prov["draft_kind"] == kind


def test_native_layer_matches_transformers_mtp_model(build, monkeypatch) -> None:
    """transformers' DeepSeek-V3 MtpModel on the GLM-4.7-Flash checkpoint, max |diff| <= 1e-4 in fp32."""
    from transformers.modeling_layers import MtpModel

    path = build(FIXTURE)
    config = config_of(path)
    glm_cfg = transformers.AutoConfig.for_model(FIXTURE, **{k: v for k, v in config.items() if k != "model_type"})
    with pytest.raises(ValueError, match="num_mtp_layers"):  # if this fails, transformers covers the family itself
        glm_cfg.get_mtp_config()
    v3_cfg = transformers.DeepseekV3Config(**{k: v for k, v in config.items() if k not in ("model_type",)})
    cls = transformers.DeepseekV3ForCausalLM
    monkeypatch.setattr(cls, "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{config['num_hidden_layers']}.*"])
    v3 = cls.from_pretrained(str(path), config=v3_cfg, dtype=torch.float32).eval()
    glm = transformers.Glm4MoeLiteForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    oracle = MtpModel.from_pretrained(v3).float().eval()
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    ids, nxt = (torch.randint(0, config["vocab_size"], (2, 10), generator=gen) for _ in range(2))
    pos = torch.arange(10).expand(2, -1)
    with torch.no_grad():
        hidden = glm(ids, output_hidden_states=True).hidden_states[-1]  # post final norm
        # the premise: GLM-4.7-Flash's trunk computes as DeepSeek-V3's on the same tensors
        assert (hidden - v3(ids, output_hidden_states=True).hidden_states[-1]).abs().max().item() <= 1e-5
        chained = oracle.forward_layer(0, hidden, pos, None, input_ids=nxt)
        theirs = oracle._project_to_logits(chained)
        mine, handover = ours(nxt, hidden, pos)
        mine_in_reverse, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - theirs).abs().max().item() <= 1e-4
    assert torch.allclose(handover, chained, atol=1e-5)  # post-final-norm hand-over, as MtpModel chains
    assert (mine_in_reverse - theirs).abs().max().item() > 1e-2  # the check can fail: the hidden matters


def test_engine_computation_per_engine() -> None:
    """vLLM 0.33 hands on the pre-norm hidden (its forward returns residual + block output; shared_head.norm only in
    compute_logits), SGLang 0.5.23 the normed one; only SGLang captures aux states for EAGLE-3."""
    spec = get_spec(FIXTURE)
    assert spec.engine_computation("vllm") == {"input_hidden": "post_norm", "final_norm": True,
                                               "hidden_handover": "pre_norm"}  # fmt: skip
    assert spec.engine_computation("sglang")["hidden_handover"] == "post_norm"
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    for engine in ("vllm", "sglang"):
        facts = spec.engine(engine)
        assert facts.version == {"vllm": "0.33.0", "sglang": "0.5.23"}[engine]
        assert "glm4_moe_lite" in facts.sources


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "mla + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] == "model.layers.2.embed_tokens.weight"
    assert layer["stored_head"] == "model.layers.2.shared_head.head.weight" and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == set(plan_mtp_layer(open_checkpoint(str(path)),
                                                                       get_spec(FIXTURE), 0).checkpoint_keys)  # fmt: skip
