"""DeepSeek-V4's MTP layer: its hidden state is four residual streams (hyper-connections), so the checks of the family
table are made here on [B, T, hc_mult, H] hand-overs, one step and a chain of k = 4.

- the fixture's MTP keys against the key lists of the V4-Flash and V4-Pro releases (committed test data, sources
  cited there), less the FP8 / FP4 `.scale` siblings the bf16 fixture leaves out;
- the key mapping against vLLM 0.34's `DeepSeekV4MTP.load_weights` (`deepseek_v4_vllm_loads`, written from it);
- the native layer against a reference computation written from vLLM 0.34's forward, in plain torch
  (tests/support/reference_v4.py): one step, the chain of k = 4 draft steps recycling the streams, and training-time
  test's unrolled steps; and piece by piece, the reference's pieces against transformers 5.24's own modules;
- `inspect` names exactly the MTP layer's tensors, and over the loopback Hub fetches their bytes and no more, on the
  bf16 fixture and on `deepseek_v4_fp4`, the same layer in the release's quantisation (FP4 experts, FP8 linears, e8m0
  `.scale` siblings, fp32 mixes: the dtype column of the release's key lists), which converts to the bf16 fixture's
  draft within the formats' rounding;
- DSpark (V4-0731 / V4.1) is told apart from V4's MTP layer on the real configs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import hub_keys
from support import reference_v4 as v4
from support.fixtures import FIXTURES
from support.references import config_of, tensors, weight_map

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import plan_mtp_layer
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import DraftError, NotMtpError
from mtp2draft.evaluation.decode import draft_chain
from mtp2draft.family.spec import find_spec, get_spec
from mtp2draft.target.hidden import Features
from mtp2draft.train.ttt import ttt_forward

FIXTURE, SHIPPED, T, S, H = "deepseek_v4", "deepseek_v4_fp4", 10, 4, 64
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ROOT = Path(__file__).resolve().parents[1]
BUNDLED, DATA = ROOT / "examples" / "targets" / "tiny-deepseek-v4", ROOT / "examples" / "data"


def _inputs(seed: int = 0, t: int = T):
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, t), generator=gen)
    return nxt, torch.randn(2, t, S, H, generator=gen) * 3, torch.arange(t).expand(2, -1)


def _no_scales(keys) -> set[str]:
    return {k for k in keys if not k.endswith(".scale")}


@pytest.mark.parametrize("release", ["deepseek_v4", "deepseek_v4_pro"])
def test_fixture_has_the_release_mtp_keys(build, release: str) -> None:
    data = hub_keys.load(release)
    path = build(FIXTURE)
    ours = [k for k in weight_map(path) if k.startswith("mtp.")]
    assert len(data["mtp_keys"]) == data["mtp_tensor_count"]
    assert hub_keys.patterns(ours, "") == _no_scales(hub_keys.patterns(data["mtp_keys"], ""))
    # every quantised weight of the release has its .scale; norms, hc_*, attn_sink, gate stay unquantised
    scaled = {k[: -len(".scale")] for k in data["mtp_keys"] if k.endswith(".scale")}
    assert {k[: -len(".weight")] for k in data["mtp_keys"] if k.endswith(".weight") and "norm" not in k} - scaled == {
        "mtp.0.ffn.gate"
    }
    spec = find_spec(data["config"])
    assert spec.name == FIXTURE and spec.num_mtp_layers(data["config"]) == 1
    assert spec.num_streams(data["config"]) == 4
    assert hub_keys.experts(data["mtp_keys"]) == set(range(data["config"]["n_routed_experts"]))
    assert set(data["trunk_keys_outside_layers"]) <= set(weight_map(path))
    assert set(data["config"]) <= set(FIXTURES[FIXTURE]["config"])
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


def test_key_mapping_is_vllms(build) -> None:
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
    path = build(FIXTURE)
    plan = plan_mtp_layer(open_checkpoint(str(path)), get_spec(FIXTURE), 0)
    ours = {k: g.module_key for g in plan.groups for k in g.ckpt_keys if ".experts." not in k}
    # the pairing: our module key <-> vLLM's parameter, one to one over the unfused keys
    unfused = {k for k in ours if not any(f in vllm[k] for f in ("fused_wqa_wkv", "gate_up_proj"))}
    assert len({(ours[k], vllm[k]) for k in unfused}) == len({ours[k] for k in unfused}) == len(unfused)
    assert ours["mtp.0.norm.weight"] == "final_norm.weight" and ours["mtp.0.h_proj.weight"] == "h_proj.weight"
    assert ours["mtp.0.hc_head_fn"] == "hc_head.hc_fn" and ours["mtp.0.attn.attn_sink"] == "block.self_attn.sinks"


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith("mtp.")}
    module = load_native(ckpt, attach_target=False)
    assert type(module.block).__name__ == "DeepseekV4DecoderLayer" and module.block.self_attn.compressor is None
    assert not module.block.mlp.is_hash and module.hidden_shape == (S, H) and module.attention_window == 4


def test_one_step_follows_vllms_forward(build) -> None:
    """The reference is written from vLLM 0.34's forward (tests/support/reference_v4.py), in plain torch."""
    path = build(FIXTURE)
    nxt, hidden, pos = _inputs()
    ours = load_native(str(path)).eval()
    for engine in (None, "vllm", "sglang"):
        if engine:
            ours.train_for_engine(engine)
        with torch.no_grad():
            mine, handover = ours(nxt, hidden, pos)
            right, streams = v4.deepseek_v4_vllm(path, nxt, hidden, pos)
        assert handover.shape == (2, T, S, H)
        assert (mine - right).abs().max().item() <= 1e-4, engine
        assert (handover - streams).abs().max().item() <= 1e-4, engine
    with torch.no_grad():  # each check can fail: the window, hc_head, the hidden's streams, position-0 zeroing
        for variant in ({"window": None}, {"hc_reduce": False}, {"zero_first": True}):
            wrong, _ = v4.deepseek_v4_vllm(path, nxt, hidden, pos, **variant)
            assert (mine - wrong).abs().max().item() > 1e-2, variant
        swapped, _ = ours(nxt, hidden.roll(1, dims=2), pos)
        assert (mine - swapped).abs().max().item() > 1e-2
    with pytest.raises(DraftError, match=r"reads 4 residual streams \[B, T, 4, 64\], got .*\[2, 10, 64\]"):
        ours(nxt, hidden[:, :, 0], pos)


