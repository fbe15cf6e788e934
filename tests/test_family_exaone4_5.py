"""EXAONE 4.5 (`exaone4_5`): a vision-language checkpoint whose EXAONE-4 text decoder ships one MTP layer in
Qwen3-Next's glue layout (mtp.fc, mtp.pre_fc_norm_{embedding,hidden}, mtp.layers.{i}, mtp.norm) around a post-norm
decoder layer (QK-norm GQA, sliding window at index 0, dense MLP). One spec file and one fixture row. Only vLLM serves
it (SGLang 0.5.23 has no EXAONE-4.5 MTP class), and no engine captures its aux states, so `--to eagle3` is refused.

The key list: no stored copy of the release's index was found, so the fixture's MTP keys are checked against the
names vLLM 0.33's own Exaone4_5_MTP.load_weights loads (mapped as it maps them onto its module's parameters) and
Megatron-Bridge's Exaone45Bridge maps (tests/data/hub_keys/exaone4_5.json cites both); the spec says verified = false.

The reference: transformers 5.24 has no MTP model for EXAONE 4.5 (Exaone4Config has no num_mtp_layers), so the layer
is checked against the computation vLLM 0.33 runs (exaone4_5_mtp.py, Exaone4_5MultiTokenPredictor):
pre_fc_norm_embedding(embed) | pre_fc_norm_hidden(hidden) -> fc -> Exaone4DecoderLayer built at layer index 0 (a
sliding-window layer with RoPE, window w: keys q - w < k <= q, FlashAttention's (w - 1, 0)) -> mtp.norm -> the
target's lm_head, the normed hidden handed on. The block is transformers' Exaone4DecoderLayer loaded from the
checkpoint's tensors by their hub names, which equal its parameter names (no rename involved).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from checkpoint_files import config_of, rms, tensors, weight_map
from support import hub_keys
from support.fixtures import FIXTURES

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import OptionError
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "exaone4_5"
T = 10  # longer than the fixture's sliding window (4)

# vLLM's hf_to_vllm_mapper (exaone_moe_mtp.py): q/k/v stacked into qkv_proj, the dense MLP's gate/up into gate_up_proj
_VLLM_STACKED = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj",
                 ".mlp.gate_proj": ".mlp.gate_up_proj", ".mlp.up_proj": ".mlp.gate_up_proj"}  # fmt: skip


def _as_vllm_loads(key: str) -> str:
    """A checkpoint key as vLLM's Exaone4_5_MTP.load_weights maps it onto its module (mtp. -> model., stacking)."""
    key = "model." + key[len("mtp.") :]
    for old, new in _VLLM_STACKED.items():
        if old in key:
            return key.replace(old, new)
    return key


def test_fixture_keys_are_what_vllm_loads(build) -> None:
    """No stored copy of the release's index: checked against vLLM 0.33's loader and Megatron-Bridge's mapping."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    ours = sorted(k for k in weight_map(path) if k.startswith("mtp."))
    assert ours == release["mtp_keys"]  # the fixture's tiny layer has the release's names exactly (no expert indices)
    assert {_as_vllm_loads(k) for k in ours} == set(release["vllm_params"])  # every vLLM parameter, nothing else
    assert set(release["config"]["text_config"]) <= set(FIXTURES[FIXTURE]["config"]["text_config"])
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config_of(path))
    assert spec.name == FIXTURE and not spec.verified
    assert spec.num_mtp_layers(release["config"]) == 1  # absent there: vLLM's default
    # the trunk's layers carry the block's names (transformers' save_pretrained writes them)
    trunk = {k.split(".", 4)[4] for k in weight_map(path) if k.startswith("model.language_model.layers.0.")}
    assert trunk == {k[len("mtp.layers.0.") :] for k in ours if k.startswith("mtp.layers.0.")}


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    ckpt = open_checkpoint(str(build(FIXTURE)))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    assert set(plan.checkpoint_keys) == {k for k in ckpt.weight_map if k.startswith("mtp.")}
    assert plan.stored_embed is None and plan.stored_head is None
    module = load_native(ckpt, attach_target=False)
    assert type(module.block).__name__ == "Exaone4DecoderLayer" and module.block.self_attn.is_sliding
    assert module.attention_window == 4


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and not prov["spec_verified"] and prov["draft_kind"] == "mtp"
    with pytest.raises(OptionError, match="exaone4_5 has no EAGLE-3 conversion .* served by vllm: use --to mtp"):
        convert(str(build(FIXTURE)), tmp_path / "e3", to="eagle3")


def _reference(path: Path, nxt, hidden, pos, *, window: int | None = 4):
    """vLLM's EXAONE-4.5 MTP computation from the checkpoint's tensors by hub name: (logits, normed hidden)."""
    config, w = config_of(path), tensors(path)
    text = {k: v for k, v in config["text_config"].items() if k not in ("model_type", "architectures")}
    eps = text["rms_norm_eps"]
    cfg = transformers.Exaone4Config(**text)
    cfg._attn_implementation = "eager"
    block = transformers.models.exaone4.modeling_exaone4.Exaone4DecoderLayer(cfg, 0)
    block.load_state_dict({name: w["mtp.layers.0." + name] for name in block.state_dict()})
    rotary = transformers.models.exaone4.modeling_exaone4.Exaone4RotaryEmbedding(cfg)
    e = torch.nn.functional.embedding(nxt, w["model.language_model.embed_tokens.weight"])
    x = torch.cat(
        [rms(e, w["mtp.pre_fc_norm_embedding.weight"], eps), rms(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)],
        -1,
    )
    x = x @ w["mtp.fc.weight"].T
    q, k = torch.arange(x.shape[1])[:, None], torch.arange(x.shape[1])[None, :]
    allowed = (k <= q) & (k > q - window) if window else k <= q
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
    out = block(x, attention_mask=mask, position_embeddings=rotary(x, pos), position_ids=pos)
    normed = rms(out, w["mtp.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, normed


def test_layer_follows_vllms_computation(build) -> None:
    path = build(FIXTURE)
    ours = load_native(str(path)).eval()
    ours.train_for_engine("vllm")
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, T), generator=gen)
    hidden, pos = torch.randn(2, T, 64, generator=gen) * 3, torch.arange(T).expand(2, -1)
    with torch.no_grad():
        mine, handover = ours(nxt, hidden, pos)  # no mask given: the draft builds the sliding-window one
        right, normed = _reference(path, nxt, hidden, pos)
        unwindowed, _ = _reference(path, nxt, hidden, pos, window=None)
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - right).abs().max().item() <= 1e-4
    assert torch.allclose(handover, normed, atol=1e-5)  # vLLM hands on the mtp.norm output
    assert (mine - unwindowed).abs().max().item() > 1e-2  # the check can fail: the window is applied and matters
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    assert spec.engine_computation("vllm") == {"input_hidden": "post_norm", "final_norm": True,
                                               "hidden_handover": "post_norm"}  # fmt: skip
    assert spec.engine("sglang") is None  # SGLang 0.5.23 serves nothing for this target
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": False, "eagle3": False}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("vllm").version == "0.33.0"
    assert "exaone4_5_mtp.py" in spec.engine("vllm").sources and "exaone_moe_mtp.py" in spec.engine("vllm").notes


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "swa + dense" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] is None and layer["stored_head"] is None and layer["fp8_weights"] == 0
    assert {t["name"] for t in layer["tensors"]} == {k for k in weight_map(path) if k.startswith("mtp.")}
