"""Every family of the table (tests/family_table.py), the same six checks from its row: the fixture's MTP keys against
the release's key list (committed test data, its stored sources cited there), the keys a conversion reads, the
conversions (or the refusal of EAGLE-3 where no transfer fits), the native layer against the reference computation
the row names, the engine rows of the spec, and the `inspect --json` row. Then the checks that fit no column, named
after their family.

Why references and not transformers everywhere: transformers 5.24 has an MTP model for none of these families (their
configs have no num_mtp_layers), so each layer is held to the computation an engine runs, written from its source
with transformers' own blocks where they exist (tests/support/references.py says which, per family).

What this module does not do: the families whose tests check details one at a time (DeepSeek-V3.2 and LongCat,
MiMo-V2-Flash and ERNIE, the Qwen3 hybrids: their own test_family_*.py).
"""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest
import torch
from family_table import ENGINE_VERSIONS, FAMILIES, NESTED, Family, T
from support import hub_keys
from support import references as ref
from support.fixtures import FIXTURES, build_fixture, eagle3_depth
from support.references import GLUE, config_of, weight_map

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import OptionError, UnknownFamilyError
from mtp2draft.family.spec import find_spec, get_spec

each_family = pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.fixture)


def _inputs(seed: int = 0, t: int = T, streams: int = 0):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    shape = (2, t, streams, 64) if streams else (2, t, 64)  # a multi-stream layer's hidden: [B, T, S, H]
    return nxt, torch.randn(shape, generator=gen) * 3, torch.arange(t).expand(2, -1)


def _mtp_keys(path: Path, family: Family) -> list[str]:
    return [k for k in weight_map(path) if k.startswith(family.mtp)]


def _names(keys, prefixes: tuple[str, ...]) -> set[str]:
    return {k[len(p) :] for k in keys for p in prefixes if k.startswith(p)}


@each_family
def test_fixture_has_the_release_mtp_keys(build, family: Family) -> None:
    """Diffed against the release's key list, the MTP layer's index and expert indices abstracted."""
    release = hub_keys.load(family.fixture)
    path = build(family.fixture)
    config, fixture_config = config_of(path), FIXTURES[family.fixture]["config"]
    spec = find_spec(config)
    assert spec.name == family.fixture and spec.verified == family.verified
    assert spec.num_mtp_layers(release["config"]) == 1
    assert spec.key(spec.keys.block, release["config"], 0) == family.release_block
    ours, theirs = _mtp_keys(path, family), release["mtp_keys"]
    kept = [k for k in theirs if not (family.scales_absent and k.endswith(".scale"))]  # the bf16 fixture's
    ours_block = spec.key(spec.keys.block, config, 0)
    assert hub_keys.patterns(ours, ours_block) == hub_keys.patterns(kept, family.release_block)
    if family.exact_keys:
        assert sorted(ours) == theirs
    if family.release_tensors is not None:
        assert len(theirs) == release["mtp_tensor_count"] == family.release_tensors
    if family.experts:
        assert hub_keys.experts(ours) == set(range(spec.text_config(config)[family.experts]))
        if family.experts in (release_text := spec.text_config(release["config"])):
            assert hub_keys.experts(theirs) == set(range(release_text[family.experts]))
    if family.vllm_loads:  # every vLLM parameter, nothing else
        assert {family.vllm_loads(k) for k in theirs if ".experts." not in k} == set(release["vllm_params"])
    if family.release_is:
        other, prefix = family.release_is
        assert set(theirs) == {prefix + k for k in hub_keys.load(other)["mtp_keys"]}
    # the config fields the spec reads carry the release's names
    assert set(release["config"]) <= set(fixture_config)
    for section in NESTED:
        if section in release["config"]:
            assert set(release["config"][section]) <= set(fixture_config[section])
    keys = set(weight_map(path))
    assert set(release.get("trunk_keys_outside_layers", ())) | set(family.keys_present) <= keys
    assert all(any(k.startswith(p) for k in keys) for p in family.prefixes_present)
    assert not [k for k in keys if family.prefixes_absent and k.startswith(family.prefixes_absent)]
    if family.same_names:  # the block carries the trunk's names (transformers' save_pretrained writes the trunk)
        trunk, block = family.same_names
        assert _names(keys, trunk) == _names(ours, block) - GLUE


