"""MiMo-V2-Flash and ERNIE-4.5 MoE: conversion of every MTP layer, the keys selected, and the native layer against
the computation the reference table spells out, written here from checkpoint tensors by their hub names.

Each family has one reference function; each detail that can go wrong (which layer's weights, the sliding window,
FP8 dequantisation, which final norm, the dense MLP) gets its own assertion against a reference that gets it wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from support.fixtures import eagle3_depth
from support.references import config_of

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.layout import load_native
from mtp2draft.draft.modules import DraftCache, Eagle3Draft, NativeMtpDraft
from mtp2draft.family.spec import find_spec, get_spec

T = 10  # sequence length: longer than MiMo-V2-Flash's fixture window (sliding_window_size 4 -> 5 tokens)


# ---- checkpoint tensors by hub name, read with plain safetensors ------------------------------------------------
def _raw(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("model-0*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _dequant(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """W[i, j] * scale_inv[i // 128, j // 128], the reference table's formula."""
    m, n = weight.shape
    full = scale_inv.float().repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :n]
    return weight.float() * full


def _weights(path: Path, dequant: bool = True) -> dict[str, torch.Tensor]:
    """fp32 tensors by hub name; FP8 weights dequantised with their `weight_scale_inv` (or, with dequant=False,
    taken at face value, as a reader that ignores the scales would)."""
    raw = _raw(path)
    out = {}
    for key, tensor in raw.items():
        if key.endswith("_scale_inv"):
            continue
        scale = raw.get(key + "_scale_inv")
        out[key] = _dequant(tensor, scale) if dequant and scale is not None else tensor.float()
    return out


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _mask(t: int, window: int | None) -> torch.Tensor:
    """Additive causal mask [1, 1, t, t]; with a window, key j is visible from query i iff i - window < j <= i."""
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) & (j > i - window) if window else j <= i
    return torch.zeros(t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


def _load(module: torch.nn.Module, w: dict[str, torch.Tensor], names: dict[str, str]) -> torch.nn.Module:
    module.load_state_dict({k: w[v] for k, v in names.items()})
    return module.eval()


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (2, T), generator=gen)
    hidden = torch.randn(2, T, 64, generator=gen) * 3
    return nxt, hidden, torch.arange(T).expand(2, -1)


# ---- MiMo-V2-Flash reference ------------------------------------------------------------------------------------
def _mimo_v2_block_config(config: dict):
    """transformers config of the MTP attention as the engines read the release's fields (swa_* heads and dims,
    swa_rope_theta, sliding_window_size tokens before the query, layernorm_epsilon)."""
    from transformers import MiMoV2FlashConfig

    def rope(theta: float) -> dict:
        return {
            "rope_type": "default",
            "rope_theta": float(theta),
            "partial_rotary_factor": config["partial_rotary_factor"],
        }

    cfg = MiMoV2FlashConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        num_hidden_layers=1,
        layer_types=["sliding_attention"],
        mlp_layer_types=["dense"],
        num_attention_heads=config["swa_num_attention_heads"],
        num_key_value_heads=config["swa_num_key_value_heads"] // 2,  # transformers doubles kv heads on SWA layers
        head_dim=config["swa_head_dim"],
        v_head_dim=config["swa_v_head_dim"],
        attention_value_scale=config["attention_value_scale"],
        rope_parameters={
            "sliding_attention": rope(config["swa_rope_theta"]),
            "full_attention": rope(config["rope_theta"]),
        },
        rms_norm_eps=config["layernorm_epsilon"],
    )
    cfg._attn_implementation = "eager"
    return cfg


def _mimo_v2_reference(w, config, layer, nxt, hidden, pos, window: bool = True) -> torch.Tensor:
    """enorm/hnorm -> [embed, hidden] -> eh_proj -> SWA attention (sink bias) + dense MLP -> final_layernorm -> head."""
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import (
        MiMoV2FlashAttention,
        MiMoV2FlashMLP,
        MiMoV2FlashRotaryEmbedding,
    )

    eps, p = config["layernorm_epsilon"], f"model.mtp.layers.{layer}."
    e = F.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat([_rms(e, w[p + "enorm.weight"], eps), _rms(hidden, w[p + "hnorm.weight"], eps)], -1)
    x = x @ w[p + "eh_proj.weight"].T
    cfg = _mimo_v2_block_config(config)
    attn_names = {f"{n}_proj.weight": f"{p}self_attn.{n}_proj.weight" for n in "qkvo"}
    attn = _load(MiMoV2FlashAttention(cfg, 0), w, {**attn_names, "sinks": p + "self_attn.attention_sink_bias"})
    mlp = _load(MiMoV2FlashMLP(cfg), w, {f"{n}_proj.weight": f"{p}mlp.{n}_proj.weight" for n in ("gate", "up", "down")})
    rope = MiMoV2FlashRotaryEmbedding(cfg)(x, pos, layer_type="sliding_attention")
    mask = _mask(x.shape[1], config["sliding_window_size"] + 1 if window else None)
    h = x + attn(_rms(x, w[p + "input_layernorm.weight"], eps), rope, mask)[0]
    y = h + mlp(_rms(h, w[p + "pre_mlp_layernorm.weight"], eps))
    return _rms(y, w[p + "final_layernorm.weight"], eps) @ w["lm_head.weight"].T


