"""Training-time test math (mtp2draft/ttt.py): the unrolled computation equals the serving-time chain, the mask,
shift and teacher distributions against small hand computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.fixtures import eagle3_depth

from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.evaluation.decode import draft_chain
from mtp2draft.target.hidden import Features
from mtp2draft.train.ttt import shift, teacher_logprobs, ttt_forward, ttt_logits, ttt_mask


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
        unrolled = ttt_logits(draft, feats, ids, k)
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


def test_top_k_kl_by_hand_with_its_tail_bucket() -> None:
    """Top-2 of a 4-token target {3: .5, 0: .3} (the tail, ids 1 and 2, holds .2); the draft's probabilities are
    (.1, .2, .3, .4): KL = .5 log(.5/.4) + .3 log(.3/.1) + .2 log(.2/.5). With a draft vocabulary {1, 3}, id 0 drops
    out with its mass: p = (.5, .2) / .7 against q = (.4, tail .6) read from the draft's own 2 logits."""
    from mtp2draft.train.ttt import step_kl

    feats = Features(
        None, None, topk_logprobs=torch.tensor([[[math.log(0.5), math.log(0.3)]] * 2]), topk_ids=torch.tensor([[[3, 0]] * 2])
    )  # fmt: skip
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    kl, has, top1 = step_kl(q.log().expand(1, 2, 4), feats, 1, None, 4)  # offset 1: index 0 reads position 1
    by_hand = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.1) + 0.2 * math.log(0.2 / 0.5)
    assert kl[0, 0].item() == pytest.approx(by_hand, abs=1e-6)
    assert has.tolist() == [[True, False]] and kl[0, 1].item() == 0  # past the end: no teacher, never NaN
    assert top1.tolist() == [[3, 0]]
    q2 = torch.tensor([0.4, 0.6])  # the draft's distribution over its vocabulary [1, 3]
    kl, _, _ = step_kl(q2.log().expand(1, 2, 2), feats, 1, torch.tensor([1, 3]), 4)
    p3, pt = 0.5 / 0.7, 0.2 / 0.7
    assert kl[0, 0].item() == pytest.approx(p3 * math.log(p3 / 0.6) + pt * math.log(pt / 0.4), abs=1e-6)


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([0, 2, 3, 5, 8, 9])])
def test_top_k_kl_with_the_whole_vocabulary_is_the_online_kl(draft_vocab) -> None:
    """Offline files with k = the vocabulary hold the whole teacher: the KL and its gradient equal the online ones."""
    from mtp2draft.train.ttt import step_kl

    gen = torch.Generator().manual_seed(0)
    v = 10
    size = v if draft_vocab is None else draft_vocab.numel()
    target_logits = torch.randn(2, 5, v, generator=gen)
    values, ids = target_logits.log_softmax(-1).sort(-1, descending=True)
    online, offline = (
        Features(None, None, logits=target_logits),
        Features(None, None, topk_logprobs=values, topk_ids=ids),
    )
    logits = torch.randn(2, 5, size, generator=gen, requires_grad=True)
    out = []
    for feats in (online, offline):
        kl, has, top1 = step_kl(logits, feats, 1, draft_vocab, v)
        (grad,) = torch.autograd.grad((kl * has).sum(), logits)
        out.append((kl * has, has, top1, grad))
    (a, has_a, top_a, grad_a), (b, has_b, top_b, grad_b) = out
    assert has_a[:, :-1].all() and not has_b[:, -1].any() and torch.equal(has_a[:, :-1], has_b[:, :-1])
    assert torch.equal(top_a[:, :-1], top_b[:, :-1])
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-5) and torch.allclose(grad_a[:, :-1], grad_b[:, :-1], atol=1e-6)


