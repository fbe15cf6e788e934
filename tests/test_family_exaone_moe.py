"""K-EXAONE / EXAONE-MoE (`exaone_moe`): a 3:1 sliding / NoPE-global MoE trunk whose one MTP layer, in Qwen3-Next's
glue layout (mtp.fc, mtp.pre_fc_norm_{embedding,hidden}, mtp.layers.{i}, mtp.norm), is a pre-norm full-attention
layer with QK-norm and RoPE and a dense MLP. One spec file and one fixture row, on one generic spec key
(`[config] block_unset`: transformers' ExaoneMoeAttention applies RoPE to a full layer only when sliding_window is
None, which TOML cannot write). vLLM serves native MTP only; SGLang 0.5.23 serves MTP and captures EAGLE-3 aux states.

The key list: no stored copy of the release's index was found; the fixture's MTP keys are checked against a stored
architecture brief of the release (read from its config.json and index; its MTP parameter count is checked against
these keys at the release's sizes) and against the names vLLM 0.33's ExaoneMoeMTP.load_weights loads, mapped as it
maps them onto its module's parameters (tests/data/hub_keys/exaone_moe.json cites both); the spec says
verified = false.

The reference: transformers 5.24 has no MTP model for exaone_moe (ExaoneMoeConfig has no num_mtp_layers), so the
layer is checked against the computation vLLM 0.33 runs, written out here from its source (exaone_moe_mtp.py and
exaone_moe.py with is_mtp=True): pre_fc_norm_embedding(embed) | pre_fc_norm_hidden(hidden) -> fc -> input_layernorm
-> attention (q/k/v, per-head q_norm / k_norm, neox RoPE over the whole head although the layer is full attention,
causal without a window) -> o_proj -> residual -> post_attention_layernorm -> dense SwiGLU (no clamp: the config
has no swiglu_limits) -> residual -> mtp.norm -> the target's lm_head, the normed hidden handed on. Nothing from
transformers' classes or the spec enters the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoint_files import config_of, rms, tensors, weight_map
from support import hub_keys
from support.fixtures import FIXTURES

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "exaone_moe"
L = "mtp.layers.0."
T = 10  # longer than the trunk's sliding window (4), which the MTP layer does not use

# vLLM's hf_to_vllm_mapper (exaone_moe_mtp.py): q/k/v stacked into qkv_proj, the dense MLP's gate/up into gate_up_proj
_VLLM_STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj",
                 ".mlp.gate_proj": ".mlp.gate_up_proj", ".mlp.up_proj": ".mlp.gate_up_proj"}  # fmt: skip


def _as_vllm_loads(key: str) -> str:
    """A checkpoint key as vLLM's ExaoneMoeMTP.load_weights maps it onto its module (mtp. -> model., stacking)."""
    key = "model." + key[len("mtp.") :]
    for old, new in _VLLM_STACKED.items():
        if old in key:
            return key.replace(old, new)
    return key


def _release_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Each MTP key's shape at the release's sizes (the roles vLLM's module gives them)."""
    h, q, kv, d, i = (c["hidden_size"], c["num_attention_heads"] * c["head_dim"],
                      c["num_key_value_heads"] * c["head_dim"], c["head_dim"], c["intermediate_size"])  # fmt: skip
    return {
        "mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,), "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,), L + "input_layernorm.weight": (h,),
        L + "post_attention_layernorm.weight": (h,), L + "self_attn.q_proj.weight": (q, h),
        L + "self_attn.k_proj.weight": (kv, h), L + "self_attn.v_proj.weight": (kv, h),
        L + "self_attn.o_proj.weight": (h, q), L + "self_attn.q_norm.weight": (d,), L + "self_attn.k_norm.weight": (d,),
        L + "mlp.gate_proj.weight": (i, h), L + "mlp.up_proj.weight": (i, h), L + "mlp.down_proj.weight": (h, i),
    }  # fmt: skip


