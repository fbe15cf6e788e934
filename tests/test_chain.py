"""Chain drafts (mtp2draft/draft/chain.py): every MTP layer of a checkpoint, layer i at step i.

The unrolled training computation equals the decoding-time chain (per-layer caches of the forced chain) under both
step rules and past the layer count; one layer (or the `first` rule) is exactly the single-layer draft; decoding is
lossless; the directory format round-trips and version-1 drafts still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtp2draft.conversion import convert
from mtp2draft.draft.chain import MtpChainDraft, first_steps, layer_at
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.errors import DraftError, OptionError
from mtp2draft.evaluation.decode import (
    TargetRunner,
    draft_chain,
    greedy_reference,
    speculative_decode,
)
from mtp2draft.target.hidden import Features, TargetModel
from mtp2draft.train.ttt import ttt_logits, ttt_mask


@pytest.fixture
def chain_dir(build, tmp_path: Path) -> tuple[Path, Path]:
    """A tiny MiMo checkpoint with three MTP layers (distinct weights) and its chain draft."""
    src = build("mimo", num_nextn_predict_layers=3)
    convert(str(src), tmp_path / "chain", all_layers=True, dtype="float32")
    return src, tmp_path / "chain"


def test_rules_by_hand() -> None:
    assert [layer_at(s, 3, "cycle") for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [layer_at(s, 3, "first") for s in range(4)] == [0, 0, 0, 0]
    assert first_steps(3, "cycle", 6) == [0, 1, 2] and first_steps(3, "cycle", 2) == [0, 1]
    assert first_steps(3, "first", 6) == [0]
    with pytest.raises(DraftError, match="step_layers must be one of"):
        layer_at(0, 3, "random")


def test_chain_mask_by_hand() -> None:
    """Step 2 of a layer first run at step 2 (cycle, n = 3): origin p sees origins p' <= p - 2 and itself."""
    m = ttt_mask(4, 2, torch.float32, blocks=[2])[0, 0] == 0
    assert m.int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    # step 3 runs layer 0 again (cycle, n = 3): its forced block is causal, then step 3's own diagonal
    m = ttt_mask(3, 3, torch.float32, blocks=[0, 3])[0, 0] == 0
    assert m[:, :3].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert m[:, 3:].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert torch.equal(ttt_mask(5, 2, torch.float32), ttt_mask(5, 2, torch.float32, blocks=[0, 1, 2]))


def test_convert_all_layers_writes_every_layer_exactly(chain_dir) -> None:
    from safetensors import safe_open

    from mtp2draft.draft.layout import load_native

    src, out = chain_dir
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["format_version"] == 2 and cfg["num_layers"] == 3 and cfg["mtp_layers"] == [0, 1, 2]
    assert cfg["step_layers"] == "cycle"
    draft = load_draft(out)
    assert isinstance(draft, MtpChainDraft) and draft.num_layers == 3
    for j in range(3):
        native = load_native(str(src), layer=j, attach_target=False)
        for k, v in native.state_dict().items():
            assert torch.equal(draft.layers[j].state_dict()[k], v), (j, k)
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert {k.split(".")[1] for k in fh.keys()} == {"0", "1", "2"}  # noqa: SIM118
    # the layers differ (the fixture writes each its own weights), so the chain is not layer 0 three times
    assert not torch.equal(draft.layers[0].eh_proj.weight, draft.layers[1].eh_proj.weight)
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["mtp_layers"] == [0, 1, 2] and "layers.2.eh_proj.weight" in prov["tensors"]


def test_convert_all_layers_refusals(build, tmp_path: Path) -> None:
    src = build("mimo", num_nextn_predict_layers=3)
    with pytest.raises(OptionError, match="exclude each other"):
        convert(str(src), tmp_path / "a", all_layers=True, layer=1)
    with pytest.raises(OptionError, match="native chain draft"):
        convert(str(src), tmp_path / "b", all_layers=True, to="eagle3")