@each_family
def test_plan_reads_exactly_the_mtp_layer(build, family: Family) -> None:
    ckpt = open_checkpoint(str(build(family.fixture)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    layer = {k for k in ckpt.weight_map if k.startswith(family.mtp)}
    stored = {k for k in (family.stored_embed, family.stored_head) if k}
    assert stored <= layer and set(plan.checkpoint_keys) == layer - stored
    assert plan.stored_embed == family.stored_embed and plan.stored_head == family.stored_head
    module = load_native(ckpt, attach_target=False)
    for path, want in family.module.items():
        name, _, how = path.partition(":")
        got = operator.attrgetter(name)(module)
        got = {"type": lambda x: type(x).__name__, "dtype": lambda x: x.dtype, "shape": lambda x: tuple(x.shape)}.get(
            how, lambda x: x
        )(got)
        assert got == want, path


def _kinds():
    for family in FAMILIES:
        for fixture in (family.fixture, *family.variants):
            for kind in ("mtp", "eagle3"):
                yield pytest.param(family, fixture, kind, id=f"{fixture}-{kind}")


@pytest.mark.parametrize(("family", "fixture", "kind"), list(_kinds()))
def test_convert(build, tmp_path: Path, family: Family, fixture: str, kind: str) -> None:
    """Both kinds, or the native one and EAGLE-3 refused in one line (on a trunk deep enough for EAGLE-3's aux ids)."""
    deeper = eagle3_depth(fixture, kind)
    if any(isinstance(v, dict) for v in deeper.values()):  # a nested text config: built here, not cached by `build`
        source = str(build_fixture(fixture, tmp_path / "src", **deeper))
    else:
        source = str(build(fixture, **deeper))
    if kind == "eagle3" and family.refuses_eagle3:
        with pytest.raises(OptionError, match=family.refuses_eagle3):
            convert(source, tmp_path / "out", to=kind)
        assert not (tmp_path / "out").exists()
        return
    result = convert(source, tmp_path / "out", to=kind)
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == family.fixture and prov["spec_verified"] == family.verified
    assert prov["draft_kind"] == kind and bool(prov["dequantised_fp8"]) == fixture.endswith("_fp8")
    if kind == "eagle3":
        how = prov["tensors"]["midlayer.self_attn.q_proj.weight"]["how"]
        assert all(words in how for words in family.eagle3_how), how


@each_family
def test_layer_follows_the_reference(build, family: Family) -> None:
    path = build(family.fixture)
    nxt, hidden, pos = _inputs(streams=family.streams)
    for engine, variant in family.engines:
        ours = load_native(str(path)).eval()
        if engine:
            ours.train_for_engine(engine)
        with torch.no_grad():
            mine, handover = ours(nxt, hidden, pos)  # no mask given: the draft builds its own (causal, windowed)
            right, handed_on = family.reference(path, nxt, hidden, pos, **variant)
        assert (mine - right).abs().max().item() <= 1e-4, engine
        assert torch.allclose(handover, handed_on, atol=1e-5), engine  # the hand-over the engine recycles
    with torch.no_grad():
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)  # each stream's channels reversed
        wrongs = [family.reference(path, nxt, hidden, pos, **w)[0] for w in family.wrong]
    assert (mine_reversed - right).abs().max().item() > 1e-2  # the check can fail: the hidden matters
    for wrong, variant in zip(wrongs, family.wrong, strict=True):
        assert (mine - wrong).abs().max().item() > 1e-2, variant  # and so does each detail
    if family.nope:  # positions do not enter at all
        assert torch.equal(mine, ours(nxt, hidden, pos + 5)[0])


@each_family
def test_engine_rows(family: Family) -> None:
    spec = get_spec(family.fixture)
    assert spec.support_table() == family.support
    for engine, version in ENGINE_VERSIONS.items():
        facts = spec.engine(engine)
        if engine not in family.handover:
            assert facts is None
            continue
        assert spec.engine_computation(engine) == {"input_hidden": family.hidden, "final_norm": True,
                                                   "hidden_handover": family.handover[engine]}  # fmt: skip
        assert facts.version == family.versions.get(engine, version) and facts.step_layers == family.step_layers[engine]
        assert all(words in facts.sources for words in family.sources[engine]), engine
        assert all(words in facts.notes for words in family.notes.get(engine, ())), engine
        assert facts.aux_ids == family.aux_ids.get(engine, facts.aux_ids)
    if family.nextn:
        assert spec.nextn.architecture == family.nextn
    if family.refuses_eagle3:  # vLLM may capture aux states, but no transfer fits the layer
        assert spec.eagle3.transforms == ()


@each_family
def test_inspect_json_row(build, capsys, family: Family) -> None:
    path = build(family.fixture)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == family.fixture and info["block"] == family.block and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] == family.stored_embed and layer["stored_head"] == family.stored_head
    assert layer["fp8_weights"] == 0
    plan = plan_mtp_layer(open_checkpoint(str(path)), get_spec(family.fixture), 0)
    assert (
        {t["name"] for t in layer["tensors"]}
        == set(plan.checkpoint_keys)
        == set(_mtp_keys(path, family))
        - {
            family.stored_embed,
            family.stored_head,
        }
    )


