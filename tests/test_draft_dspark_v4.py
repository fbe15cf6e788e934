"""DeepSeek-V4's DSpark stages (`draft.dspark_v4`, `draft.dspark_v4_io`): the V4-0731-layout fixture converted by
`convert`, loaded with every tensor used once, computing what a plain-torch reference written from vLLM 0.32's V4
DSpark code computes (tests/support/reference_dspark_v4.py), saved back under the release's names; and a drafter
started from a V4 MTP layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import reference_dspark_v4 as ref
from support.references import tensors as fixture_tensors

from mtp2draft.cli.app import main
from mtp2draft.draft.dspark import dspark_loss, eval_mask
from mtp2draft.draft.dspark_disk import open_dspark
from mtp2draft.draft.dspark_v4 import pool_streams
from mtp2draft.draft.dspark_v4_init import init_dspark_v4_from_mtp
from mtp2draft.draft.dspark_v4_io import load_dspark_v4, release_tensors, save_dspark_v4
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields

FIXTURE = "deepseek_v4_0731_dspark"
# fields the fixture leaves to transformers' defaults, written out so the reference reads them as vLLM would
EXPLICIT = {"rope_theta": 10000.0, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus"}
S = 14  # context longer than the fixture's sliding window (8): the window cuts it


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path]:
    from support.fixtures import build_fixture

    root = tmp_path_factory.mktemp("dspark_v4")
    path = build_fixture(FIXTURE, root / "release", **EXPLICIT)
    assert main(["convert", str(path), "--out", str(root / "draft"), "--dtype", "float32"]) == 0
    return path, root / "draft"


@pytest.fixture(scope="module")
def setup(converted):
    """(draft, release-named fp32 tensors, config, embed, head, inputs)."""
    path, draft_dir = converted
    shared = fixture_tensors(path)
    embed, head = shared["embed.weight"], shared["head.weight"]
    draft = open_dspark(draft_dir, embed, head)  # the one entry every stage uses
    c = json.loads((draft_dir / "config.json").read_text())["target_config"]
    gen = torch.Generator().manual_seed(0)
    h, hc, n = c["hidden_size"], c["hc_mult"], len(c["dspark_target_layer_ids"])
    streams = [torch.randn(2, S, hc, h, generator=gen) for _ in range(n)]  # each target layer's output streams
    ids = torch.randint(0, c["vocab_size"] - 1, (2, S), generator=gen)
    anchors = torch.tensor([[1, 5, 11], [0, 9, 12]])  # 12 + 5 runs past the end: prev ids are clamped
    keep = torch.tensor([[True, True, True], [True, False, True]])
    return draft, load_file(draft_dir / "model.safetensors"), c, embed, head, (streams, ids, anchors, keep)


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| relative to the tensor's scale, 1 + max |want|: fp32 rounding grows with the values (the
    fixture's pre-norm hidden, which the confidence head reads, runs to 1e4)."""
    return ((got - want).abs().max() / (1 + want.abs().max())).item()


def _max_gap(draft, w, c, embed, head, inputs, variant=None) -> tuple[float, float, bool]:
    """Largest gap (`_gap`) between module and reference over the kept blocks' logits and confidences, and whether
    the greedy drafts of draft_block agree, the reference computing `variant`."""
    streams, ids, anchors, keep = inputs
    out = draft(ids, pool_streams(streams), anchors, keep)
    want = ref.forward(w, c, embed, head, ids, ref.pool(streams, variant), anchors, keep, variant)
    gap_logits = max(_gap(out.logits[b, j], lg) for (b, j), (lg, _) in want.items())
    gap_conf = max(_gap(out.confidence[b, j], cf) for (b, j), (_, cf) in want.items())
    tokens, conf = draft.draft_block(pool_streams(streams), ids[:, -1])
    want_tokens, want_conf = ref.draft_block(w, c, embed, head, ref.pool(streams, variant), ids[:, -1], variant)
    same = torch.equal(tokens, want_tokens) and _gap(conf, want_conf) < 1e-5
    return gap_logits, gap_conf, same