def _attached(path: Path, rule: str, handover: str | None = None) -> MtpChainDraft:
    draft = load_draft(path).eval()
    draft.step_layers = rule
    if handover:
        draft.hidden_handover = handover
    v, h = draft.vocab_size, draft.hidden_size
    gen = torch.Generator().manual_seed(0)
    return draft.attach_target(torch.randn(v, h, generator=gen), torch.randn(v, h, generator=gen) * 0.1)


def test_a_chain_step_is_its_layers_own_call(chain_dir) -> None:
    """Step s calls layer `layer_at(s)` as a module, so the layer's hooks run (FSDP2 unshards its parameters in
    one)."""
    draft = _attached(chain_dir[1], "cycle")
    called: list[int] = []
    for i, layer in enumerate(draft.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: called.append(i))
    ids, hidden = torch.zeros(1, 2, dtype=torch.long), torch.randn(1, 2, draft.hidden_size)
    with torch.no_grad():
        for s in range(4):
            draft(ids, hidden, torch.arange(1, 3)[None], step=s)
    assert called == [0, 1, 2, 0]


@pytest.mark.parametrize("rule", ["cycle", "first"])
@pytest.mark.parametrize("handover", [None, "pre_norm"])
def test_ttt_equals_decoding_time_chain_past_the_layer_count(chain_dir, rule: str, handover: str | None) -> None:
    """TTT step s at origin p == the forced chain from p (per-layer caches), k = 5 > 3 layers."""
    draft = _attached(chain_dir[1], rule, handover)
    v, h = draft.vocab_size, draft.hidden_size
    gen = torch.Generator().manual_seed(1)
    t, k = 12, 5
    ids = torch.randint(0, v, (1, t), generator=gen)
    feats = Features(final=torch.randn(1, t, h, generator=gen), aux=None)
    with torch.no_grad():
        unrolled = ttt_logits(draft, feats, ids, k)
        for p in range(t - k - 1):
            chain = draft_chain(draft, feats.step0_input(draft.kind), ids, p, k)
            for s in range(k):
                assert (unrolled[s][0, p] - chain[s]).abs().max() < 1e-4, (p, s)
        # the layers matter under cycle: step 1 differs from what layer 0 alone computes
        single = ttt_logits(draft.layers[0], feats, ids, k)
    differs = (unrolled[1] - single[1]).abs().max() > 1e-3
    assert differs if rule == "cycle" else not differs


def _runner(src: Path) -> TargetRunner:
    return TargetRunner(TargetModel(str(src)))


@pytest.mark.parametrize("rule", ["cycle", "first"])
def test_chain_decoding_is_lossless_and_first_rule_is_layer_zero(chain_dir, rule: str) -> None:
    src, out = chain_dir
    runner = _runner(src)
    draft = load_draft(out).eval()
    draft.step_layers = rule
    draft.attach_target(runner.target.embedding(), runner.target.lm_head())
    prompt = list(range(3, 14))
    ref = greedy_reference(runner, prompt, 24, None)
    got, accepted = speculative_decode(runner, draft, prompt, 5, 24, None)
    assert got == ref and sum(a + 1 for a in accepted) >= len(ref) - 1
    if rule == "first":  # the chain path with one layer in use == the single-layer path, forward by forward
        single = draft.layers[0]
        got1, accepted1 = speculative_decode(runner, single, prompt, 5, 24, None)
        assert got1 == got and accepted1 == accepted


def test_one_layer_chain_equals_the_single_layer_draft(build, tmp_path: Path) -> None:
    """A one-layer chain through the chain path accepts exactly what the single-layer path accepts."""
    src = build("mimo")
    convert(str(src), tmp_path / "one", all_layers=True, dtype="float32")
    convert(str(src), tmp_path / "v1", dtype="float32")
    runner = _runner(src)
    chain, single = load_draft(tmp_path / "one").eval(), load_draft(tmp_path / "v1").eval()
    assert isinstance(chain, MtpChainDraft) and isinstance(single, NativeMtpDraft)  # version 1 still loads as before
    for d in (chain, single):
        d.attach_target(runner.target.embedding(), runner.target.lm_head())
    prompt = list(range(5, 19))
    a = speculative_decode(runner, chain, prompt, 4, 20, None)
    b = speculative_decode(runner, single, prompt, 4, 20, None)
    assert a == b


