"""draft.dspark_disk: a Qwen3-style DSpark drafter written as vLLM 0.32 reads a speculators dspark checkpoint, and
read back exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp2draft.draft import dspark_disk as disk
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields

V, H = 40, 16
TARGET = {"hidden_size": H, "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V, "max_position_embeddings": 128}  # fmt: skip
FIELDS = DSparkFields(block_size=3, target_layer_ids=(0, 2), noise_token_id=39, markov_rank=5, n_routed_experts=None,
                      num_experts_per_tok=None, section="config.json")  # fmt: skip


def _shared() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)


def _draft(seed: int = 0):
    embed, head = _shared()
    draft = disk.new_dspark_draft(TARGET, FIELDS, 2, embed, head, seed=seed)
    with torch.no_grad():  # non-zero heads, so a dropped or misnamed tensor shows
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()


def test_round_trip_is_exact_and_shares_the_target(tmp_path) -> None:
    draft = _draft()
    disk.save_dspark(draft, tmp_path, {"name_or_path": "t", "architectures": ["X"]})
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in stored)  # vLLM shares the target's
    assert {
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
        "fc.weight",
        "markov_head.markov_w2.weight",
    } <= set(stored)
    embed, head = _shared()
    back = disk.load_dspark(tmp_path, embed, head)
    for k, v in draft.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert not back.embed_tokens.weight.requires_grad and not back.lm_head.weight.requires_grad
    targets = torch.randn(1, 6, 2 * H)
    tokens, conf = draft.draft_block(targets, torch.tensor([3]))
    tokens2, conf2 = back.draft_block(targets, torch.tensor([3]))
    assert torch.equal(tokens, tokens2) and torch.allclose(conf, conf2)


def test_config_is_what_vllm_reads(tmp_path) -> None:
    """vLLM 0.32 update_dspark: target_layer_ids = aux ids - 1; the speculative config from speculators_config."""
    disk.save_dspark(_draft(), tmp_path, {"name_or_path": "t", "architectures": ["X"]})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert [i - 1 for i in cfg["aux_hidden_state_layer_ids"]] == list(FIELDS.target_layer_ids)
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == FIELDS.block_size
    assert cfg["sample_from_anchor"] is True and cfg["mask_token_id"] == FIELDS.noise_token_id
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    assert disk.fields_of(cfg) == FIELDS


def test_new_drafter_starts_with_no_markov_bias_and_even_confidence() -> None:
    embed, head = _shared()
    draft = disk.new_dspark_draft(TARGET, FIELDS, 1, embed, head)
    bias, _ = draft.markov_head(torch.tensor([1, 2]))
    assert torch.equal(bias, torch.zeros_like(bias))
    _, conf = draft.draft_block(torch.randn(1, 4, 2 * H), torch.tensor([1]))
    assert torch.equal(conf, torch.zeros_like(conf))


def test_refusals(tmp_path) -> None:
    disk.save_dspark(_draft(), tmp_path, {"name_or_path": "t", "architectures": ["X"]})
    embed, head = _shared()
    with pytest.raises(DraftError, match="does not fit"):
        disk.load_dspark(tmp_path, embed[:, :8], head)
    stored = load_file(str(tmp_path / "model.safetensors"))
    stored["layers.9.mlp.up_proj.weight"] = stored.pop("fc.weight")
    save_file(stored, str(tmp_path / "model.safetensors"))
    with pytest.raises(DraftError, match=r"missing \['fc.weight'\], unknown \['layers.9"):
        disk.load_dspark(tmp_path, embed, head)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sample_from_anchor": False}))
    with pytest.raises(DraftError, match="fill-in layout"):
        disk.load_dspark(tmp_path, embed, head)


def test_open_dspark_reads_either_layout(tmp_path) -> None:
    """A speculators dspark directory opens as the Qwen3-style drafter; anything else without draft_kind is refused
    (the release layout is covered by tests/test_draft_dspark_v4.py through the same entry)."""
    disk.save_dspark(_draft(), tmp_path, {"name_or_path": "t", "architectures": ["X"]})
    embed, head = _shared()
    assert isinstance(disk.open_dspark(tmp_path, embed, head), type(_draft()))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(DraftError, match="no DSpark drafter"):
        disk.open_dspark(tmp_path, embed, head)
