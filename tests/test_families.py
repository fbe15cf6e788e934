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

import itertools
import json
import operator
from pathlib import Path

import pytest
import torch
from family_table import ENGINE_VERSIONS, FAMILIES, NESTED, Family, T
from safetensors.torch import load_file
from support import hub_keys
from support import references as ref
from support.fixtures import FIXTURES, build_fixture, eagle3_depth
from support.references import GLUE, config_of, weight_map

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import load_native
from mtp2draft.draft.modules import DraftCache, Eagle3Draft, NativeMtpDraft
from mtp2draft.errors import OptionError, UnknownFamilyError
from mtp2draft.family.spec import find_spec, get_spec

each_family = pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.fixture)


def _inputs(seed: int = 0, t: int = T):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    return nxt, torch.randn(2, t, 64, generator=gen) * 3, torch.arange(t).expand(2, -1)


def _spec_name(family: Family) -> str:
    return family.spec or family.fixture


def _mtp_keys(path: Path, family: Family) -> list[str]:
    return [k for k in weight_map(path) if k.startswith(family.mtp)]


def _names(keys, prefixes: tuple[str, ...]) -> set[str]:
    return {k[len(p) :] for k in keys for p in prefixes if k.startswith(p)}


def _against_the_release(family: Family, spec, config: dict, ours: list[str]) -> set[str]:
    """The fixture's MTP keys and config field names against the release's (stored key list); returns the trunk keys
    outside the layers the release has."""
    release, fixture_config = hub_keys.load(family.fixture), FIXTURES[family.fixture]["config"]
    assert spec.num_mtp_layers(release["config"]) == family.layers
    assert spec.key(spec.keys.block, release["config"], 0) == family.release_block
    theirs = release["mtp_keys"]
    ours_block = spec.key(spec.keys.block, config, 0)
    assert hub_keys.patterns(ours, ours_block) == hub_keys.patterns(theirs, family.release_block)
    if family.exact_keys:
        assert sorted(ours) == theirs
    if family.release_tensors is not None:
        assert len(theirs) == release["mtp_tensor_count"] == family.release_tensors
    if family.experts and family.experts in (release_text := spec.text_config(release["config"])):
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
    return set(release.get("trunk_keys_outside_layers", ()))


@each_family
def test_fixture_has_the_release_mtp_keys(build, family: Family) -> None:
    """Diffed against the release's key list, the MTP layer's index and expert indices abstracted; where no key list
    of the release is stored, against the engines' loaders' names (`keys`)."""
    path = build(family.fixture)
    config = config_of(path)
    spec = find_spec(config)
    assert spec.name == _spec_name(family) and spec.verified == family.verified
    assert spec.num_mtp_layers(config) == family.layers
    ours = _mtp_keys(path, family)
    trunk = _against_the_release(family, spec, config, ours) if family.stored else set()
    if family.keys:
        assert sorted(ours) == sorted(family.keys)
    if family.experts:
        assert hub_keys.experts(ours) == set(range(spec.text_config(config)[family.experts]))
    keys = set(weight_map(path))
    assert trunk | set(family.keys_present) | set(family.trunk_reads) <= keys
    assert all(any(k.startswith(p) for k in keys) for p in family.prefixes_present)
    assert not [k for k in keys if family.prefixes_absent and k.startswith(family.prefixes_absent)]
    if family.same_names:  # the block carries the trunk's names (transformers' save_pretrained writes the trunk)
        trunk_prefixes, block = family.same_names
        assert _names(keys, trunk_prefixes) == _names(ours, block) - GLUE


def _fixtures(family: Family) -> list:
    return [pytest.param(family, f, id=f) for f in (family.fixture, *family.variants)]