def test_chain_config_checks(chain_dir, tmp_path: Path) -> None:
    from mtp2draft.draft.config import parse_draft_config

    cfg = json.loads((chain_dir[1] / "config.json").read_text())
    parse_draft_config(cfg)
    for change, message in (
        ({"num_layers": 2}, "mtp_layers lists 3"),
        ({"mtp_layers": [0, 1, 5]}, "names a layer the target lacks"),
        ({"mtp_layers": [0, 0]}, "distinct MTP layer indices"),
        ({"step_layers": "last"}, "step_layers"),
        ({"format_version": 1}, "need format_version 2"),
        ({"format_version": 3}, "format_version"),
    ):
        with pytest.raises(DraftError, match=message):
            parse_draft_config({**cfg, **change})
    bad = {k: v for k, v in cfg.items() if k != "mtp_layers"}
    with pytest.raises(DraftError, match="needs mtp_layers"):
        parse_draft_config(bad)


def test_stitched_writes_every_layer_back_and_single_layer_formats_refuse(chain_dir, tmp_path: Path) -> None:
    """The chain's layers go back under model.mtp_layers.{i} exactly (fp32 fixture); nextn and speculators-mtp hold
    one layer and say so in one line; validate checks every layer of the draft directory."""
    from safetensors.torch import load_file

    from mtp2draft.formats.export import export, validate

    src, out = chain_dir
    draft = load_draft(out)
    with torch.no_grad():  # a "distilled" chain: every layer changed
        for j, m in enumerate(draft.layers):
            m.eh_proj.weight.add_(0.01 * (j + 1))
    from mtp2draft.outputs.writer import save_tensors

    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("config.json", "provenance.json"):
        (moved / name).write_bytes((out / name).read_bytes())
    save_tensors(moved / "model.safetensors", {k: v.contiguous() for k, v in draft.state_dict().items()})
    assert validate(moved) == []
    export(moved, "stitched", tmp_path / "st", target=str(src))
    assert validate(tmp_path / "st") == []
    stored = {}
    for f in (tmp_path / "st").glob("*.safetensors"):
        stored |= load_file(str(f))
    for j in range(3):
        key = f"model.mtp_layers.{j}.input_proj.weight"
        assert torch.equal(stored[key].float(), draft.layers[j].eh_proj.weight.to(stored[key].dtype).float()), j
    for fmt in ("nextn", "speculators-mtp"):
        with pytest.raises(DraftError, match="holds one MTP layer"):
            export(moved, fmt, tmp_path / fmt, target=str(src))


def test_card_of_a_stitched_chain_drafts_every_layer_and_names_the_rules(build, tmp_path: Path) -> None:
    from mtp2draft.formats.export import export
    from mtp2draft.formats.serving import DEFAULT_K
    from mtp2draft.hub.card import model_card

    src = build("mimo", num_nextn_predict_layers=5)
    convert(str(src), tmp_path / "chain5", all_layers=True)
    export(tmp_path / "chain5", "stitched", tmp_path / "st", target=str(src))
    text = str(model_card(tmp_path / "st"))
    assert "This draft chains 5 MTP layers" in text and "`step_layers: cycle`" in text
    assert "vllm 0.33.0 runs layer 0 at every step" in text  # model_specs/mimo.toml's engine table
    assert DEFAULT_K < 5 and '"num_speculative_tokens": 5' in text  # the launch line drafts every layer


def test_a_known_engine_bug_reaches_the_card_and_evaluate(build, tmp_path: Path) -> None:
    """The spec's `[engines.vllm] known_bug` (vLLM runs layer 0 of a multi-layer qwen3_5_mtp at every step,
    vllm-project/vllm#52688) is on a chain draft's card and in `evaluate --engine vllm`'s note and row; a family whose
    table records none gets neither."""
    from mtp2draft.engines.vllm_evaluate import chain_rule
    from mtp2draft.family.spec import get_spec
    from mtp2draft.hub.card import model_card

    for fixture, layers, bug in (("qwen3_5_flat", {"mtp_num_hidden_layers": 2}, True),
                                 ("mimo", {"num_nextn_predict_layers": 2}, False)):  # fmt: skip
        convert(str(build(fixture, **layers)), tmp_path / fixture, all_layers=True)
        notes: list[str] = []
        row = chain_rule(tmp_path / fixture, get_spec(fixture), notes.append, "0.34.0")
        card = str(model_card(tmp_path / fixture))
        assert ("vllm-project/vllm#52688" in card) == bug and ("known_bug" in row) == bug
        assert any("#52688" in n and n.startswith("note: known bug of vllm") for n in notes) == bug