def test_forward_and_draft_block_compute_what_vllm_computes(setup) -> None:
    draft, w, c, embed, head, inputs = setup
    gap_logits, gap_conf, same = _max_gap(draft, w, c, embed, head, inputs)
    assert gap_logits < 1e-5 and gap_conf < 1e-5, (gap_logits, gap_conf)
    assert same


@pytest.mark.parametrize(
    "variant",
    ["stream0", "future_context", "no_window", "context_positions", "prev_off_by_one", "confidence_normed"],
)
def test_the_comparison_sees_each_planted_mistake(setup, variant: str) -> None:
    """The reference computing one mistake is far from the module on the same inputs: a module making it would
    fail the test above (checked by planting each in the module as well)."""
    draft, w, c, embed, head, inputs = setup
    gap_logits, gap_conf, _ = _max_gap(draft, w, c, embed, head, inputs, variant)
    assert max(gap_logits, gap_conf) > 1e-3, (gap_logits, gap_conf)


def test_converted_release_loads_every_tensor_exactly_and_saves_back(setup, tmp_path: Path) -> None:
    draft, w, *_ = setup
    state = draft.state_dict()
    assert sum(t.numel() for t in state.values()) == sum(t.numel() for t in w.values())
    back = release_tensors(draft)
    assert set(back) == set(w) and all(torch.equal(back[k], w[k]) for k in w)
    # the routed experts are fused in the module: expert 1's w3 is the second half of its gate_up rows
    fused = state["layers.2.mlp.experts.gate_up_proj"]
    assert torch.equal(fused[1, fused.shape[1] // 2 :], w["mtp.2.ffn.experts.1.w3.weight"])
    assert torch.equal(state["confidence_head.weight"], w["mtp.2.confidence_head.proj.weight"])
    out = save_dspark_v4(draft, tmp_path / "saved")
    saved = load_file(out / "model.safetensors")
    assert set(saved) == set(w) and all(torch.equal(saved[k], w[k]) for k in w)
    again = load_dspark_v4(out, draft.embed_weight, draft.head_weight)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in state.items())


def test_refuses_a_stray_or_missing_tensor_in_one_line(setup, converted, tmp_path: Path) -> None:
    draft, w, _, embed, head, _ = setup
    _, draft_dir = converted
    for name, tensors, match in (
        (
            "stray",
            {**w, "mtp.1.markov_head.markov_w1.weight": w["mtp.2.markov_head.markov_w1.weight"].clone()},
            "not use",
        ),
        ("missing", {k: v for k, v in w.items() if k != "mtp.1.attn.attn_sink"}, "lacks .*attn.sinks"),
        (
            "shape",
            {**w, "mtp.0.main_proj.weight": w["mtp.0.main_proj.weight"][:, :-1].contiguous()},
            "main_proj.weight: shape",
        ),
    ):
        bad = tmp_path / name
        bad.mkdir()
        (bad / "config.json").write_text((draft_dir / "config.json").read_text())
        save_file(tensors, bad / "model.safetensors")
        with pytest.raises(DraftError, match=match) as info:
            load_dspark_v4(bad, embed, head)
        assert "\n" not in str(info.value)


def test_training_reaches_every_stage_through_the_loss(setup) -> None:
    """The context keys carry gradient into each stage's kv_proj, and the loss of DSparkDraft applies as is."""
    draft, *_, (streams, ids, anchors, keep) = setup
    draft.zero_grad()
    out = draft(ids, pool_streams(streams), anchors, keep)
    labels_at = (anchors[..., None] + torch.arange(1, draft.block_size + 1)).clamp(max=ids.shape[1] - 1)
    labels = ids.gather(1, labels_at.flatten(1)).view_as(labels_at)
    mask = eval_mask(anchors, keep, torch.ones_like(ids), draft.block_size)
    dspark_loss(out, labels, mask).backward()
    for i in range(draft.num_stages):
        assert draft.layers[i].self_attn.kv_proj.weight.grad.abs().sum() > 0
    assert draft.main_proj.weight.grad.abs().sum() > 0
    draft.zero_grad()


# ---- a DSpark drafter for a target with a V4 MTP layer and none of its own -----------------------------------------
V4_BUNDLED = Path(__file__).resolve().parents[1] / "examples" / "targets" / "tiny-deepseek-v4"


@pytest.fixture(scope="module")
def bundled_mtp():
    from mtp2draft.draft.layout import load_native

    return load_native(str(V4_BUNDLED))


def _fields(block_size: int = 4) -> DSparkFields:
    return DSparkFields(
        block_size=block_size,
        target_layer_ids=(1, 2, 3),
        noise_token_id=4095,
        markov_rank=16,
        n_routed_experts=None,
        num_experts_per_tok=None,
        section="config.json",
    )


def test_the_mtp_initialised_stages_are_the_mtp_block(bundled_mtp, tmp_path: Path) -> None:
    mtp = bundled_mtp
    draft = init_dspark_v4_from_mtp(mtp, _fields(), num_stages=3, init="mtp", seed=1)
    block = mtp.block.state_dict()
    for layer in draft.layers:
        got = layer.state_dict()
        assert set(got) == set(block) and all(torch.equal(got[k], block[k].float()) for k in block)
    assert all(torch.equal(draft.hc_head.state_dict()[k], v) for k, v in mtp.hc_head.state_dict().items())
    assert torch.equal(draft.norm.weight, mtp.final_norm.weight)
    # the context starts as the MTP layer's h_proj(hnorm(.)) of the pooled target layers, renormalised
    h = mtp.h_proj.weight.shape[0]
    x = torch.randn(2, 5, 3, h)
    with torch.no_grad():
        context = draft.main_norm(draft.main_proj(x.flatten(-2)))
        mtp_read = mtp.h_proj(mtp.hnorm(x.mean(-2)))
    torch.testing.assert_close(
        context, mtp_read * torch.rsqrt(mtp_read.square().mean(-1, keepdim=True)), atol=1e-4, rtol=1e-4
    )
    # no Markov bias and acceptance 0.5 at the start, whatever the prev token
    assert not draft.markov_head.markov_w2.weight.any() and not draft.confidence_head.weight.any()
    assert draft.markov_head.markov_w1.weight.std() > 0
    tokens, confidence = draft.draft_block(torch.randn(2, 6, 3 * h), torch.tensor([5, 9]))
    assert tokens.shape == (2, 4) and not confidence.any()
    # it reads back from the directory it is saved to (the dspark_* fields written into its target config)
    again = load_dspark_v4(save_dspark_v4(draft, tmp_path / "d"), mtp.embed_weight, mtp.head_weight)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in draft.state_dict().items())


def test_random_init_is_seeded_and_not_the_mtp_block(bundled_mtp) -> None:
    one, same = (init_dspark_v4_from_mtp(bundled_mtp, _fields(), init="random", seed=3) for _ in range(2))
    other = init_dspark_v4_from_mtp(bundled_mtp, _fields(), init="random", seed=4)
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in one.state_dict().items())
    assert not torch.equal(one.layers[0].self_attn.kv_proj.weight, other.layers[0].self_attn.kv_proj.weight)
    mtp_kv = bundled_mtp.block.self_attn.kv_proj.weight.float()
    assert not torch.equal(one.layers[0].self_attn.kv_proj.weight, mtp_kv)
    assert torch.equal(one.layers[1].self_attn.sinks, torch.zeros_like(one.layers[1].self_attn.sinks))
    assert not one.markov_head.markov_w2.weight.any()
    with pytest.raises(DraftError, match="init must be one of mtp, random"):
        init_dspark_v4_from_mtp(bundled_mtp, _fields(), init="zeros")