@pytest.mark.parametrize(("family", "fixture"), [p for f in FAMILIES for p in _fixtures(f)])
def test_plan_reads_exactly_the_mtp_layer(build, family: Family, fixture: str) -> None:
    """The plan reads layer 0's tensors (an FP8 weight with its scale) and the trunk tensors the row names, not the
    stored embedding / head copies; the module built has the row's parts."""
    ckpt = open_checkpoint(str(build(fixture)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    layer = {k for k in ckpt.weight_map if k.startswith(family.mtp)}
    stored = {k for k in (family.stored_embed, family.stored_head) if k}
    weights = {k for k in layer if not k.endswith("_scale_inv")}
    assert stored <= layer and set(plan.checkpoint_keys) == weights - stored | set(family.trunk_reads)
    assert set(ckpt.needed_keys(plan.checkpoint_keys)) == layer - stored - {k + "_scale_inv" for k in stored} | set(
        family.trunk_reads
    )
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
            for layer in range(family.layers):
                for kind in ("mtp", "eagle3"):
                    yield pytest.param(family, fixture, layer, kind, id=f"{fixture}-{layer}-{kind}")


@pytest.mark.parametrize(("family", "fixture", "layer", "kind"), list(_kinds()))
def test_convert(build, tmp_path: Path, capsys, family: Family, fixture: str, layer: int, kind: str) -> None:
    """Both kinds of every layer, or the native one and EAGLE-3 refused in one line (on a trunk deep enough for
    EAGLE-3's aux ids)."""
    deeper = eagle3_depth(fixture, kind)
    if any(isinstance(v, dict) for v in deeper.values()):  # a nested text config: built here, not cached by `build`
        source = build_fixture(fixture, tmp_path / "src", **deeper)
    else:
        source = build(fixture, **deeper)
    out = tmp_path / "out"
    if kind == "eagle3" and family.refuses_eagle3:
        with pytest.raises(OptionError, match=family.refuses_eagle3):
            convert(str(source), out, to=kind)
        assert not out.exists()
        return
    assert main(["convert", str(source), "--out", str(out), "--to", kind, "--layer", str(layer), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == [
        ".mtp2draft",
        "config.json",
        "model.safetensors",
        "provenance.json",
    ]
    prov = json.loads((out / "provenance.json").read_text())
    assert summary["spec"] == prov["spec"] == _spec_name(family) and prov["spec_verified"] == family.verified
    assert summary["mtp_layer"] == prov["mtp_layer"] == layer and prov["draft_kind"] == kind
    assert bool(prov["dequantised_fp8"]) == (fixture.endswith("_fp8") or family.fp8_weights > 0)
    draft = load_draft(out)
    if kind == "mtp":
        assert isinstance(draft, NativeMtpDraft) and draft.layer == layer
        return
    assert isinstance(draft, Eagle3Draft)
    for tensor, words in family.eagle3_how.items():
        assert all(w in prov["tensors"][tensor]["how"] for w in words), (tensor, prov["tensors"][tensor]["how"])
    for tensor, exact in family.eagle3_exact.items():
        assert prov["tensors"][tensor]["exact"] == exact, tensor
    if family.eagle3_norm:  # the zero-centred final norm folded: x * (1 + w)
        spec = get_spec(_spec_name(family))
        stored = load_file(str(out / "model.safetensors"))["norm.weight"]
        folded = 1 + ref.tensors(source)[spec.keys.final_norm]  # in fp32, rounded once to the stored dtype
        assert torch.equal(stored, folded.to(stored.dtype)) and torch.equal(draft.norm.weight.detach(), stored.float())


@each_family
def test_layer_past_the_last_fails_cleanly(build, tmp_path: Path, capsys, family: Family) -> None:
    code = main(["convert", str(build(family.fixture)), "--out", str(tmp_path / "o"), "--layer", str(family.layers)])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(lines) == 1 and f"--layer {family.layers} is out of range" in lines[0]
    assert f"{family.layers} MTP layer(s)" in lines[0]
    assert not (tmp_path / "o").exists()


@each_family
def test_layer_follows_the_reference(build, family: Family) -> None:
    path = build(family.fixture)
    nxt, hidden, pos = _inputs()
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
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
        wrongs = [family.reference(path, nxt, hidden, pos, **w)[0] for w in family.wrong]
    assert (mine_reversed - right).abs().max().item() > 1e-2  # the check can fail: the hidden matters
    for wrong, variant in zip(wrongs, family.wrong, strict=True):
        assert (mine - wrong).abs().max().item() > 1e-2, variant  # and so does each detail
    if family.nope:  # positions do not enter at all
        assert torch.equal(mine, ours(nxt, hidden, pos + 5)[0])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.cache_chunks], ids=lambda f: f.fixture)
def test_cached_steps_equal_one_pass(build, family: Family) -> None:
    """Chunk by chunk with DraftCache (no mask given: the default mask offsets queries by the cache length, keeps a
    window across steps, and the DSA indexer caches its keys) equals the full causal forward."""
    ours = load_native(str(build(family.fixture))).eval()
    nxt, hidden, pos = _inputs(1)
    cache = DraftCache()
    bounds = (0, *family.cache_chunks)
    with torch.no_grad():
        full, _ = ours(nxt, hidden, pos)
        steps = [ours(nxt[:, a:b], hidden[:, a:b], pos[:, a:b], cache=cache)[0] for a, b in itertools.pairwise(bounds)]
    assert bounds[-1] == T and (torch.cat(steps, 1) - full).abs().max().item() <= 1e-4
    assert (cache.indexer is not None) == family.block.startswith("mla_dsa")
    assert cache.indexer is None or cache.indexer.shape[-2] == T


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.fp8_dtypes], ids=lambda f: f.fixture)
def test_fp8_variant_dequantises(build, family: Family) -> None:
    """The FP8 release's layout (which MTP weights are FP8 blocks, which are unscaled) and its weights dequantised
    to within e4m3's precision of the plain fixture's."""
    (variant,) = family.variants
    fp8 = open_checkpoint(str(build(variant)))
    for key, dtype in family.fp8_dtypes.items():
        if dtype:
            assert fp8.info(family.mtp + key).dtype == dtype, key
        else:
            assert fp8.scale_key(family.mtp + key) is None, key
    ours = load_native(fp8, attach_target=False)
    plain = load_native(str(build(family.fixture)), attach_target=False)
    quantised = 0
    for (key, a), (_, b) in zip(ours.state_dict().items(), plain.state_dict().items(), strict=True):
        if not torch.equal(a, b):
            quantised += 1
            assert (a - b).abs().max() <= 0.07 * b.abs().max(), key  # e4m3: 3 mantissa bits
    assert quantised > 10