def test_fixture_keys_are_the_releases_and_what_vllm_loads(build) -> None:
    """No stored copy of the index: the brief's names and parameter count, and vLLM 0.33's loader."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    ours = sorted(k for k in weight_map(path) if k.startswith("mtp."))
    assert ours == release["mtp_keys"]  # the release's names exactly (a dense MTP MLP: no expert indices)
    shapes = _release_shapes(release["config"])
    assert sorted(shapes) == ours
    assert sum(torch.Size(s).numel() for s in shapes.values()) == release["mtp_param_count"] == 528_513_280
    assert {_as_vllm_loads(k) for k in ours} == set(release["vllm_params"])  # every vLLM parameter, nothing else
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config_of(path))
    assert spec.name == FIXTURE and not spec.verified
    assert spec.num_mtp_layers(release["config"]) == 1
    # the fixture's MTP layer has the trunk's dense layer 0's names, plus what the glue adds
    trunk = {k.split(".", 3)[3] for k in weight_map(path) if k.startswith("model.layers.0.")}
    assert trunk == {k[len(L) :] for k in ours if k.startswith(L)}


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith("mtp.")}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    assert type(module.block.mlp).__name__ == "ExaoneMoeMLP"  # dense, as vLLM builds every MTP layer
    assert not module.block.self_attn.is_sliding and module.block.self_attn.sliding_window is None
    assert module.attention_window is None


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_both_kinds(build, tmp_path: Path, kind: str) -> None:
    """EAGLE-3 too: SGLang 0.5.23 captures ExaoneMoE's aux states (the fixture's trunk has the 4 layers it needs)."""
    result = convert(str(build(FIXTURE)), tmp_path / "out", to=kind)
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and not prov["spec_verified"] and prov["draft_kind"] == kind


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """neox-style rotary over the whole head (vLLM get_rope, is_neox_style=True): x [B, T, heads, d]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[..., None].float() * inv  # [B, T, d/2]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def _reference(path: Path, nxt, hidden, pos, *, rope: bool = True, window: int | None = None):
    """vLLM 0.33's K-EXAONE MTP computation from the checkpoint's tensors by hub name: (logits, normed hidden).
    rope=False: the NoPE full layer transformers builds by default; window: SGLang's trunk-layer-0 variant."""
    config, w = config_of(path), tensors(path)
    eps, heads, kv, d = (config[k] for k in ("rms_norm_eps", "num_attention_heads", "num_key_value_heads", "head_dim"))
    theta = config["rope_parameters"]["rope_theta"]
    e = torch.nn.functional.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat(
        [rms(e, w["mtp.pre_fc_norm_embedding.weight"], eps), rms(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)],
        -1,
    )
    x = x @ w["mtp.fc.weight"].T
    b, t, _ = x.shape
    a = rms(x, w[L + "input_layernorm.weight"], eps)
    q = rms((a @ w[L + "self_attn.q_proj.weight"].T).view(b, t, heads, d), w[L + "self_attn.q_norm.weight"], eps)
    k = rms((a @ w[L + "self_attn.k_proj.weight"].T).view(b, t, kv, d), w[L + "self_attn.k_norm.weight"], eps)
    v = (a @ w[L + "self_attn.v_proj.weight"].T).view(b, t, kv, d)
    if rope:
        q, k = _rope(q, pos, theta), _rope(k, pos, theta)
    k, v = (z.repeat_interleave(heads // kv, dim=2) for z in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * d**-0.5
    qi, ki = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (ki <= qi) & (ki > qi - window) if window else ki <= qi
    scores = scores.masked_fill(~allowed, float("-inf"))
    attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, heads * d)
    x = x + attn @ w[L + "self_attn.o_proj.weight"].T
    m = rms(x, w[L + "post_attention_layernorm.weight"], eps)
    gate, up = m @ w[L + "mlp.gate_proj.weight"].T, m @ w[L + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ w[L + "mlp.down_proj.weight"].T
    normed = rms(x, w["mtp.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    ours.train_for_engine("vllm")
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, T), generator=gen)
    hidden, pos = torch.randn(2, T, 64, generator=gen) * 3, torch.arange(T).expand(2, -1)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)
        right, normed = _reference(path, nxt, hidden, pos)
        nope, _ = _reference(path, nxt, hidden, pos, rope=False)
        sglang, _ = _reference(path, nxt, hidden, pos, window=4)
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # vLLM hands on the mtp.norm output
    assert (mine - nope).abs().max().item() > 1e-2  # the check can fail: RoPE is applied and matters
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden
    # SGLang 0.5.23 windows the layer as trunk layer 0: the same while every key is inside the window, not after
    assert (mine[:, :4] - sglang[:, :4]).abs().max().item() <= 1e-4
    assert (mine[:, 4:] - sglang[:, 4:]).abs().max().item() > 1e-2


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    for engine in ("vllm", "sglang"):
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm", "final_norm": True,
                                                   "hidden_handover": "post_norm"}  # fmt: skip
        assert spec.engine(engine).version == {"vllm": "0.33.0", "sglang": "0.5.23"}[engine]
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    assert spec.engine("sglang").aux_ids == "plus_one"
    assert "exaone_moe_mtp.py" in spec.engine("vllm").sources and "exaone_moe_mtp.py" in spec.engine("sglang").sources
    assert spec.nextn.architecture == "ExaoneMoEForCausalLMMTP"


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa + dense" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith("mtp.")}
