"""The named transforms: checkpoint <-> module layout (fused experts), the EAGLE-3 initialisation (RoPE remap,
embedding pass-through heads), their registries, and the EAGLE-3 build's output dtype handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.fixtures import eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.conversion import build_eagle3, convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import expert_keys, load_native, plan_mtp_layer
from mtp2draft.eagle3.attention import rope_permutation
from mtp2draft.eagle3.transfer import Eagle3Build
from mtp2draft.eagle3.transforms import EAGLE3_TRANSFORMS, check_eagle3_transforms
from mtp2draft.errors import CheckpointError
from mtp2draft.family.spec import find_spec, registry
from mtp2draft.family.transforms import LOAD_TRANSFORMS, FuseExperts, check_spec_transforms, group_block_keys


# ---- load transforms ------------------------------------------------------------------------------------------------
def test_fuse_experts_groups_combines_and_splits_back() -> None:
    """Per-expert keys -> fused [E, 2I, H] / [E, H, I] (gate rows first) and back, keys of one expert findable."""
    fuse, gen = FuseExperts(), torch.Generator().manual_seed(0)
    keys = [f"mlp.experts.{e}.{w}_proj.weight" for e in range(3) for w in ("gate", "up", "down")]
    tensors = {k: torch.randn((4, 6) if "down" not in k else (6, 4), generator=gen) for k in keys}
    groups, rest = fuse.group([*keys, "mlp.gate.weight"])
    assert rest == ["mlp.gate.weight"]
    by_name = {g.module_key: g for g in groups}
    gate_up, down = by_name["mlp.experts.gate_up_proj"], by_name["mlp.experts.down_proj"]
    fused = fuse.combine(gate_up, [tensors[k] for k in gate_up.ckpt_keys])
    assert fused.shape == (3, 8, 6)
    assert torch.equal(fused[1, :4], tensors["mlp.experts.1.gate_proj.weight"])
    assert torch.equal(fused[1, 4:], tensors["mlp.experts.1.up_proj.weight"])
    assert fuse.expert_keys(gate_up, 2) == ("mlp.experts.2.gate_proj.weight", "mlp.experts.2.up_proj.weight")
    assert fuse.expert_keys(down, 2) == ("mlp.experts.2.down_proj.weight",)
    back = fuse.split(gate_up, fused) | fuse.split(down, fuse.combine(down, [tensors[k] for k in down.ckpt_keys]))
    assert set(back) == set(keys) and all(torch.equal(back[k], tensors[k]) for k in keys)


def test_expert_keys_come_from_the_plan(build) -> None:
    """Per-expert checkpoints name each expert's three tensors; a fused 3-D checkpoint has none to name."""
    ckpt = open_checkpoint(str(build("deepseek_v3")))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    prefix = "model.layers.2.mlp.experts.5."
    assert expert_keys(plan, 5) == tuple(prefix + f"{w}_proj.weight" for w in ("gate", "up", "down"))
    fused = open_checkpoint(str(build("qwen3_5_moe")))
    assert expert_keys(plan_mtp_layer(fused, find_spec(fused.config), 0), 0) is None


def test_every_shipped_spec_names_only_registered_transforms() -> None:
    for spec in registry().values():
        check_spec_transforms(spec)
        check_eagle3_transforms(spec)
        assert set(spec.block.load) <= set(LOAD_TRANSFORMS)
        assert set(spec.eagle3.transforms) <= set(EAGLE3_TRANSFORMS)


