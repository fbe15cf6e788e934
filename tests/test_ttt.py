"""Training-time test math (mtp2draft/ttt.py): the unrolled computation equals the serving-time chain, the mask,
shift and teacher distributions against small hand computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mtp2draft.convert import convert
from mtp2draft.draft import load_draft
from mtp2draft.evaluate import draft_chain
from mtp2draft.hidden import Features
from mtp2draft.testing.fixtures import eagle3_depth
from mtp2draft.ttt import shift, teacher_logprobs, ttt_forward, ttt_mask


@pytest.mark.parametrize("fixture", ["deepseek_v3", "mimo", "glm4_moe"])
@pytest.mark.parametrize("kind", ["mtp", "mtp-pre-norm-handover", "eagle3"])
def test_ttt_step_equals_serving_chain(build, tmp_path: Path, fixture: str, kind: str) -> None:
    """TTT step s at origin p == the serving chain run from p for s + 1 steps with the data's tokens forced."""
    handover = "pre_norm" if kind.endswith("handover") else None
    kind = kind.split("-")[0]
    convert(str(build(fixture, **eagle3_depth(fixture, kind))), tmp_path / "d", to=kind, dtype="float32")
    draft = load_draft(tmp_path / "d").eval()
    if handover:  # as vLLM's DeepSeek MTP chains it
        draft.hidden_handover = handover
    v, h = draft.vocab_size, draft.hidden_size
    gen = torch.Generator().manual_seed(0)
    draft.attach_target(torch.randn(v, h, generator=gen), torch.randn(v, h, generator=gen) * 0.1)
    t, k = 12, 4
    ids = torch.randint(0, v, (1, t), generator=gen)
    width = draft.fc.in_features if kind == "eagle3" else h
    feats = Features(final=torch.randn(1, t, h, generator=gen), aux=torch.randn(1, t, width, generator=gen))
    with torch.no_grad():
        unrolled = ttt_forward(
            draft, feats, ids, torch.ones_like(ids, dtype=torch.bool), k, [1.0] * k, return_logits=True
        )
        for p in range(t - k - 1):
            chain = draft_chain(draft, feats.step0_input(kind), ids, p, k)
            for s in range(k):
                assert (unrolled[s][0, p] - chain[s]).abs().max() < 1e-4, (p, s)


def test_ttt_mask_is_causal_then_diagonal() -> None:
    m = ttt_mask(3, 2, torch.float32)[0, 0] == 0
    assert m[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert m[:, 3:6].tolist() == m[:, 6:9].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_ttt_mask_sliding_window_by_hand() -> None:
    """Step 1's query of origin p sits at p + 2, step-0 key j at j + 1: window 3 keeps j in {p - 1, p}."""
    m = ttt_mask(4, 1, torch.float32, window=3)[0, 0] == 0
    assert m[:, :4].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert m[:, 4:].tolist() == torch.eye(4, dtype=torch.bool).tolist()
    assert ttt_mask(2, 0, torch.float32)[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_shift_by_hand() -> None:
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift(x, 2, 9).tolist() == [[3, 4, 9, 9]] and shift(x, 0) is x


def test_teacher_logprobs_online_restricted_to_the_draft_vocabulary() -> None:
    logits = torch.tensor([[[0.0, 1.0, 5.0, 2.0], [3.0, 0.0, 0.0, 0.0]]])  # [1, 2, 4]
    logp, top1 = teacher_logprobs(Features(None, None, logits=logits), 0, torch.tensor([1, 3]), 4)
    z = math.log(math.exp(1) + math.exp(2))
    assert logp[0, 0].tolist() == pytest.approx([1 - z, 2 - z])
    assert top1.tolist() == [[2, 0]]  # over the FULL vocabulary: id 2 is outside the draft's
    logp, top1 = teacher_logprobs(Features(None, None, logits=logits), 1, None, 4)  # for the next position
    assert logp[0, 0].tolist() == pytest.approx(torch.log_softmax(logits[0, 1], -1).tolist())
    assert top1.tolist() == [[0, 0]]  # past the end: the shift fills 0 logits


def test_teacher_logprobs_offline_topk_renormalised_over_the_draft_vocabulary() -> None:
    """Top-3 of a 4-token target {3: .5, 0: .3, 1: .2}; the draft emits ids 1 and 3 only: p = (.2, .5) / .7."""
    feats = Features(
        None,
        None,
        topk_logprobs=torch.tensor([[[math.log(0.5), math.log(0.3), math.log(0.2)]] * 2]),
        topk_ids=torch.tensor([[[3, 0, 1]] * 2]),
    )
    logp, top1 = teacher_logprobs(feats, 1, torch.tensor([1, 3]), 4)  # offset 1: index 0 reads position 1
    assert logp[0, 0].exp().tolist() == pytest.approx([0.2 / 0.7, 0.5 / 0.7])
    assert logp[0, 1].tolist() == [-math.inf, -math.inf]  # past the end: no teacher, never NaN
    assert top1.tolist() == [[3, 0]]
    logp, _ = teacher_logprobs(feats, 0, None, 4)  # the target's vocabulary: id 2 was not kept
    assert logp[0, 0].exp().tolist() == pytest.approx([0.3, 0.2, 0.0, 0.5])


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([0, 2, 3, 5, 8, 9])])
def test_sparse_teacher_kl_equals_the_dense_one(draft_vocab) -> None:
    """The offline KL over the teacher's top-k ids: same values and gradient as the dense one, up to summation order."""
    from mtp2draft.ttt import step_kl

    gen = torch.Generator().manual_seed(0)
    v, k = 10, 4
    size = v if draft_vocab is None else draft_vocab.numel()
    ids = torch.stack([torch.randperm(v, generator=gen)[:k] for _ in range(2 * 5)]).view(2, 5, k)
    feats = Features(
        None, None, topk_logprobs=torch.randn(2, 5, k, generator=gen).log_softmax(-1).sort(-1, True).values,
        topk_ids=ids,
    )  # fmt: skip
    logits = torch.randn(2, 5, size, generator=gen, requires_grad=True)
    out = {}
    for sparse in (False, True):
        kl, has, top1 = step_kl(logits, feats, 1, draft_vocab, v, dense_offline=not sparse)
        (grad,) = torch.autograd.grad((kl * has).sum(), logits)
        out[sparse] = (kl[has], has, top1, grad)
    dense, sparse = out[False], out[True]
    assert torch.equal(dense[1], sparse[1]) and torch.equal(dense[2], sparse[2])
    assert not dense[1][:, -1].any() and dense[1][:, :-1].any()  # past the end: no teacher
    assert torch.allclose(dense[0], sparse[0], atol=1e-6) and torch.allclose(dense[3], sparse[3], atol=1e-6)