def test_chain_of_four_recycles_the_streams(build) -> None:
    """The serving-time chain (evaluate's draft_chain, with its caches) and training-time test's unrolled steps
    against vLLM's chain of k = 4 steps (the streams handed on, recycled as previous_hidden_states)."""
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    gen = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (1, T + 6), generator=gen)
    hidden = torch.randn(1, T + 6, S, H, generator=gen) * 3
    origin, k = T - 1, 4
    with torch.no_grad():
        chain = draft_chain(ours, hidden, data, origin, k)
        right = v4.deepseek_v4_chain(path, data[:, 1 : origin + k + 1], hidden[:, : origin + 1], k)
        features = Features(final=hidden, aux=None, logits=torch.zeros(1, T + 6, 256))
        mask = torch.ones_like(data, dtype=torch.bool)
        unrolled = ttt_forward(ours, features, data, mask, k, [1.0] * k, return_logits=True)
    for s in range(k):
        assert (chain[s].reshape(-1) - right[s].reshape(-1)).abs().max().item() <= 1e-4, s
        assert (unrolled[s][0, origin] - right[s][0]).abs().max().item() <= 1e-4, s
    assert (right[3] - right[0]).abs().max().item() > 1e-2  # the steps differ: the chain is not one step repeated


def test_pieces_match_transformers_modules(build) -> None:
    """The reference's pieces, written from vLLM, against transformers 5.24's DeepSeek-V4 modules loaded with the
    same tensors: the hyper-connection mixer, the stream-reducing head, the attention and the MoE."""
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    c, w = config_of(path), tensors(path)
    gen = torch.Generator().manual_seed(5)
    streams, x = torch.randn(2, T, S, H, generator=gen), torch.randn(2, T, H, generator=gen)
    pos = torch.arange(T).expand(2, -1)
    block = ours.block
    with torch.no_grad():
        post, comb, collapsed = block.attn_hc(streams)
        r_post, r_comb, r_in = v4.mhc_pre(streams, w["mtp.0.hc_attn_fn"], w["mtp.0.hc_attn_scale"],
                                          w["mtp.0.hc_attn_base"], torch.ones(H), c)  # fmt: skip
        assert torch.allclose(post.unsqueeze(-1), r_post, atol=1e-5) and torch.allclose(comb, r_comb, atol=1e-5)
        assert torch.allclose(block.input_layernorm(collapsed) / block.input_layernorm.weight, r_in, atol=1e-4)
        head = v4.hc_head(streams, w["mtp.0.hc_head_fn"], w["mtp.0.hc_head_scale"], w["mtp.0.hc_head_base"], c)
        assert torch.allclose(ours.hc_head(streams), head, atol=1e-5)
        pe = ours.position_embeddings(x, pos)
        attn, _ = block.self_attn(x, position_embeddings=pe, position_ids=pos, attention_mask=ours.default_mask(x))
        assert torch.allclose(attn, v4.attention(w, x, pos, c, c["sliding_window"]), atol=1e-4)
        assert torch.allclose(block.mlp(x), v4.moe(w, x, c), atol=1e-4)


