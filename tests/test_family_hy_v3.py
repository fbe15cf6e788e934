"""Hunyuan Hy3 / HY-V3 (`hy_v3`): GQA with per-head QK-norm + MoE (sigmoid router, selection-only expert bias,
one shared expert), the block kinds that exist (gqa + moe), as one spec file and one fixture row. Checked: the
fixture's MTP keys against the release's key list (committed test data, its stored sources cited there), the keys a
conversion reads, both conversions, the native layer against a reference, the `inspect --json` row and the engine
rows.

The reference: transformers 5.24 has no MTP model for hy_v3 (HYV3Config has no num_mtp_layers), so the layer is
checked against the computation vLLM 0.33 runs (vllm/model_executor/models/hy_v3_mtp.py,
HYV3MultiTokenPredictorLayer): RMSNorm(embed) | RMSNorm(hidden) -> eh_proj -> the decoder block -> residual + output
-> final_layernorm -> the target's lm_head, the normed hidden handed on. The block is transformers' own
HYV3DecoderLayer loaded by transformers' own loader (a HYV3ForCausalLM one layer deeper reads the MTP layer's block
tensors under their hub names through conversion_mapping "hy_v3"), so the spec's renames are not what the reference
relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from checkpoint_files import config_of, rms, tensors, weight_map
from support import hub_keys
from support.fixtures import FIXTURES, eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "hy_v3"
MTP = "model.layers.2."


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list (tests/data/hub_keys/hy_v3.json), layer and expert indices abstracted."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    n, rn = config["num_hidden_layers"], release["config"]["num_hidden_layers"]
    ours = [k for k in weight_map(path) if k.startswith(f"model.layers.{n}.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 593
    assert hub_keys.patterns(ours, f"model.layers.{n}.") == hub_keys.patterns(theirs, f"model.layers.{rn}.")
    assert hub_keys.experts(ours) == set(range(config["num_experts"]))
    assert hub_keys.experts(theirs) == set(range(release["config"]["num_experts"]))
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.num_mtp_layers(release["config"]) == 1
    assert spec.key(spec.keys.block, release["config"], 0) == "model.layers.80."
    # the trunk's MoE layers carry the same hub names (transformers' save_pretrained writes them)
    trunk = {k[len("model.layers.1.") :] for k in weight_map(path) if k.startswith("model.layers.1.")}
    mtp_block = {k[len(f"model.layers.{n}.") :] for k in ours} - {
        "enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight"
    }  # fmt: skip
    assert trunk == mtp_block


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith(MTP)}
    assert plan.stored_embed is None and plan.stored_head is None  # the release stores neither
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.mlp).__name__ == "HYV3MoE"  # block_overrides: not the trunk's dense layer 0
    assert module.block.mlp.e_score_correction_bias.dtype == torch.float32


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_both_kinds(build, tmp_path: Path, kind: str) -> None:
    result = convert(str(build(FIXTURE, **eagle3_depth(FIXTURE, kind))), tmp_path / "out", to=kind)
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and not prov["dequantised_fp8"]
    assert prov["draft_kind"] == kind


def _reference(path: Path, nxt, hidden, pos, *, block_layer: int = 2):
    """vLLM's Hy3 MTP computation, the block from transformers' own loader: HYV3ForCausalLM with one more layer
    than the trunk reads model.layers.2.* (the MTP layer's block) by its hub names."""
    config, w = config_of(path), tensors(path)
    eps = config["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k not in ("model_type",)}
    fields["num_hidden_layers"] = 3
    fields["mlp_layer_types"] = ["dense", "sparse", "sparse"]
    cfg = transformers.HYV3Config(**fields)
    cfg._attn_implementation = "eager"
    deeper = transformers.HYV3ForCausalLM.from_pretrained(str(path), config=cfg, dtype=torch.float32).eval()
    assert torch.equal(deeper.model.layers[2].mlp.gate.weight, w[MTP + "mlp.router.gate.weight"])
    block = deeper.model.layers[block_layer]
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat([rms(e, w[MTP + "enorm.weight"], eps), rms(hidden, w[MTP + "hnorm.weight"], eps)], -1)
    x = x @ w[MTP + "eh_proj.weight"].T
    t = x.shape[1]
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = block(x, attention_mask=mask, position_embeddings=deeper.model.rotary_emb(x, pos), position_ids=pos)
    normed = rms(out, w[MTP + "final_layernorm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, 10), generator=gen)
    hidden, pos = torch.randn(2, 10, 64, generator=gen) * 3, torch.arange(10).expand(2, -1)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)
        right, normed = _reference(path, nxt, hidden, pos)
        trunk_block, _ = _reference(path, nxt, hidden, pos, block_layer=1)
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # vLLM and SGLang hand on the post-final-norm hidden
    assert (mine - trunk_block).abs().max().item() > 1e-2  # the check can fail: the block's own weights matter
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden


def test_engine_rows() -> None:
    """Both engines serve native MTP with the post-norm hand-over; neither captures aux states for EAGLE-3."""
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
        assert spec.engine(engine).version == {"vllm": "0.33.0", "sglang": "0.5.23"}[engine]
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    assert "hy_v3_mtp.py" in spec.engine("vllm").sources
    assert "hunyuan_v3_nextn.py" in spec.engine("sglang").sources and spec.nextn.architecture == "HYV3ForCausalLMNextN"


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith(MTP)}
