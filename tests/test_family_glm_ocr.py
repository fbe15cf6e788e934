"""GLM-OCR (`glm_ocr`): a vision-language checkpoint whose text decoder ships one MTP layer: GQA with sandwich norms
(post_self_attn_layernorm, post_mlp_layernorm) + a dense MLP with fused gate_up_proj, config under text_config.
One spec file and one fixture row; no engine captures its aux states, so its spec names no EAGLE-3 transforms and
`convert --to eagle3` refuses in one line. Checked: the fixture's MTP keys against the release's key list
(committed test data, its stored sources cited there), the keys a conversion reads, the native conversion, the
layer against a reference under each engine's computation, the refusal, the `inspect --json` row and the engine rows.

The reference: transformers 5.24 has no MTP model for glm_ocr (GlmOcrTextConfig has no num_mtp_layers), so the layer
is checked against the computation vLLM 0.33 runs (vllm/model_executor/models/glm_ocr_mtp.py,
GlmOcrMultiTokenPredictorLayer): RMSNorm(embed) | RMSNorm(hidden) -> eh_proj -> the decoder block -> residual +
output, handed on as it is (pre-norm); shared_head.norm -> lm_head for the logits. SGLang 0.5.23 hands on the normed
hidden instead. The block is transformers' own GlmOcrTextDecoderLayer loaded by transformers' own loader (a
GlmOcrForConditionalGeneration one text layer deeper reads the MTP layer's block tensors under their hub names).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from checkpoint_files import config_of, rms, tensors, weight_map
from support import hub_keys
from support.fixtures import FIXTURES, build_fixture, eagle3_depth

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, plan_mtp_layer
from mtp2draft.draft.layout import load_native
from mtp2draft.errors import OptionError
from mtp2draft.family.spec import find_spec, get_spec

FIXTURE = "glm_ocr"
MTP = "model.language_model.layers.2."


def test_fixture_has_the_release_mtp_keys(build) -> None:
    """Diffed against the release's key list (tests/data/hub_keys/glm_ocr.json), the layer index abstracted."""
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    config = config_of(path)
    n, rn = config["text_config"]["num_hidden_layers"], release["config"]["text_config"]["num_hidden_layers"]
    ours = [k for k in weight_map(path) if k.startswith(f"model.language_model.layers.{n}.")]
    theirs = release["mtp_keys"]
    assert len(theirs) == release["mtp_tensor_count"] == 16
    prefix = "model.language_model.layers.{}."
    assert hub_keys.patterns(ours, prefix.format(n)) == hub_keys.patterns(theirs, prefix.format(rn))
    assert set(release["config"]["text_config"]) <= set(FIXTURES[FIXTURE]["config"]["text_config"])
    assert set(release["config"]) <= set(FIXTURES[FIXTURE]["config"])
    spec = find_spec(config)
    assert spec.name == FIXTURE and spec.num_mtp_layers(release["config"]) == 1
    assert spec.key(spec.keys.block, release["config"], 0) == "model.language_model.layers.16."


def test_plan_reads_exactly_the_mtp_layer(build) -> None:
    path = build(FIXTURE)
    ckpt = open_checkpoint(str(path))
    plan = plan_mtp_layer(ckpt, find_spec(ckpt.config), 0)
    layer = {k for k in ckpt.weight_map if k.startswith(MTP)}
    stored = {MTP + "embed_tokens.weight", MTP + "shared_head.head.weight"}
    assert stored <= layer and set(plan.checkpoint_keys) == layer - stored
    assert plan.stored_embed == MTP + "embed_tokens.weight" and plan.stored_head == MTP + "shared_head.head.weight"
    module = load_native(ckpt, attach_target=False)
    assert type(module.block).__name__ == "GlmOcrTextDecoderLayer"
    assert module.block.self_attn.head_dim == 24 != 64 // 4  # the config's head_dim, not hidden / heads


def test_convert_native_and_refuse_eagle3(build, tmp_path: Path) -> None:
    result = convert(str(build(FIXTURE)), tmp_path / "out", to="mtp")
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert result.spec == prov["spec"] == FIXTURE and prov["spec_verified"] and prov["draft_kind"] == "mtp"
    deep = build_fixture(FIXTURE, tmp_path / "deep", **eagle3_depth(FIXTURE))  # deep enough for EAGLE-3's aux ids
    with pytest.raises(OptionError, match="glm_ocr has no EAGLE-3 conversion .* use --to mtp"):
        convert(str(deep), tmp_path / "e3", to="eagle3")
    assert not (tmp_path / "e3").exists()