# ---- ERNIE-4.5 reference ----------------------------------------------------------------------------------------
def _ernie_reference(w, config, nxt, hidden, pos, final_norm: str | None = "model.norm.weight", dense: bool = True):
    """mtp_emb_norm/mtp_hidden_norm -> [embed, hidden] -> mtp_linear_proj -> GQA (interleaved RoPE) + dense MLP ->
    the trunk's model.norm (FastDeploy; None: vLLM/SGLang, no norm) -> head (tied to the embedding here)."""
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import (
        Ernie4_5_MoeAttention,
        Ernie4_5_MoeMLP,
        Ernie4_5_MoeRotaryEmbedding,
    )

    eps, p = config["rms_norm_eps"], "model.mtp_block.0."
    e = F.embedding(nxt, w["model.embed_tokens.weight"])
    x = torch.cat(
        [_rms(e, w["model.mtp_emb_norm.0.weight"], eps), _rms(hidden, w["model.mtp_hidden_norm.0.weight"], eps)], -1
    )
    x = x @ w["model.mtp_linear_proj.0.weight"].T
    cfg = Ernie4_5_MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    attn = _load(
        Ernie4_5_MoeAttention(cfg, 0), w, {f"{n}_proj.weight": f"{p}self_attn.{n}_proj.weight" for n in "qkvo"}
    )
    size = config["intermediate_size"] if dense else config["moe_intermediate_size"]
    mlp_names = {f"{n}_proj.weight": f"{p}mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    if not dense:  # a block read as MoE: only the first moe_intermediate_size rows of the dense weights would fit
        w = {**w, **{v: w[v][:size] if "down" not in v else w[v][:, :size] for v in mlp_names.values()}}
    mlp = _load(Ernie4_5_MoeMLP(cfg, size), w, mlp_names)
    rope = Ernie4_5_MoeRotaryEmbedding(cfg)(x, pos)
    h = x + attn(_rms(x, w[p + "input_layernorm.weight"], eps), rope, _mask(x.shape[1], None))[0]
    y = h + mlp(_rms(h, w[p + "post_attention_layernorm.weight"], eps))
    if final_norm:
        y = _rms(y, w[final_norm], eps)
    return y @ w["model.embed_tokens.weight"].T


# ---- convert / load, every layer --------------------------------------------------------------------------------
CASES = [("mimo_v2_flash", 0), ("mimo_v2_flash", 1), ("mimo_v2_flash", 2), ("ernie4_5_moe", 0)]


@pytest.mark.parametrize(("fixture", "layer"), CASES)
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_convert_every_layer(build, tmp_path: Path, capsys, fixture: str, layer: int, kind: str) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "convert",
            str(build(fixture, **eagle3_depth(fixture, kind))),
            "--out",
            str(out),
            "--to",
            kind,
            "--layer",
            str(layer),
            "--json",
        ]
    )
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["spec"] == fixture and summary["mtp_layer"] == layer
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["mtp_layer"] == layer and prov["draft_kind"] == kind
    assert bool(prov["dequantised_fp8"]) == (fixture == "mimo_v2_flash")
    draft = load_draft(out)
    assert isinstance(draft, NativeMtpDraft if kind == "mtp" else Eagle3Draft)
    if kind == "mtp":
        assert draft.layer == layer


@pytest.mark.parametrize(("fixture", "layer", "count"), [("mimo_v2_flash", 3, 3), ("ernie4_5_moe", 1, 1)])
def test_layer_past_the_last_fails_cleanly(build, tmp_path: Path, capsys, fixture: str, layer: int, count: int) -> None:
    code = main(["convert", str(build(fixture)), "--out", str(tmp_path / "o"), "--layer", str(layer)])
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(lines) == 1 and f"--layer {layer} is out of range" in lines[0] and f"{count} MTP layer(s)" in lines[0]
    assert not (tmp_path / "o").exists()