# ---- checks that fit no column ----------------------------------------------------------------------------------------
def test_glm4_moe_lite_trunk_is_deepseek_v3s(build) -> None:
    """The premise of glm4_moe_lite's reference: GLM-4.7-Flash's trunk computes as DeepSeek-V3's on the same
    tensors, and the MTP layer, fed the trunk's own hidden state, follows DeepSeek-V3's MtpModel."""
    import transformers

    path = build("glm4_moe_lite")
    glm = transformers.Glm4MoeLiteForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    v3 = ref.deepseek_v3_on(path)
    gen = torch.Generator().manual_seed(0)
    ids, nxt = (torch.randint(0, 256, (2, T), generator=gen) for _ in range(2))
    pos = torch.arange(T).expand(2, -1)
    with torch.no_grad():
        hidden = glm(ids, output_hidden_states=True).hidden_states[-1]  # post final norm
        assert (hidden - v3(ids, output_hidden_states=True).hidden_states[-1]).abs().max().item() <= 1e-5
        mine, handover = load_native(str(path)).eval()(nxt, hidden, pos)
        theirs, chained = ref.glm4_moe_lite_mtp_model(path, nxt, hidden, pos)
    assert (mine - theirs).abs().max().item() <= 1e-4 and torch.allclose(handover, chained, atol=1e-5)


def test_nemotron_h_omni_layouts_are_told_apart_by_architecture() -> None:
    """Super VL (NemotronH_Omni_Reasoning_V3) keeps the MTP layer under language_model., the Super Omni export
    (Megatron-Bridge's NemotronOmniBridge) at the top: two specs. The Nano Omni, whose text config vLLM 0.33 does not
    promote for MTP, none."""
    for fixture, other, other_spec in (
        ("nemotron_h_omni", "NemotronH_Super_Omni_Reasoning_V3", "nemotron_h_super_omni"),
        ("nemotron_h_super_omni", "NemotronH_Omni_Reasoning_V3", "nemotron_h_omni"),
    ):
        config = FIXTURES[fixture]["config"]
        assert find_spec(config).name == fixture
        assert find_spec({**config, "architectures": [other]}).name == other_spec
        with pytest.raises(UnknownFamilyError, match="NemotronH_Nano_Omni_Reasoning_V3"):
            find_spec({**config, "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"]})


def test_ling_2_5_is_not_taken_for_ling_3() -> None:
    """Ling 2.5 (vLLM: a bailing_hybrid config with BailingMoeV2_5ForCausalLM) has another MTP block: no spec."""
    ling25 = {**FIXTURES["bailing_hybrid"]["config"], "architectures": ["BailingMoeV2_5ForCausalLM"]}
    with pytest.raises(UnknownFamilyError, match="no spec matches this checkpoint .BailingMoeV2_5ForCausalLM"):
        find_spec(ling25)


def test_bailing_hybrid_oracle_reads_the_expert_bias_as_we_do(build) -> None:
    path = build("bailing_hybrid")
    oracle = ref.bailing_hybrid_oracle(path)
    assert torch.equal(
        oracle.layers[0].mtp_block.mlp.gate.e_score_correction_bias,
        load_native(str(path)).block.mlp.gate.e_score_correction_bias,
    )