@each_family
def test_engine_rows(family: Family) -> None:
    spec = get_spec(_spec_name(family))
    assert spec.support_table() == family.support
    for engine, version in ENGINE_VERSIONS.items():
        facts = spec.engine(engine)
        if engine not in family.handover:
            assert facts is None
            continue
        assert spec.engine_computation(engine) == {"input_hidden": "post_norm",
                                                   "final_norm": family.final_norm.get(engine, True),
                                                   "hidden_handover": family.handover[engine]}  # fmt: skip
        assert facts.version == version and facts.step_layers == family.step_layers[engine]
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
    assert info["spec"] == _spec_name(family) and info["block"] == family.block
    assert info["num_mtp_layers"] == family.layers
    layer = info["layers"][0]
    assert layer["stored_embed"] == family.stored_embed and layer["stored_head"] == family.stored_head
    assert layer["fp8_weights"] == family.fp8_weights
    plan = plan_mtp_layer(open_checkpoint(str(path)), get_spec(_spec_name(family)), 0)
    names = {t["name"] for t in layer["tensors"]}
    assert names == set(_mtp_keys(path, family)) - {family.stored_embed, family.stored_head} | set(family.trunk_reads)
    assert set(plan.checkpoint_keys) == {n for n in names if not n.endswith("_scale_inv")}


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