def test_mimo_v2_flash_has_three_layers_without_a_count_field(build) -> None:
    config = config_of(build("mimo_v2_flash"))
    assert "num_nextn_predict_layers" not in config  # as on the release
    spec = find_spec(config)
    assert spec.name == "mimo_v2_flash" and spec.num_mtp_layers(config) == 3
    assert spec.num_mtp_layers({**config, "num_nextn_predict_layers": 1}) == 1  # a config that says so wins


# ---- the keys a conversion selects ------------------------------------------------------------------------------
def _mimo_v2_keys(i: int) -> set[str]:
    p = f"model.mtp.layers.{i}."
    plain = ["enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight", "input_layernorm.weight"]
    plain += ["self_attn.attention_sink_bias", "pre_mlp_layernorm.weight"]
    fp8 = [f"self_attn.{n}_proj.weight" for n in "qkvo"] + [f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return {p + k for k in plain + fp8 + [f + "_scale_inv" for f in fp8]}


ERNIE_KEYS = {
    "model.mtp_emb_norm.0.weight",
    "model.mtp_hidden_norm.0.weight",
    "model.mtp_linear_proj.0.weight",
    "model.norm.weight",
    "model.mtp_block.0.input_layernorm.weight",
    "model.mtp_block.0.self_attn.q_proj.weight",
    "model.mtp_block.0.self_attn.k_proj.weight",
    "model.mtp_block.0.self_attn.v_proj.weight",
    "model.mtp_block.0.self_attn.o_proj.weight",
    "model.mtp_block.0.post_attention_layernorm.weight",
    "model.mtp_block.0.mlp.gate_proj.weight",
    "model.mtp_block.0.mlp.up_proj.weight",
    "model.mtp_block.0.mlp.down_proj.weight",
}


@pytest.mark.parametrize(("fixture", "layer"), CASES)
def test_selected_keys_are_exactly_the_mtp_layers(build, fixture: str, layer: int) -> None:
    ckpt = open_checkpoint(str(build(fixture)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), layer)
    selected = set(ckpt.needed_keys(plan.checkpoint_keys))
    want = _mimo_v2_keys(layer) if fixture == "mimo_v2_flash" else ERNIE_KEYS
    assert selected == want
    if fixture == "mimo_v2_flash":  # everything under the layer's prefix, nothing of the other layers
        assert selected == {k for k in ckpt.weight_map if k.startswith(f"model.mtp.layers.{layer}.")}
        module = {g.ckpt_keys[0]: g.module_key for g in plan.groups}
        p = f"model.mtp.layers.{layer}."
        assert module[p + "self_attn.attention_sink_bias"] == "block.self_attn.sinks"
        assert module[p + "pre_mlp_layernorm.weight"] == "block.post_attention_layernorm.weight"
    else:  # every MTP tensor of the index, plus the trunk's final norm
        assert selected - {"model.norm.weight"} == {k for k in ckpt.weight_map if k.startswith("model.mtp_")}


# ---- MiMo-V2-Flash against the reference row --------------------------------------------------------------------
@pytest.fixture(scope="module")
def mimo_v2(build):
    path = build("mimo_v2_flash")
    return path, config_of(path), _weights(path), [load_native(str(path), layer=i).eval() for i in range(3)]


def test_mimo_v2_flash_follows_the_reference_row(mimo_v2) -> None:
    path, config, w, drafts = mimo_v2
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        outs = [d(nxt, hidden, pos)[0] for d in drafts]
        refs = [_mimo_v2_reference(w, config, i, nxt, hidden, pos) for i in range(3)]
    for i in range(3):
        assert (outs[i] - refs[i]).abs().max().item() <= 1e-4, i


def test_mimo_v2_flash_each_layer_reads_its_own_weights(mimo_v2) -> None:
    path, config, w, drafts = mimo_v2
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        l0, l1 = drafts[0](nxt, hidden, pos)[0], drafts[1](nxt, hidden, pos)[0]
        ref1 = _mimo_v2_reference(w, config, 1, nxt, hidden, pos)
    assert (l1 - ref1).abs().max() <= 1e-4 and (l1 - l0).abs().max() > 1e-2


def test_mimo_v2_flash_attention_is_sliding_window(mimo_v2) -> None:
    path, config, w, drafts = mimo_v2
    assert config["sliding_window_size"] + 1 < T
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        mine = drafts[0](nxt, hidden, pos)[0]
        windowed = _mimo_v2_reference(w, config, 0, nxt, hidden, pos, window=True)
        full = _mimo_v2_reference(w, config, 0, nxt, hidden, pos, window=False)
    assert (mine - windowed).abs().max() <= 1e-4 and (mine - full).abs().max() > 1e-3


def test_mimo_v2_flash_dequantises_fp8_with_weight_scale_inv(mimo_v2) -> None:
    path, config, w, drafts = mimo_v2
    raw = _raw(path)
    q = "model.mtp.layers.0.self_attn.q_proj.weight"
    assert raw[q].dtype == torch.float8_e4m3fn and raw[q + "_scale_inv"].dtype == torch.float32
    assert raw["model.mtp.layers.0.eh_proj.weight"].dtype == torch.bfloat16  # eh_proj ships unquantised
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        mine = drafts[0](nxt, hidden, pos)[0]
        scales_ignored = _mimo_v2_reference(_weights(path, dequant=False), config, 0, nxt, hidden, pos)
    assert (mine - _mimo_v2_reference(w, config, 0, nxt, hidden, pos)).abs().max() <= 1e-4
    assert (mine - scales_ignored).abs().max() > 1e-2


def test_mimo_v2_flash_block_config_reads_the_release_fields_as_engines_do(mimo_v2) -> None:
    """transformers derives the SWA block from the full-attention fields; with the release's relations (kept by the
    fixture) that equals the engines' reading of the swa_* fields."""
    path, config, w, drafts = mimo_v2
    attn, cfg = drafts[0].block.self_attn, drafts[0].config
    assert attn.sliding_window == config["sliding_window_size"] + 1 and attn.sinks is not None
    assert attn.q_proj.out_features == config["swa_num_attention_heads"] * config["swa_head_dim"]
    assert attn.k_proj.out_features == config["swa_num_key_value_heads"] * config["swa_head_dim"]
    assert attn.v_proj.out_features == config["swa_num_key_value_heads"] * config["swa_v_head_dim"]
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == config["swa_rope_theta"]
    assert cfg.rms_norm_eps == config["layernorm_epsilon"] and cfg._attn_implementation == "eager"


def test_mimo_v2_flash_cached_steps_equal_one_pass(mimo_v2) -> None:
    """The default mask offsets queries by the cache length and keeps the window across cached steps."""
    path, config, w, drafts = mimo_v2
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        full = drafts[1](nxt, hidden, pos)[0]
        cache = DraftCache()
        steps = [drafts[1](nxt[:, :6], hidden[:, :6], pos[:, :6], cache=cache)[0]]
        for t in range(6, T):
            steps.append(drafts[1](nxt[:, t : t + 1], hidden[:, t : t + 1], pos[:, t : t + 1], cache=cache)[0])
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-4


def test_mimo_v2_flash_eagle3_layout(build, tmp_path: Path) -> None:
    path = build("mimo_v2_flash")
    convert(str(path), tmp_path / "e", to="eagle3", layer=2, dtype="float32")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    config = config_of(path)
    mtp_heads = cfg["mtp2draft_init"]["mtp_heads"]  # then the embedding pass-through heads (one kv head per q head)
    assert mtp_heads == 4 and cfg["num_key_value_heads"] == cfg["num_attention_heads"] and cfg["head_dim"] == 24
    assert cfg["rope_theta"] == pytest.approx(config["swa_rope_theta"] ** (24 / 8))  # SWA theta, partial RoPE remap
    w = load_file(str(tmp_path / "e" / "model.safetensors"))
    o = w["midlayer.self_attn.o_proj.weight"][:, : mtp_heads * 24].view(64, mtp_heads, 24)
    assert o[:, :, 16:].abs().max() == 0 and o[:, :, :16].abs().max() > 0  # v heads 16 -> 24, zero columns
    # the SWA block's doubled kv heads, repeated to one per q head: q heads 2i and 2i+1 share kv head i
    k = w["midlayer.self_attn.k_proj.weight"][: mtp_heads * 24].view(mtp_heads, 24, -1)
    assert torch.equal(k[0], k[1]) and not torch.equal(k[0], k[2])
    how = json.loads((tmp_path / "e" / "provenance.json").read_text())["tensors"]["midlayer.self_attn.q_proj.weight"]
    assert "attention-sink bias dropped" in how["how"] and "sliding window" in how["how"]


# ---- ERNIE-4.5 against the reference row ------------------------------------------------------------------------
def test_ernie_spec_records_the_final_norm_choice() -> None:
    spec = get_spec("ernie4_5_moe")
    assert spec.keys.final_norm == "model.norm.weight" and not spec.verified
    assert "FastDeploy" in spec.notes and "vLLM" in spec.notes and "SGLang" in spec.notes


def test_ernie_follows_the_reference_row(build) -> None:
    path = build("ernie4_5_moe")
    config, w = config_of(path), _weights(path)
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        mine = load_native(str(path)).eval()(nxt, hidden, pos)[0]
        right = _ernie_reference(w, config, nxt, hidden, pos)
        no_norm = _ernie_reference(w, config, nxt, hidden, pos, final_norm=None)  # vLLM / SGLang
    assert (mine - right).abs().max() <= 1e-4
    assert (mine - no_norm).abs().max() > 1e-2


def test_ernie_final_norm_is_the_trunks_model_norm(build, tmp_path: Path) -> None:
    src = build("ernie4_5_moe")
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    shard = path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
    tensors = load_file(str(shard))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * torch.linspace(0.5, 1.5, 64).to(torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    config, w = config_of(path), _weights(path)
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        before = load_native(str(src)).eval()(nxt, hidden, pos)[0]
        after = load_native(str(path)).eval()(nxt, hidden, pos)[0]
        right = _ernie_reference(w, config, nxt, hidden, pos)
    assert (after - before).abs().max() > 1e-2 and (after - right).abs().max() <= 1e-4


def test_ernie_mlp_is_dense(build) -> None:
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeMLP

    path = build("ernie4_5_moe")
    config, w = config_of(path), _weights(path)
    draft = load_native(str(path)).eval()
    assert type(draft.block.mlp) is Ernie4_5_MoeMLP and draft.block.mlp.intermediate_size == config["intermediate_size"]
    # dense even where the trunk's own layer 0 would be MoE
    spec = get_spec("ernie4_5_moe")
    assert type(NativeMtpDraft(spec, {**config, "moe_layer_start_index": 0}).block.mlp) is Ernie4_5_MoeMLP
    nxt, hidden, pos = _inputs()
    with torch.no_grad():
        mine = draft(nxt, hidden, pos)[0]
        narrow = _ernie_reference(w, config, nxt, hidden, pos, dense=False)
    assert (mine - _ernie_reference(w, config, nxt, hidden, pos)).abs().max() <= 1e-4
    assert (mine - narrow).abs().max() > 1e-2


def test_ernie_eagle3_attention_keeps_the_interleaved_rope(build, tmp_path: Path) -> None:
    """ERNIE rotates pairs (2i, 2i+1); the EAGLE-3 layer's Llama RoPE rotates (i, i + d/2). The hidden half of the
    EAGLE-3 q/k (the MTP q/k up to the absorbed scale c_h / c) must give ERNIE's attention scores."""
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeRotaryEmbedding
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import apply_rotary_pos_emb as ernie_rope
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope

    path = build("ernie4_5_moe", num_hidden_layers=4)
    convert(str(path), tmp_path / "e", to="eagle3", dtype="float32")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    w3, src, config = load_file(str(tmp_path / "e" / "model.safetensors")), _weights(path), config_of(path)
    scale = cfg["mtp2draft_init"]["c"] / cfg["mtp2draft_init"]["c_h"]
    p, d, heads, kv = "model.mtp_block.0.", 16, config["num_attention_heads"], config["num_key_value_heads"]
    d_in = src[p + "input_layernorm.weight"]
    u = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(T)[None]

    def heads_of(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(1, T, n, d).transpose(1, 2)

    def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.repeat_interleave(heads // kv, 1).transpose(-1, -2)

    q, k = (
        heads_of(u @ (src[p + "self_attn.q_proj.weight"] * d_in).T, heads),
        heads_of(u @ (src[p + "self_attn.k_proj.weight"] * d_in).T, kv),
    )
    ecfg = Ernie4_5_MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    want = scores(*ernie_rope(q, k, *Ernie4_5_MoeRotaryEmbedding(ecfg)(u, pos)))
    # the first `heads` heads are the MTP layer's (k/v repeated to one kv head per q head); pass-through heads follow
    assert cfg["mtp2draft_init"]["mtp_heads"] == heads
    q3 = heads_of(u @ (w3["midlayer.self_attn.q_proj.weight"][: heads * d, 64:] * scale).T, heads)
    k3 = heads_of(u @ (w3["midlayer.self_attn.k_proj.weight"][: heads * d, 64:] * scale).T, heads)
    kv = heads  # scores() repeats nothing now
    got = scores(*llama_rope(q3, k3, *load_draft(tmp_path / "e").rotary_emb(u, pos)))
    assert cfg["rope_theta"] == pytest.approx(config["rope_theta"])
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
