"""The memory plan: exact parameter counts of DeepSeek-V3's MTP layer from its real config, per-rank arithmetic,
subsets, the refusal, and the activation estimate against the bytes autograd really keeps on a small draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.fixtures import eagle3_depth

from mtp2draft.conversion import convert
from mtp2draft.draft.build import converted_config
from mtp2draft.draft.disk import load_draft
from mtp2draft.family.spec import get_spec
from mtp2draft.train.memory import check_fits, plan
from mtp2draft.train.settings import DistillConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ds3() -> dict:
    """The native draft config of DeepSeek-V3's MTP layer (examples/configs/deepseek-v3.json: the release's config)."""
    target = json.loads((ROOT / "examples" / "configs" / "deepseek-v3.json").read_text())
    return converted_config(get_spec("deepseek_v3"), target, 0)


def test_deepseek_v3_mtp_layer_counts(ds3: dict) -> None:
    h, e, i, v = 7168, 256, 2048, 129280
    experts = e * 3 * h * i  # fused gate_up [E, 2I, H] + down [E, H, I]
    attn = h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h
    rest = 2 * h * h + 3 * h * i + e * h + 5 * h  # eh_proj, shared expert, router, 5 norms
    p = plan(ds3, DistillConfig(batch_size=8, max_length=2048, ttt_steps=3), world=8, precision="bf16")
    assert p.parameters == experts + attn + rest  # 11.61e9
    assert p.bytes["parameters"] == 4 * p.parameters // 8 and p.bytes["optimizer"] == 8 * p.parameters // 8
    assert p.bytes["target_tensors"] == 2 * v * h * 2  # embedding + head, bf16, on every rank
    sub = plan(
        ds3,
        DistillConfig(batch_size=8, max_length=2048, ttt_steps=3),
        world=8,
        precision="bf16",
        subset="no-routed-experts",
    )
    assert sub.trainable == p.parameters - experts and sub.bytes["gradients"] == 4 * sub.trainable // 8
    assert sub.total < p.total / 2
    # one rank cannot hold it in fp32; more ranks shrink the sharded state
    one = plan(ds3, DistillConfig(batch_size=8, max_length=2048, ttt_steps=3), world=1, precision="fp32")
    assert one.bytes["parameters"] + one.bytes["gradients"] + one.bytes["optimizer"] == 16 * p.parameters
    assert check_fits(one, "cpu") is not None and "per rank" in check_fits(one, "cpu")


def test_plan_cli(ds3: dict, tmp_path: Path) -> None:
    from mtp2draft.cli.app import main

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(ds3))  # config alone: no weights needed
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["distill", str(tmp_path / "d"), "--out", str(tmp_path / "o"), "--plan", "--world-size", "8",
                     "--precision", "bf16", "--json"])  # fmt: skip
    assert code == 0
    plans = json.loads(buf.getvalue())
    assert [p["subset"] for p in plans][:2] == ["all", "no-routed-experts"]
    assert plans[0]["world_size"] == 8 and plans[1]["trainable_parameters"] < plans[0]["trainable_parameters"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("fixture", "kind"), [("mimo", "mtp"), ("mimo", "eagle3"), ("deepseek_v4", "mtp")])
def test_activation_estimate_tracks_what_autograd_keeps(build, tmp_path: Path, fixture: str, kind: str) -> None:
    """Saved-tensor bytes of one TTT forward on a small draft vs the plan's activation line (which also counts the
    target's features/logits the step reads): within a factor of 2. DeepSeek-V4's layer carries 4 residual streams
    (its hidden is [B, T, 4, H]), which the plan must count where a single-hidden layer keeps one vector."""
    from mtp2draft.target.hidden import Features
    from mtp2draft.train.ttt import ttt_forward

    convert(str(build(fixture, **eagle3_depth(fixture, kind))), tmp_path / "d", to=kind, dtype="float32")
    draft = load_draft(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    v, h = draft.vocab_size, draft.hidden_size
    draft.attach_target(torch.randn(v, h), torch.randn(v, h))
    b, t, k = 4, 64, 3
    ids = torch.randint(0, v, (b, t))
    aux = torch.randn(b, t, draft.fc.in_features) if kind == "eagle3" else None
    feats = Features(final=torch.randn(b, t, *draft.hidden_shape), aux=aux, logits=torch.randn(b, t, v))
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        storage = x.untyped_storage()  # counted once however many ops keep it
        seen[storage.data_ptr()] = storage.nbytes()
        return x

    params = {p.untyped_storage().data_ptr() for p in [*draft.parameters(), *draft.buffers()]}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        ttt_forward(draft, feats, ids, torch.ones(b, t, dtype=torch.bool), k, [1.0] * k)
    step0 = feats.step0_input(kind)
    measured = sum(n for ptr, n in seen.items() if ptr not in params) + feats.logits.nbytes + step0.nbytes
    estimate = plan(cfg, DistillConfig(batch_size=b, max_length=t, ttt_steps=k), precision="fp32").bytes["activations"]
    print(f"{fixture} {kind}: activation estimate {estimate} B, autograd keeps {measured} B")
    assert 0.5 <= estimate / measured <= 2.0, (estimate, measured)