# ---- EAGLE-3 initialisation -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("d", "rope", "offset", "interleaved"), [(24, 8, 16, True), (16, 8, 0, False), (64, 64, 0, False)]
)
def test_rope_permutation_reproduces_partial_rope(d: int, rope: int, offset: int, interleaved: bool) -> None:
    """Llama's full RoPE on permuted dims (theta' = theta^(d/rope)) == the source's partial RoPE, up to near-zero
    rotation of the pass-through dims, for query-key dot products at short distances."""
    theta, gen = 10000.0, torch.Generator().manual_seed(0)
    perm, exponent = rope_permutation(d, rope, offset, interleaved)
    assert sorted(perm) == list(range(d))
    q, k = torch.randn(d, generator=gen), torch.randn(d, generator=gen)

    def partial(x: torch.Tensor, pos: int) -> torch.Tensor:
        x = x.clone()
        r = x[offset : offset + rope]
        if interleaved:  # pairs (2j, 2j+1)
            a, b = r[0::2].clone(), r[1::2].clone()
        else:
            a, b = r[: rope // 2].clone(), r[rope // 2 :].clone()
        f = pos / theta ** (torch.arange(rope // 2) * 2 / rope)
        na, nb = a * f.cos() - b * f.sin(), b * f.cos() + a * f.sin()
        if interleaved:
            r[0::2], r[1::2] = na, nb
        else:
            r[: rope // 2], r[rope // 2 :] = na, nb
        x[offset : offset + rope] = r
        return x

    def llama(x: torch.Tensor, pos: int) -> torch.Tensor:
        f = pos / (theta**exponent) ** (torch.arange(d // 2) * 2 / d)
        a, b = x[: d // 2], x[d // 2 :]
        return torch.cat([a * f.cos() - b * f.sin(), b * f.cos() + a * f.sin()])

    for pq, pk in [(5, 3), (40, 0), (7, 7)]:
        want = partial(q, pq) @ partial(k, pk)
        got = llama(q[perm], pq) @ llama(k[perm], pk)
        assert abs(float(want - got)) < 2e-3 * (q.norm() * k.norm()), (pq, pk)


@pytest.mark.parametrize("fixture", ["deepseek_v3", "glm4_moe", "mimo"])
def test_embedding_passthrough_heads_carry_the_mtp_embedding_term(build, tmp_path: Path, fixture: str) -> None:
    """The heads appended by the conversion attend to their own entry and write P_e enorm(e) into the residual,
    as the MTP layer's block input carries it (the rest of its attention comes from the MTP heads)."""
    path = build(fixture, **eagle3_depth(fixture))
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    draft = load_draft(tmp_path / "e").eval()
    native = load_native(str(path)).eval()
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0  # transformers' LlamaConfig requires it
    mtp_heads, d = cfg["mtp2draft_init"]["mtp_heads"], cfg["head_dim"]
    gen = torch.Generator().manual_seed(0)
    t = 12
    tokens = torch.randperm(cfg["vocab_size"], generator=gen)[:t][None]  # distinct tokens
    e = torch.nn.functional.embedding(tokens, native.embed_weight)
    h = cfg["hidden_size"]
    proj = native.eh_proj.weight
    p_e = proj[:, :h] if native.spec.layer.concat == "embed_hidden" else proj[:, h:]
    want = native.enorm(e) @ p_e.T  # [1, T, H]: the embedding term of the MTP block input
    attn = draft.midlayer.self_attn
    with torch.no_grad():
        attn.o_proj.weight[:, : mtp_heads * d] = 0  # keep only the pass-through heads' contribution
        hidden = torch.randn(1, t, h, generator=gen)
        x = torch.cat([draft.midlayer.input_layernorm(e), draft.midlayer.hidden_norm(hidden)], -1)
        pos = torch.arange(1, t + 1)[None]
        got, _ = attn(x, position_embeddings=draft.rotary_emb(hidden, pos), attention_mask=None)
    cos = torch.nn.functional.cosine_similarity(got[0], want[0], dim=-1)
    assert cos.min() > 0.9, cos
    assert torch.allclose(got.norm(dim=-1), want.norm(dim=-1), rtol=0.2)


# ---- the build's output dtype -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["deepseek_v3_fp8", "qwen3_next", "mimo_v2_flash", "glm4_moe"])
def test_build_in_bf16_equals_the_fp32_build_cast(build, fixture: str) -> None:
    """Casting each output as it is stored (to keep the layer out of fp32) gives the bytes of casting at the end."""
    ckpt = open_checkpoint(str(build(fixture, **eagle3_depth(fixture))))
    spec = find_spec(ckpt.config)
    plan = plan_mtp_layer(ckpt, spec, 0)
    cfg32, out32, prov32 = build_eagle3(ckpt, spec, plan)
    cfg16, out16, prov16 = build_eagle3(ckpt, spec, plan, dtype=torch.bfloat16)
    assert cfg16 == cfg32 and prov16 == prov32 and set(out16) == set(out32)
    for key, value in out16.items():
        assert value.dtype == torch.bfloat16, key
        assert torch.equal(value, out32[key].to(torch.bfloat16)), key


def test_put_checks_finite_then_casts() -> None:
    b = Eagle3Build(None, None, {}, None, None, None, None, [0, 1, 2], dtype=torch.bfloat16)  # type: ignore[arg-type]
    b.put("w", torch.full((2, 3), 1.5), True, ["src"], "copied")
    assert b.out["w"].dtype == torch.bfloat16 and b.provenance["w"] == {"exact": True, "from": ["src"], "how": "copied"}
    with pytest.raises(CheckpointError, match="w2 holds non-finite values"):
        b.put("w2", torch.tensor([1.0, float("inf")]), True, [], "")


def test_up_down_experts_transform_round_trips() -> None:
    """Nemotron-H's non-gated experts: per-expert up / down <-> stacked [E, rows, cols], in expert order."""
    keys = [f"1.mixer.experts.{e}.{w}_proj.weight" for e in (1, 0) for w in ("down", "up")]
    groups = group_block_keys(keys, {"1.mixer.": "mlp."}, ("fuse_experts_up_down",))
    assert {g.module_key for g in groups} == {"mlp.experts.up_proj", "mlp.experts.down_proj"}
    t = LOAD_TRANSFORMS["fuse_experts_up_down"]
    up = next(g for g in groups if g.module_key.endswith("up_proj"))
    assert up.ckpt_keys == ("1.mixer.experts.0.up_proj.weight", "1.mixer.experts.1.up_proj.weight")
    parts = [torch.full((3, 2), float(e)) for e in range(2)]
    fused = t.combine(up, parts)
    assert fused.shape == (2, 3, 2) == t.out_shape(up, [(3, 2)] * 2)
    back = t.to_checkpoint("mlp.experts.up_proj", fused)
    assert set(back) == {"mlp.experts.0.up_proj.weight", "mlp.experts.1.up_proj.weight"}
    assert torch.equal(back["mlp.experts.1.up_proj.weight"], parts[1])
    with pytest.raises(CheckpointError, match="incomplete expert weights"):
        t.group(["experts.0.up_proj.weight", "experts.1.down_proj.weight"])


def test_experts_as_stored_reads_either_layout_and_writes_back_the_one_it_finds() -> None:
    """Fused 3-D experts (with or without `.weight`) map 1:1 onto the module's [E, 2I, H] / [E, H, I]; per-expert keys
    are fused; the inverse writes the layout the checkpoint written over has, and the spec's first one without it.
    Both layouts under one prefix are refused."""
    t = LOAD_TRANSFORMS["experts_as_stored"]
    per_expert = [f"mlp.experts.{e}.{w}_proj.weight" for e in range(2) for w in ("gate", "up", "down")]
    for fused in (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                  ["mlp.experts.gate_up_proj.weight", "mlp.experts.down_proj.weight"]):  # fmt: skip
        groups = group_block_keys([*fused, "mlp.shared_experts.down_proj.weight"], {}, ("experts_as_stored",))
        got = {g.module_key: (g.ckpt_keys, g.transform) for g in groups}
        assert got == {
            "mlp.experts.gate_up_proj": ((fused[0],), ""),  # no transform: the stored tensor is the module's
            "mlp.experts.down_proj": ((fused[1],), ""),
            "mlp.shared_experts.down_proj.weight": (("mlp.shared_experts.down_proj.weight",), ""),
        }
        tensor = torch.randn(2, 8, 6)
        assert t.to_checkpoint("mlp.experts.gate_up_proj", tensor, set(fused).__contains__) == {fused[0]: tensor}
        with pytest.raises(CheckpointError, match="both fused and per expert"):
            group_block_keys([*fused, *per_expert], {}, ("experts_as_stored",))
    tensor = torch.randn(2, 8, 6)
    back = t.to_checkpoint("mlp.experts.gate_up_proj", tensor, set(per_expert).__contains__)
    assert sorted(back) == sorted(k for k in per_expert if "down" not in k)
    assert torch.equal(back["mlp.experts.1.up_proj.weight"], tensor[1, 4:])
    assert sorted(t.to_checkpoint("mlp.experts.gate_up_proj", tensor)) == sorted(back)  # the default: per expert
    fused3d = LOAD_TRANSFORMS["fused_experts_3d"]  # Qwen3.5-MoE's default is fused, per-expert where stored so
    assert list(fused3d.to_checkpoint("mlp.experts.down_proj", tensor)) == ["mlp.experts.down_proj"]
    assert len(fused3d.to_checkpoint("mlp.experts.down_proj", tensor, set(per_expert).__contains__)) == 2
    with pytest.raises(CheckpointError, match="none of the layouts"):
        t.to_checkpoint("mlp.experts.gate_up_proj", tensor, lambda key: False)


@pytest.mark.parametrize("fixture", ["hy_v4_fused", "hy_v4_fused_bare"])
def test_hy_v4_fused_experts_convert_to_the_per_expert_layers_module(build, fixture: str) -> None:
    """The same weights stored fused (as RTP-LLM's HY V4 loader reads Hy4 releases) or per expert convert to the same
    native module, bit for bit; the plan reads the fused tensors as they are."""
    fused = open_checkpoint(str(build(fixture)))
    plan = plan_mtp_layer(fused, find_spec(fused.config), 0)
    suffix = ".weight" if fixture == "hy_v4_fused" else ""
    gate_up = "model.mtp_layers.0.mlp.experts.gate_up_proj" + suffix
    assert gate_up in plan.checkpoint_keys and not [k for k in plan.checkpoint_keys if ".experts.0." in k]
    assert fused.shape_of(gate_up) == (8, 64, 64)  # [E, 2I, H]
    ours = load_native(fused, attach_target=False).state_dict()
    theirs = load_native(str(build("hy_v4")), attach_target=False).state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
