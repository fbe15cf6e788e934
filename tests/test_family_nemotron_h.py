"""NVIDIA Nemotron-3 Super / Nemotron-H (`nemotron_h`): a Mamba-2 hybrid trunk whose one MTP layer is two
sublayers, NoPE attention (`mtp.layers.0`) then a latent MoE with non-gated squared-ReLU experts (`mtp.layers.1`).
A new block kind, built from transformers' own NemotronHAttention and NemotronHMoE composed as two pre-norm residual
sublayers (transformers' NemotronHBlock computes each), with the sublayers' `norm` / `mixer` renamed, no rotary, and
the per-expert up / down tensors fused by `fuse_experts_up_down`. Checked: the fixture's MTP keys against the
release's key list (committed test data, its stored sources cited there), the keys a conversion reads, the native
conversion, the layer against a reference, the EAGLE-3 refusal, the `inspect --json` row and the engine rows.

The reference: transformers 5.24 has no MTP model for nemotron_h (it ignores mtp.* on load), so the layer is checked
against the computation vLLM 0.33 runs (vllm/model_executor/models/nemotron_h_mtp.py): enorm(embed) | hnorm(hidden)
-> eh_proj -> sublayer 0 (x + attention(norm(x))) -> sublayer 1 (x + MoE(norm(x))) -> final_layernorm -> the target's
lm_head, the normed hidden handed on. Each sublayer is transformers' own NemotronHBlock (built as a trunk block of
that type) loaded from the checkpoint's tensors by their hub names.
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
from mtp2draft.errors import OptionError
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "nemotron_h"


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list (tests/data/hub_keys/nemotron_h.json), expert indices abstracted."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    ours = [k for k in weight_map(path) if k.startswith("mtp.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 8 + 1 + 2 + 512 * 2 + 2 + 2 + 1
    assert hub_keys.patterns(ours, "") == hub_keys.patterns(theirs, "")
    assert hub_keys.experts(ours) == set(range(config["n_routed_experts"]))
    assert hub_keys.experts(theirs) == set(range(release["config"]["n_routed_experts"]))
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.num_mtp_layers(release["config"]) == 1
    # the sublayers carry the trunk's attention / MoE block names (transformers' save_pretrained writes them)
    trunk = {k.split(".", 3)[3] for k in weight_map(path) if k.startswith(("backbone.layers.2.", "backbone.layers.3."))}
    sub = {k.split(".", 3)[3] for k in ours} - {
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "final_layernorm.weight",
    }
    assert trunk == sub


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith("mtp.")}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.self_attn).__name__ == "NemotronHAttention" and module.rotary_emb is None
    assert type(module.block.mlp).__name__ == "NemotronHMoE"
    assert module.block.mlp.experts.up_proj.shape == (8, 32, 32)  # [E, I, latent]


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and prov["draft_kind"] == "mtp"
    with pytest.raises(OptionError, match="nemotron_h has no EAGLE-3 conversion"):
        convert(str(build(FIXTURE)), tmp_path / "e3", to="eagle3")


def _reference(path: Path, nxt, hidden, sublayers: tuple[str, str] | None = None):
    return reference(path, config_of(path), nxt, hidden, sublayers=sublayers)


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, 10), generator=gen)
    hidden, pos = torch.randn(2, 10, 64, generator=gen) * 3, torch.arange(10).expand(2, -1)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)
        right, normed = _reference(path, nxt, hidden)
        trunk_blocks, _ = _reference(path, nxt, hidden, sublayers=("backbone.layers.2.", "backbone.layers.3."))
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
        shifted, _ = ours(nxt, hidden, pos + 5)
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # vLLM and SGLang hand on the final_layernorm output
    assert (mine - trunk_blocks).abs().max().item() > 1e-2  # the check can fail: the sublayers' own weights matter
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden
    assert torch.equal(mine, shifted)  # NoPE: positions do not enter


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
        assert spec.engine(engine).step_layers == "first"  # both assert exactly one MTP layer
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}}
    assert "nemotron_h_mtp.py" in spec.engine("vllm").sources and "nemotron_h_mtp.py" in spec.engine("sglang").sources
    assert spec.eagle3.transforms == ()  # vLLM captures aux states, but no transfer fits a NoPE, non-gated layer


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa_nope + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith("mtp.")}
