"""GLM-5 / 5.2 (`glm_moe_dsa`): MLA + DSA indexer + MoE, the block kind of DeepSeek-V3.2 with two differences that
matter here: the decoder layer returns (hidden, top-k indices), and the trunk shares top-k across layers
(`indexer_types`), while the MTP layer runs its own indexer. Checked: the fixture's MTP keys against the release's key
list (committed test data, cited there), the keys a conversion reads, both conversions, FP8 dequantisation, the native
layer against a reference, the `inspect --json` row and the engine rows.

The reference: transformers 5.24 has no MTP model for glm_moe_dsa (no num_mtp_layers; its generic MtpLayer cannot run
a decoder layer that returns a tuple), so the layer is checked against the computation vLLM 0.33 runs
(vllm/models/deepseek_v32/nvidia/mtp.py, DeepseekV32MultiTokenPredictorLayer): RMSNorm(embed) | RMSNorm(hidden) ->
eh_proj -> the decoder block (transformers' GlmMoeDsaDecoderLayer built here from the checkpoint tensors by their hub
names, own indexer, causal mask) -> shared_head.norm -> lm_head, the post-norm hidden recycled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoint_files import config_of, rms, tensors, weight_map
from support import hub_keys
from support.fixtures import FIXTURES, eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "glm_moe_dsa"
T = 10  # longer than the fixture's index_topk (4)


def _causal(t: int) -> torch.Tensor:
    return torch.full((t, t), float("-inf")).triu(1)[None, None]


def _inputs(seed: int, t: int = T):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    return nxt, torch.randn(2, t, 64, generator=gen) * 3, torch.arange(t).expand(2, -1)


def test_fixture_has_the_release_mtp_keys(build) -> None:
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    n, rn = config["num_hidden_layers"], release["config"]["num_hidden_layers"]
    ours = [k for k in weight_map(path) if k.startswith(f"model.layers.{n}.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 791
    assert hub_keys.patterns(ours, f"model.layers.{n}.") == hub_keys.patterns(theirs, f"model.layers.{rn}.")
    assert hub_keys.experts(ours) == set(range(config["n_routed_experts"]))
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.key(spec.keys.block, release["config"], 0) == "model.layers.78."
    # the trunk shares top-k like the release: own indexer keys only on "full" layers (here 0 and 2)
    indexed = {int(k.split(".")[2]) for k in weight_map(path) if ".indexer." in k}
    assert indexed == {0, 2, n}


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith("model.layers.4.")}
    assert plan.stored_embed is None and plan.stored_head is None  # the release stores neither
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.mlp).__name__ == "GlmMoeDsaMoE" and module.block.self_attn.indexer is not None


@pytest.mark.parametrize("fixture", [FIXTURE, "glm_moe_dsa_fp8"])
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_both_kinds(build, tmp_path: Path, fixture: str, kind: str) -> None:
    result = convert(str(build(fixture, **eagle3_depth(fixture, kind))), tmp_path / "out", to=kind)
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"]
    assert bool(prov["dequantised_fp8"]) == fixture.endswith("_fp8")
    if kind == "eagle3":
        how = prov["tensors"]["midlayer.self_attn.q_proj.weight"]["how"]
        assert "DSA indexer dropped" in how and "same up to 4 tokens" in how


def test_fp8_dequantises(build) -> None:
    fp8, ref = open_checkpoint(str(build("glm_moe_dsa_fp8"))), str(build(FIXTURE))
    assert fp8.info("model.layers.4.self_attn.indexer.wq_b.weight").dtype == "F8_E4M3"
    assert fp8.scale_key("model.layers.4.eh_proj.weight") is None
    ours, plain = load_native(fp8, attach_target=False), load_native(ref, attach_target=False)
    quantised = 0
    for (key, a), (_, b) in zip(ours.state_dict().items(), plain.state_dict().items(), strict=True):
        if not torch.equal(a, b):
            quantised += 1
            assert (a - b).abs().max() <= 0.07 * b.abs().max(), key  # e4m3: 3 mantissa bits
    assert quantised > 10


def _reference(w, config, nxt, hidden, pos, *, index_topk=None, decoder="glm"):
    """vLLM's GLM-5 MTP computation from checkpoint tensors by hub name. `decoder="v32"` runs the same weights
    through DeepSeek-V3.2's block (half-split RoPE in the indexer) to show the family's own block matters."""
    from transformers import DeepseekV32Config, GlmMoeDsaConfig
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as glm

    p, eps = "model.layers.4.", config["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "index_topk")}
    topk = index_topk or config["index_topk"]
    if decoder == "glm":
        cfg = GlmMoeDsaConfig(**fields, index_topk=topk)
        cfg.mlp_layer_types, cfg.indexer_types = ["sparse"], ["full"]
        block_cls, rotary = glm.GlmMoeDsaDecoderLayer, glm.GlmMoeDsaRotaryEmbedding
    else:
        cfg = DeepseekV32Config(**fields, index_topk=topk)
        cfg.mlp_layer_types, cfg.first_k_dense_replace = ["sparse"], 0
        block_cls, rotary = v32.DeepseekV32DecoderLayer, v32.DeepseekV32RotaryEmbedding
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    block = block_cls(cfg, 0)
    experts = range(config["n_routed_experts"])
    state = {}
    for name in block.state_dict():
        if name == "mlp.experts.gate_up_proj":
            state[name] = torch.stack(
                [torch.cat([w[f"{p}mlp.experts.{e}.{g}_proj.weight"] for g in ("gate", "up")]) for e in experts]
            )
        elif name == "mlp.experts.down_proj":
            state[name] = torch.stack([w[f"{p}mlp.experts.{e}.down_proj.weight"] for e in experts])
        else:
            state[name] = w[p + name]
    block.load_state_dict(state)
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat([rms(e, w[p + "enorm.weight"], eps), rms(hidden, w[p + "hnorm.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    out = block(x, attention_mask=_causal(x.shape[1]), position_embeddings=rotary(cfg)(x, pos), position_ids=pos)
    normed = rms(out[0] if isinstance(out, tuple) else out, w[p + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    config, w = config_of(path), tensors(path)
    ours = load_native(str(path)).eval()
    nxt, hidden, pos = _inputs(0)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)  # no mask given: the draft builds the causal one the indexer reads
        right, normed = _reference(w, config, nxt, hidden, pos)
        dense, _ = _reference(w, config, nxt, hidden, pos, index_topk=T)
        as_v32, _ = _reference(w, config, nxt, hidden, pos, decoder="v32")
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # vLLM recycles the post-final-norm hidden
    assert (mine - dense).abs().max().item() > 1e-2  # the indexer's top-k selection is applied and matters
    assert (mine - as_v32).abs().max().item() > 1e-2  # GLM's block (interleaved indexer RoPE) is not V3.2's


def test_layer_uses_the_draft_cache(build) -> None:
    from mtp2draft.draft.modules import DraftCache

    ours = load_native(str(build(FIXTURE))).eval()
    nxt, hidden, pos = _inputs(1)
    cache = DraftCache()
    with torch.no_grad():
        full, _ = ours(nxt, hidden, pos)
        first, _ = ours(nxt[:, :6], hidden[:, :6], pos[:, :6], cache=cache)
        rest, _ = ours(nxt[:, 6:], hidden[:, 6:], pos[:, 6:], cache=cache)
    assert cache.indexer is not None and cache.indexer.shape[-2] == T
    assert (torch.cat([first, rest], 1) - full).abs().max().item() <= 1e-4


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    assert "deepseek_v32/nvidia/mtp.py" in spec.engine("vllm").sources
    assert (
        "GlmMoeDsaForCausalLMNextN" in spec.engine("sglang").sources
        and spec.nextn.architecture in spec.engine("sglang").sources
    )


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "mla_dsa + moe" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert len(layer["tensors"]) == len([k for k in weight_map(path) if k.startswith("model.layers.4.")])