def test_inspect_offers_all_layers(chain_dir) -> None:
    from mtp2draft.cli.output import inspect_text
    from mtp2draft.conversion import inspect_checkpoint

    assert "--all-layers takes them all" in inspect_text(inspect_checkpoint(str(chain_dir[0])))


def test_run_all_layers_end_to_end(target, text_data, tmp_path: Path) -> None:
    """`run --all-layers`: the raw chain is the baseline, the distilled chain is evaluated and exported stitched with
    every layer; a kind or format that holds one layer is refused before anything is fetched."""
    from mtp2draft import pipeline
    from mtp2draft.evaluation.settings import EvaluateConfig
    from mtp2draft.settings import ConvertConfig, RunConfig
    from mtp2draft.train.settings import DistillConfig, TrainingData

    src = target("mimo", num_nextn_predict_layers=3)
    common = {
        "distill": DistillConfig(steps=2, batch_size=2, max_length=32, ttt_steps=4, lr=1e-3),
        "evaluate": EvaluateConfig(num_draft_tokens=4, max_new_tokens=6, max_prompts=2),
    }
    result = pipeline.run(
        str(src),
        config=RunConfig(work=tmp_path / "w", training=TrainingData(data=text_data)),
        stages=pipeline.Stages(convert=ConvertConfig(all_layers=True), **common),
    )
    for path in (result.raw, result.distilled):
        assert json.loads((path / "config.json").read_text())["mtp_layers"] == [0, 1, 2]
    assert result.report["results"][0]["chain"] == {"num_layers": 3, "step_layers": "cycle"}
    index = json.loads((result.exported / "model.safetensors.index.json").read_text())
    assert {k.split(".")[2] for k in index["weight_map"] if ".mtp_layers." in k} == {"0", "1", "2"}
    for kind, fmt, message in (({"to": "eagle3"}, None, "--all-layers writes a native chain draft"),
                                  ({}, "nextn", "only --format stitched"),
                                  ({"layer": 1}, None, "exclude each other")):  # fmt: skip
        with pytest.raises(OptionError, match=message):
            run = RunConfig(work=tmp_path / "x", training=TrainingData(data=text_data), format=fmt)
            stages = pipeline.Stages(convert=ConvertConfig(all_layers=True, **kind), **common)
            pipeline.run(str(src), config=run, stages=stages)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("world", [1, 2])
def test_memory_plan_counts_the_layers_the_rule_trains(chain_dir, world: int) -> None:
    """Under vLLM's `first` rule only layer 0 gets gradients: the plan's gradients and optimizer state count layer
    0's parameters, as distill's optimizer holds them (sharded or not)."""
    from mtp2draft.train.memory import plan
    from mtp2draft.train.recipe import configure_draft
    from mtp2draft.train.settings import DistillConfig

    _, chain = chain_dir
    cfg = json.loads((chain / "config.json").read_text())
    cycle = plan(cfg, world=world)
    first = plan(cfg, DistillConfig(serving_engine="vllm"), world=world)
    draft = load_draft(chain)
    assert cycle.trainable == sum(p.numel() for p in draft.trainable_parameters()) == cycle.parameters
    configure_draft(draft, DistillConfig(serving_engine="vllm"))
    assert draft.step_layers == "first"
    assert first.trainable == sum(p.numel() for p in draft.trainable_parameters()) == cycle.trainable // 3
    assert first.bytes["optimizer"] == cycle.bytes["optimizer"] // 3
    assert first.bytes["parameters"] == cycle.bytes["parameters"]