def test_exaone_moe_release_shapes_and_parameter_count() -> None:
    """No stored copy of the index: each MTP key's shape at the release's sizes (the roles vLLM's module gives
    them) adds up to the stored brief's parameter count."""
    release = hub_keys.load("exaone_moe")
    c, layer = release["config"], "mtp.layers.0."
    h, q, kv, d, i = (c["hidden_size"], c["num_attention_heads"] * c["head_dim"],
                      c["num_key_value_heads"] * c["head_dim"], c["head_dim"], c["intermediate_size"])  # fmt: skip
    shapes = {
        "mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,), "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,), layer + "input_layernorm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,), layer + "self_attn.q_proj.weight": (q, h),
        layer + "self_attn.k_proj.weight": (kv, h), layer + "self_attn.v_proj.weight": (kv, h),
        layer + "self_attn.o_proj.weight": (h, q), layer + "self_attn.q_norm.weight": (d,),
        layer + "self_attn.k_norm.weight": (d,), layer + "mlp.gate_proj.weight": (i, h),
        layer + "mlp.up_proj.weight": (i, h), layer + "mlp.down_proj.weight": (h, i),
    }  # fmt: skip
    assert sorted(shapes) == release["mtp_keys"]
    assert sum(torch.Size(s).numel() for s in shapes.values()) == release["mtp_param_count"] == 528_513_280


def test_exaone_moe_sglang_windows_the_layer_as_trunk_layer_0(build) -> None:
    """SGLang 0.5.23 windows the MTP layer as trunk layer 0: the same as vLLM's while every key is inside the
    window (4), not after."""
    path = build("exaone_moe")
    ours = load_native(str(path)).eval()
    ours.train_for_engine("vllm")
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        mine, _ = ours(nxt, hidden, pos)
        sglang, _ = ref.exaone_moe_vllm(path, nxt, hidden, pos, window=4)
    assert (mine[:, :4] - sglang[:, :4]).abs().max().item() <= 1e-4
    assert (mine[:, 4:] - sglang[:, 4:]).abs().max().item() > 1e-2


def test_glm_moe_dsa_trunk_shares_top_k_like_the_release(build) -> None:
    """Own indexer keys only on "full" layers (here 0 and 2) and on the MTP layer."""
    path = build("glm_moe_dsa")
    n = config_of(path)["num_hidden_layers"]
    assert {int(k.split(".")[2]) for k in weight_map(path) if ".indexer." in k} == {0, 2, n}


def test_glm_moe_dsa_fp8_dequantises(build) -> None:
    fp8, plain = open_checkpoint(str(build("glm_moe_dsa_fp8"))), str(build("glm_moe_dsa"))
    assert fp8.info("model.layers.4.self_attn.indexer.wq_b.weight").dtype == "F8_E4M3"
    assert fp8.scale_key("model.layers.4.eh_proj.weight") is None
    ours, ref_module = load_native(fp8, attach_target=False), load_native(plain, attach_target=False)
    quantised = 0
    for (key, a), (_, b) in zip(ours.state_dict().items(), ref_module.state_dict().items(), strict=True):
        if not torch.equal(a, b):
            quantised += 1
            assert (a - b).abs().max() <= 0.07 * b.abs().max(), key  # e4m3: 3 mantissa bits
    assert quantised > 10


def test_glm_moe_dsa_layer_uses_the_draft_cache(build) -> None:
    from mtp2draft.draft.modules import DraftCache

    ours = load_native(str(build("glm_moe_dsa"))).eval()
    nxt, hidden, pos = _inputs(1)
    cache = DraftCache()
    with torch.no_grad():
        full, _ = ours(nxt, hidden, pos)
        first, _ = ours(nxt[:, :6], hidden[:, :6], pos[:, :6], cache=cache)
        rest, _ = ours(nxt[:, 6:], hidden[:, 6:], pos[:, 6:], cache=cache)
    assert cache.indexer is not None and cache.indexer.shape[-2] == T
    assert (torch.cat([first, rest], 1) - full).abs().max().item() <= 1e-4