def test_converted_draft_hands_on_the_streams(build, tmp_path: Path) -> None:
    """`convert` writes the layer kind's hand-over (the streams, pre_norm), so the draft loads and distill / evaluate
    take it; a post_norm hand-over (the single-hidden layers' default) would be refused when loaded."""
    out = tmp_path / "raw"
    assert main(["convert", str(build(FIXTURE)), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_handover"] == cfg["input_hidden"] == "pre_norm"
    draft = load_draft(out)
    assert draft.hidden_handover == "pre_norm" and draft.hidden_shape == (S, H)
    (out / "config.json").write_text(json.dumps({**cfg, "hidden_handover": "post_norm"}))
    with pytest.raises(DraftError, match="hands on its hc_mult residual streams"):
        load_draft(out)


def test_step0_reads_the_target_streams_before_hc_head(target) -> None:
    """What `TargetModel.run` hands step 0 of a V4 target is its last decoder layer's output, the hc_mult streams
    before `hc_head` ([B, T, 4, H]), which is what the spec's engine table says both engines read (`hidden =
    "pre_norm"`: vLLM 0.34's pre-hc_head residual, SGLang 0.5.23's hidden_states_before_norm): the target's own
    logits are head(norm(hc_head(those streams)))."""
    from mtp2draft.target.hidden import TargetModel

    spec = get_spec(FIXTURE)
    assert spec.layer.hidden == "pre_norm" and spec.layer.streams == "hc_mult"
    assert {e: spec.engine(e).hidden for e in ("vllm", "sglang")} == {"vllm": "pre_norm", "sglang": "pre_norm"}
    model = TargetModel(str(target(FIXTURE)))
    ids = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(7))
    seen = {}
    hook = model.model.model.hc_head.register_forward_hook(lambda _m, args, _out: seen.update(x=args[0]))
    try:
        feats = model.run(ids)
    finally:
        hook.remove()
    assert feats.final.shape == (2, T, S, H) and torch.equal(feats.final, seen["x"])
    decoder = model.model.model
    logits = model.model.lm_head(decoder.norm(decoder.hc_head(feats.final)))
    assert torch.allclose(logits.float(), feats.logits, atol=1e-5)
    assert (feats.final[:, :, 0] - feats.final[:, :, 1]).abs().max() > 1e-3  # four distinct streams, not copies


def test_a_dump_holds_the_streams_and_distill_reads_it(target, text_data, tmp_path: Path, capsys) -> None:
    """`dump-hidden` records what the MTP layer consumes, the target's last-layer streams [T, 4, H] before hc_head;
    `distill --hidden-states` trains on them; a dump whose `final` lost the streams is one `error:` line."""
    from safetensors.torch import save_file

    path = target(FIXTURE)
    raw, dump = tmp_path / "raw", tmp_path / "dump"
    assert main(["convert", str(path), "--out", str(raw)]) == 0
    common = ["--max-length", "24"]
    assert main(["dump-hidden", "--target", str(path), "--data", str(text_data), "--draft", str(raw),
                 "--out", str(dump), *common]) == 0  # fmt: skip
    shard = sorted(dump.glob("hidden-*.safetensors"))[0]
    records = load_file(str(shard))
    assert records["0.final"].shape[1:] == (S, H)
    out = ["--steps", "2", "--batch-size", "2", *common]
    assert main(["distill", str(raw), "--hidden-states", str(dump), "--out", str(tmp_path / "ft"), *out]) == 0
    save_file({k: (v[:, 0].contiguous() if k.endswith(".final") else v) for k, v in records.items()}, str(shard))
    capsys.readouterr()
    assert main(["distill", str(raw), "--hidden-states", str(dump), "--out", str(tmp_path / "ft2"), *out]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert "expected [" in errors[0] and "4 residual streams" in errors[0]


@pytest.mark.parametrize("release", ["deepseek_v4", "deepseek_v4_pro"])
def test_shipped_fixture_has_the_release_keys_and_dtypes(build, release: str) -> None:
    """Every MTP tensor of the quantised fixture, `.scale` siblings included, has the release's name pattern and
    dtype (the weights reports' dtype column, committed beside the key lists)."""
    data = hub_keys.load(release)
    path = build(SHIPPED)
    ckpt = open_checkpoint(str(path))
    ours = {hub_keys.pattern(k, "mtp.0."): ckpt.info(k).dtype for k in ckpt.weight_map if k.startswith("mtp.")}
    assert ours == data["mtp_dtypes"]
    assert set(ours) == hub_keys.patterns(data["mtp_keys"], "mtp.0.")
    assert config_of(path)["quantization_config"] == data["quantization_config"]


def _stored(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files as stored (no cast)."""
    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _dequantised_by_rule(path: Path) -> dict[str, torch.Tensor]:
    """The quantised fixture's MTP weights dequantised here by the formats' rules (e2m1 low nibble first times
    2^(e8m0 - 127) per 32 inputs; e4m3 times the e8m0 scale of its 128 x 128 block), keyed by weight."""
    raw, out = _stored(path), {}
    lut = torch.tensor(E2M1 + tuple(-v for v in E2M1))
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


def test_shipped_converts_to_the_bf16_draft_within_rounding(build, tmp_path: Path) -> None:
    """plan takes each `.scale` as part of its weight (no stray block key); the converted draft equals the bf16
    fixture's within FP4 / FP8 rounding, and equals the formats' rule applied to the stored bytes to fp32 rounding."""
    shipped, plain = open_checkpoint(str(build(SHIPPED))), open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(shipped, find_spec(shipped.config), 0)
    assert set(shipped.needed_keys(plan.checkpoint_keys)) == {k for k in shipped.weight_map if k.startswith("mtp.")}
    assert set(plan.checkpoint_keys) == set(plan_mtp_layer(plain, find_spec(plain.config), 0).checkpoint_keys)
    rule = _dequantised_by_rule(build(SHIPPED))
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
    for a, b in ((SHIPPED, "q"), (FIXTURE, "b")):
        assert main(["convert", str(build(a)), "--out", str(tmp_path / b), "--to", "mtp"]) == 0
    q, b = _stored(tmp_path / "q"), _stored(tmp_path / "b")
    assert set(q) == set(b)
    for key in q:
        assert (q[key].float() - b[key].float()).abs().max().item() <= b[key].float().abs().max().item() / 3 + 1e-6


@pytest.mark.parametrize("fixture", [FIXTURE, SHIPPED])
def test_inspect_names_exactly_the_mtp_layer(build, capsys, fixture: str) -> None:
    path = build(fixture)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "swa_sink + moe" and info["num_mtp_layers"] == 1
    names = {t["name"] for t in info["layers"][0]["tensors"]}
    assert names == {k for k in weight_map(path) if k.startswith("mtp.")}


def test_dspark_is_told_apart_on_the_real_configs(build, capsys) -> None:
    """V4-0731's config (DSpark stages under mtp.*) is refused in one line; V4-Flash's and V4-Pro's are this spec."""
    for release in ("deepseek_v4", "deepseek_v4_pro"):
        assert find_spec(hub_keys.load(release)["config"]).name == FIXTURE
    dspark = hub_keys.load("deepseek_v4_0731_dspark")["config"]
    with pytest.raises(NotMtpError, match="DSpark block drafter"):
        find_spec({**hub_keys.load("deepseek_v4")["config"], **dspark})
    assert main(["inspect", str(build("deepseek_v4_0731_dspark"))]) == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "DSpark" in err


@pytest.mark.hub
@pytest.mark.parametrize("fixture", [FIXTURE, SHIPPED])
def test_over_the_hub_inspect_reads_headers_and_convert_the_mtp_layer(
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


def _lines(src: Path, out: Path, first: int, count: int) -> Path:
    out.write_text("".join(src.read_text().splitlines(keepends=True)[first : first + count]))
    return out


@pytest.mark.slow  # ~1-2 min on 2 cores: every stage once, on a few short sequences
def test_the_whole_pipeline_on_the_bundled_target(tmp_path: Path, capsys) -> None:
    """On examples/targets/tiny-deepseek-v4 (transformers' DeepSeek-V4 trunk, 4 streams, its MTP layer trained jointly
    by scripts/train_target.py): convert -> distill, online and from a `dump-hidden` dump -> evaluate (the raw head
    beside the distilled one, paired interval; greedy lossless, temperature 1 with its distribution check) -> export
    --format stitched -> validate; the stitched layer read back is the distilled one to bf16 rounding."""
    from mtp2draft.conversion import convert

    train, prompts = _lines(DATA / "train.jsonl", tmp_path / "t.jsonl", 0, 4), tmp_path / "p.jsonl"
    _lines(DATA / "heldout.jsonl", prompts, 100, 2)
    raw, ft, ft_off, st = (tmp_path / n for n in ("raw", "ft", "ft-off", "st"))
    assert main(["convert", str(BUNDLED), "--out", str(raw)]) == 0
    small = ["--steps", "2", "--batch-size", "2", "--max-length", "32", "--lr", "1e-3"]
    assert main(["distill", str(raw), "--target", str(BUNDLED), "--data", str(train), "--out", str(ft), *small]) == 0
    assert main(["dump-hidden", "--target", str(BUNDLED), "--data", str(train), "--draft", str(raw),
                 "--out", str(tmp_path / "dump"), "--max-length", "32"]) == 0  # fmt: skip
    assert main(["distill", str(raw), "--hidden-states", str(tmp_path / "dump"), "--out", str(ft_off), *small]) == 0
    before = load_file(str(raw / "model.safetensors"))
    for trained in (ft, ft_off):
        after = load_file(str(trained / "model.safetensors"))
        assert after.keys() == before.keys() and any(not torch.equal(after[k].to(before[k].dtype), before[k])
                                                     for k in before)  # fmt: skip
    capsys.readouterr()
    ev = ["evaluate", str(ft), "--target", str(BUNDLED), "--data", str(prompts), "--baseline", str(raw), "-k", "2"]
    ev += ["--max-new-tokens", "8", "--max-prompt-length", "32", "--json"]
    for extra in ([], ["--temperature", "1", "--seed", "0", "--draft-sampling", "sample"]):
        assert main([*ev, *extra]) == 0
        report = json.loads(capsys.readouterr().out)
        assert len(report["results"]) == 2 and report["comparison"][0]["prompts"] == 2
        diff = report["comparison"][0]["difference"]["mean_acceptance_length"]
        assert diff["low"] <= diff["value"] <= diff["high"]
        for result in report["results"]:
            assert 1.0 <= result["mean_acceptance_length"] <= 3.0
            if extra:
                assert result["distribution_check"] is not None
            else:
                assert result["lossless"] is True
    assert main(["export", str(ft), "--format", "stitched", "--target", str(BUNDLED), "--out", str(st)]) == 0
    assert main(["validate", str(st)]) == 0
    overlay = tmp_path / "overlay"
    shutil.copytree(BUNDLED, overlay)
    for name in json.loads((st / "provenance.json").read_text())["export"]["overlay_files"]:
        shutil.copyfile(st / name, overlay / name)
    convert(str(overlay), tmp_path / "back", to="mtp")
    back, fine = load_file(str(tmp_path / "back" / "model.safetensors")), load_file(str(ft / "model.safetensors"))
    assert back.keys() == fine.keys()
    for key in fine:
        assert torch.equal(back[key].float(), fine[key].to(back[key].dtype).float()), key