def test_teacher_temperature_sharpens_the_online_teacher_and_refuses_a_top_k_one() -> None:
    """T = 1 is the plain KL; T = 0.5 is the KL to p^2 / sum p^2 (by hand); a small T is cross-entropy on the
    target's top token up to a vanishing entropy; a top-k teacher cannot be sharpened (no tail) and says so."""
    from mtp2draft.errors import OptionError
    from mtp2draft.train.ttt import step_kl

    target = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]])  # index 0 reads position 1
    feats = Features(None, None, logits=target)
    draft = torch.tensor([[[0.3, -0.2, 0.1]] * 3])
    logq = torch.log_softmax(draft[0, 0], -1)
    plain, _, _ = step_kl(draft, feats, 1, None, 3)
    same, _, top1 = step_kl(draft, feats, 1, None, 3, temperature=1.0)
    assert torch.equal(plain, same) and top1[0, 0].item() == 1  # position 1's top token
    p = torch.softmax(target[0, 1], -1) ** 2
    p = p / p.sum()
    half, _, _ = step_kl(draft, feats, 1, None, 3, temperature=0.5)
    assert half[0, 0].item() == pytest.approx(float((p * (p.log() - logq)).sum()), abs=1e-6)
    cold, _, _ = step_kl(draft, feats, 1, None, 3, temperature=0.01)
    assert cold[0, 0].item() == pytest.approx(-logq[1].item(), abs=1e-4)
    assert half[0, 0].item() != pytest.approx(plain[0, 0].item(), abs=1e-3)
    offline = Features(None, None, topk_logprobs=torch.zeros(1, 3, 1), topk_ids=torch.zeros(1, 3, 1, dtype=torch.long))
    with pytest.raises(OptionError, match="needs the online target"):
        step_kl(draft, offline, 1, None, 3, temperature=0.5)


def _kl_by_hand(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> float:
    """KL(softmax(target) || softmax(draft)) of two [V] logit vectors, in float64, from the definition."""
    p = torch.softmax(target_logits.double(), -1)
    return float((p * (p.log() - torch.log_softmax(draft_logits.double(), -1))).sum())


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_ttt_loss_by_hand_from_per_step_logits_and_a_masked_prompt(build, tmp_path: Path, kind: str) -> None:
    """The TTT loss, its per-step counts and top-1 agreement, recomputed from the definition on the step logits.

    Step s at origin p predicts token x[p + s + 2]; the teacher is the target's distribution for that token, i.e.
    the target's logits at position p + s + 1; the pair counts only where p + s + 2 < T and the loss mask holds at
    p + s + 2. The mask here is not a suffix (a masked prompt, a masked token inside the answer), so a mask or a
    teacher read one position off changes the counts and the losses. Loss = sum_s w_s * mean over counted p."""
    convert(str(build("mimo", **eagle3_depth("mimo", kind))), tmp_path / "d", to=kind, dtype="float32")
    draft = load_draft(tmp_path / "d").eval()
    v, h = draft.vocab_size, draft.hidden_size
    gen = torch.Generator().manual_seed(1)
    draft.attach_target(torch.randn(v, h, generator=gen), torch.randn(v, h, generator=gen) * 0.1)
    t, k, weights = 11, 3, [1.0, 0.5, 0.25]
    ids = torch.randint(0, v, (1, t), generator=gen)
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)
    width = draft.fc.in_features if kind == "eagle3" else h
    target_logits = torch.randn(1, t, v, generator=gen) * 3
    feats = Features(torch.randn(1, t, h, generator=gen), torch.randn(1, t, width, generator=gen), target_logits)
    vocab_ids = None
    if kind == "eagle3":
        from mtp2draft.train.ttt import draft_target_ids

        vocab_ids = draft_target_ids(draft)
    with torch.no_grad():
        step_logits = ttt_logits(draft, feats, ids, k)
        stats = ttt_forward(draft, feats, ids, mask, k, weights, vocab_ids)
    total = 0.0
    for s in range(k):
        kls, correct = [], 0
        for p in range(t):
            predicted = p + s + 2
            if predicted >= t or not mask[0, predicted]:
                continue
            teacher = target_logits[0, predicted - 1]  # the target's logits for token x[predicted]
            mine = step_logits[s][0, p]
            restricted = teacher if vocab_ids is None else teacher[vocab_ids]
            kls.append(_kl_by_hand(restricted, mine))
            guess = int(mine.argmax()) if vocab_ids is None else int(vocab_ids[mine.argmax()])
            correct += guess == int(teacher.argmax())
        assert stats.per_step_count[s] == len(kls), s
        assert stats.per_step_loss[s] == pytest.approx(sum(kls) / len(kls), rel=1e-5), s
        assert stats.per_step_correct[s] == correct, s
        total += weights[s] * sum(kls) / len(kls)
    assert stats.per_step_count == [6, 6, 5]  # mask holds at 3, 4, 6, 7, 8, 10; step s predicts s + 2 .. 10
    assert float(stats.loss) == pytest.approx(total, rel=1e-5)
