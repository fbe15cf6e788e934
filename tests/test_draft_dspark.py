"""draft.dspark against a reference forward written here, block by block, from deepseek-ai/DeepSpec's definition
(deepspec/modeling/dspark/qwen3/modeling.py at 5905deb7611c, common.py at 3bc8dc7452b5): context = hidden_norm(fc(
targets)); per layer, keys / values = the layer's projections of [context[:anchor]; normed block]; the block sees
itself both ways; logits = head(norm(x)) + markov_w2(markov_w1(prev)). Tiny dimensions, fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from mtp2draft.draft.dspark import DSparkDraft, block_mask, dspark_loss, eval_mask
from mtp2draft.family.dspark import DSparkFields

H, V, BS, NOISE, RANK, TARGETS = 16, 40, 3, 39, 5, (0, 2)


def _fields(**over) -> DSparkFields:
    base = dict(
        block_size=BS, target_layer_ids=TARGETS, noise_token_id=NOISE, markov_rank=RANK,
        n_routed_experts=None, num_experts_per_tok=None, section="config.json",
    )  # fmt: skip
    return DSparkFields(**{**base, **over})


def _draft(seed: int = 0) -> DSparkDraft:
    config = Qwen3Config(
        hidden_size=H, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=V, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    torch.manual_seed(seed)
    draft = DSparkDraft(config, _fields())
    with torch.no_grad():  # norms away from 1, so a norm applied to the wrong tensor shows
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return draft.eval()


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rotate(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x [T, D] at positions pos [T]: the rotate-half RoPE, theta 10000."""
    d = x.shape[-1]
    angles = pos[:, None].float() / (10000.0 ** (torch.arange(0, d, 2).float() / d))[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _reference_block(p: dict, ids: torch.Tensor, targets: torch.Tensor, anchor: int) -> torch.Tensor:
    """One block anchored at `anchor` of one sequence: ids [S], targets [S, n*H] -> logits [BS, V]."""
    ctx = _rms(targets[:anchor] @ p["fc.weight"].T, p["hidden_norm.weight"])  # only the context before the anchor
    slots = torch.tensor([int(ids[anchor])] + [NOISE] * (BS - 1))
    x = p["embed_tokens.weight"][slots]
    pos_k = torch.cat([torch.arange(anchor), anchor + torch.arange(BS)])
    pos_q = anchor + torch.arange(BS)
    for i in range(2):
        L = {k[len(f"layers.{i}.") :]: v for k, v in p.items() if k.startswith(f"layers.{i}.")}
        xn = _rms(x, L["input_layernorm.weight"])
        keys_in = torch.cat([ctx, xn])
        out = torch.zeros(BS, 32)
        for head in range(4):
            kv = head // 2
            q = _rms(xn @ L["self_attn.q_proj.weight"][head * 8 : head * 8 + 8].T, L["self_attn.q_norm.weight"])
            k = _rms(keys_in @ L["self_attn.k_proj.weight"][kv * 8 : kv * 8 + 8].T, L["self_attn.k_norm.weight"])
            v = keys_in @ L["self_attn.v_proj.weight"][kv * 8 : kv * 8 + 8].T
            scores = _rotate(q, pos_q) @ _rotate(k, pos_k).T / 8**0.5  # every key: context < anchor, whole block
            out[:, head * 8 : head * 8 + 8] = scores.softmax(-1) @ v
        x = x + out @ L["self_attn.o_proj.weight"].T
        xn = _rms(x, L["post_attention_layernorm.weight"])
        gate, up = xn @ L["mlp.gate_proj.weight"].T, xn @ L["mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ L["mlp.down_proj.weight"].T
    x = _rms(x, p["norm.weight"])
    prev = ids[(anchor + torch.arange(BS)).clamp(max=len(ids) - 1)]
    markov = p["markov_head.markov_w1.weight"][prev] @ p["markov_head.markov_w2.weight"].T
    return x @ p["lm_head.weight"].T + markov


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, V - 1, (2, 9), generator=gen), torch.randn(2, 9, len(TARGETS) * H, generator=gen)


def test_forward_matches_the_reference_block_by_block() -> None:
    draft = _draft()
    ids, targets = _batch()
    anchors = torch.tensor([[2, 5], [0, 7]])  # anchor 0: no context at all; anchor 7: the last label is past S
    keep = torch.tensor([[True, True], [True, True]])
    with torch.no_grad():
        out = draft(ids, targets, anchors, keep)
        params = dict(draft.state_dict())
        for b in range(2):
            for j in range(2):
                want = _reference_block(params, ids[b], targets[b], int(anchors[b, j]))
                torch.testing.assert_close(out.logits[b, j], want, rtol=1e-4, atol=1e-4)


def test_a_block_sees_no_context_at_or_after_its_anchor_and_all_of_itself() -> None:
    draft = _draft()
    ids, targets = _batch()
    anchors, keep = torch.tensor([[3], [3]]), torch.ones(2, 1, dtype=torch.bool)
    with torch.no_grad():
        base = draft(ids, targets, anchors, keep).hidden
        later = targets.clone()
        later[:, 3:] += 5.0  # the anchor's own target state and everything after it
        torch.testing.assert_close(draft(ids, later, anchors, keep).hidden, base)
        earlier = targets.clone()
        earlier[:, 2] += 5.0
        assert not torch.allclose(draft(ids, earlier, anchors, keep).hidden, base)
    mask = block_mask(anchors, keep, 9, BS)[0]
    assert mask[:, 9:].all() and not mask[:, 3:9].any() and mask[:, :3].all()  # slot 0 sees slot 2: both ways


def test_blocks_do_not_see_each_other_and_dropped_blocks_see_nothing() -> None:
    mask = block_mask(torch.tensor([[4, 1]]), torch.tensor([[True, False]]), 6, 2)[0]
    assert mask[:2, :4].all() and not mask[:2, 4:6].any() and mask[:2, 6:8].all() and not mask[:2, 8:].any()
    assert not mask[2:].any()


def test_draft_block_chains_the_markov_head_greedily() -> None:
    draft = _draft()
    _, targets = _batch()
    last = torch.tensor([4, 11])
    tokens, confidence = draft.draft_block(targets, last)
    with torch.no_grad():  # the one-pass block logits without the Markov bias, through the training path
        ids = torch.cat([torch.zeros(2, 9, dtype=torch.long), last[:, None]], dim=1)
        padded = torch.cat([targets, torch.zeros(2, 1, targets.shape[-1])], dim=1)
        out = draft(ids, padded, torch.tensor([[9], [9]]), torch.ones(2, 1, dtype=torch.bool))
        base = draft.lm_head(out.hidden[:, 0])
        prev, want = last, []
        for k in range(BS):
            want.append((base[:, k] + draft.markov_head(prev)[0]).argmax(-1))
            prev = want[-1]
    assert torch.equal(tokens, torch.stack(want, 1))
    assert confidence.shape == (2, BS) and torch.isfinite(confidence).all()


def test_eval_mask_is_a_contiguous_prefix_inside_the_loss_mask() -> None:
    loss_mask = torch.tensor([[1, 1, 1, 0, 1, 1, 1, 1]])
    got = eval_mask(torch.tensor([[0, 4, 6]]), torch.tensor([[True, True, True]]), loss_mask, 3)
    # block at 0: labels 1, 2, 3 -> 3 is masked; at 4: 5, 6, 7 all in; at 6: 7 then 8 past the end
    assert got.tolist() == [[[True, True, False], [True, True, True], [True, False, False]]]


def test_loss_terms() -> None:
    draft = _draft()
    ids, targets = _batch()
    anchors, keep = torch.tensor([[1, 4], [2, 5]]), torch.ones(2, 2, dtype=torch.bool)
    out = draft(ids, targets, anchors, keep)
    labels = ids.gather(1, (anchors[..., None] + torch.arange(1, BS + 1)).clamp(max=8).flatten(1)).view(2, 2, BS)
    mask = eval_mask(anchors, keep, torch.ones_like(ids), BS)
    ce = torch.nn.functional.cross_entropy(out.logits[mask], labels[mask])
    torch.testing.assert_close(dspark_loss(out, labels, mask), ce, rtol=1e-5, atol=1e-5)
    # against itself, the draft's distribution differs by nothing and every slot is accepted
    same = dspark_loss(out, labels, mask, out.logits.detach(), weights=(0.0, 1.0, 0.0))
    assert float(same.detach()) == pytest.approx(0.0, abs=1e-6)
    conf = dspark_loss(out, labels, mask, out.logits.detach(), weights=(0.0, 0.0, 1.0))
    want = torch.nn.functional.binary_cross_entropy_with_logits(out.confidence[mask], torch.ones(int(mask.sum())))
    torch.testing.assert_close(conf, want, rtol=1e-5, atol=1e-5)
    # decay: the later slots weigh less, so with the loss on slot 0 only the decayed loss is larger
    decayed = dspark_loss(out, labels, mask, decay_gamma=0.5)
    assert not torch.allclose(decayed, ce)


def test_pooled_context_means_the_streams() -> None:
    from mtp2draft.draft.dspark import pooled_context

    flat = torch.randn(2, 5, 6)
    assert pooled_context(flat) is flat
    streams = torch.randn(2, 5, 4, 6)
    assert torch.allclose(pooled_context(streams), streams.mean(dim=2))