def _reference(path: Path, nxt, hidden, pos, *, block_layer: int = 2):
    """vLLM's GLM-OCR MTP computation, the block from transformers' own loader: (logits, pre-norm hidden vLLM hands
    on, normed hidden SGLang hands on)."""
    config, w = config_of(path), tensors(path)
    eps = config["text_config"]["rms_norm_eps"]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    fields["text_config"] = {**config["text_config"], "num_hidden_layers": 3}
    cfg = transformers.GlmOcrConfig(**fields)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    deeper = transformers.GlmOcrForConditionalGeneration.from_pretrained(str(path), config=cfg, dtype=torch.float32)
    text = deeper.eval().model.language_model
    assert torch.equal(text.layers[2].mlp.gate_up_proj.weight, w[MTP + "mlp.gate_up_proj.weight"])
    e = torch.nn.functional.embedding(nxt, w["model.language_model.embed_tokens.weight"])
    x = torch.cat([rms(e, w[MTP + "enorm.weight"], eps), rms(hidden, w[MTP + "hnorm.weight"], eps)], -1)
    x = x @ w[MTP + "eh_proj.weight"].T
    t = x.shape[1]
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = text.layers[block_layer](x, attention_mask=mask, position_embeddings=text.rotary_emb(x, pos))
    normed = rms(out, w[MTP + "shared_head.norm.weight"], eps)
    return normed @ w["lm_head.weight"].T, out, normed


def test_layer_follows_each_engines_computation(build) -> None:
    path = build(FIXTURE)
    gen = torch.Generator().manual_seed(0)
    nxt = torch.randint(0, 256, (2, 10), generator=gen)
    hidden, pos = torch.randn(2, 10, 64, generator=gen) * 3, torch.arange(10).expand(2, -1)
    for engine, want in (("vllm", "pre"), ("sglang", "post")):
        ours = load_native(str(path)).eval()
        ours.train_for_engine(engine)
        with torch.no_grad():
            mine, handover = ours(nxt, hidden, pos)
            right, pre, post = _reference(path, nxt, hidden, pos)
        assert (mine - right).abs().max().item() <= 1e-4, engine
        assert torch.allclose(handover, pre if want == "pre" else post, atol=1e-5), engine
    with torch.no_grad():
        trunk_block, _, _ = _reference(path, nxt, hidden, pos, block_layer=1)
        mine_reversed, _ = ours(nxt, hidden.flip(-1), pos)
    assert (mine - trunk_block).abs().max().item() > 1e-2  # the check can fail: the block's own weights matter
    assert (mine_reversed - right).abs().max().item() > 1e-2  # and so does the hidden


def test_engine_rows() -> None:
    spec = get_spec(FIXTURE)
    assert spec.engine_computation("vllm") == {"input_hidden": "post_norm", "final_norm": True,
                                               "hidden_handover": "pre_norm"}  # fmt: skip
    assert spec.engine_computation("sglang")["hidden_handover"] == "post_norm"
    assert spec.support_table() == {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}}
    assert spec.engine("vllm").step_layers == "cycle" and spec.engine("sglang").step_layers == "first"
    assert "glm_ocr_mtp.py" in spec.engine("vllm").sources and "glm_ocr_nextn.py" in spec.engine("sglang").sources
    assert spec.eagle3.transforms == ()


def test_inspect_json_row(build, capsys) -> None:
    path = build(FIXTURE)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"] == FIXTURE and info["block"] == "gqa + dense" and info["num_mtp_layers"] == 1
    layer = info["layers"][0]
    assert layer["stored_embed"] == MTP + "embed_tokens.weight" and layer["fp8_weights"] == 0
    assert layer["stored_head"] == MTP + "shared_head.head.weight"
    assert {t["name"] for t in layer["tensors"]} == set(
        plan_mtp_layer(open_checkpoint(str(path)), get_spec(FIXTURE), 0).checkpoint_keys
    )
