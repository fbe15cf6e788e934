"""train.dspark / train.dspark_run: distilling a DSpark drafter against the frozen target.

The quality test scores drafters with an oracle independent of the training code: the drafter's serving path
(`draft_block`: one pass, the Markov head chaining on its own tokens) at anchors of held-out text, against the
target's greedy tokens, so a bug in how training picks labels, teachers or anchors shows as a worse drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtp2draft.cli.app import main
from mtp2draft.data import load_tokenizer, read_examples
from mtp2draft.draft import dspark_disk as disk
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.target.hidden import TargetModel
from mtp2draft.train.dspark import anchor_candidates, block_step, context_of, sample_anchors, slot_rates
from mtp2draft.train.dspark_run import DSparkRun, distill_dspark
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, DSparkObjective, NewDSpark, TrainingData
from mtp2draft.train.teacher import collate

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "targets" / "tiny-deepseek-v3"
TRAIN, HELDOUT = ROOT / "examples" / "data" / "train.jsonl", ROOT / "examples" / "data" / "heldout.jsonl"
LAYERS = [3, 6]


# ---- the math, on tiny dimensions ------------------------------------------------------------------------------------
V, H = 40, 16
SMALL = {"hidden_size": H, "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V, "max_position_embeddings": 128}  # fmt: skip
FIELDS = DSparkFields(block_size=3, target_layer_ids=(0, 2), noise_token_id=39, markov_rank=5, n_routed_experts=None,
                      num_experts_per_tok=None, section="test")  # fmt: skip


def test_anchors_start_only_where_the_anchor_and_its_first_label_are_loss_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 40, generator=g) > 0.4
    mask[0] = False  # a row with no candidate
    mask[1] = False
    mask[1, 10:13] = True  # candidates 10 and 11 only
    anchors, keep = sample_anchors(mask, 8, torch.Generator().manual_seed(1))
    candidates = anchor_candidates(mask)
    for row in range(6):
        kept = anchors[row][keep[row]].tolist()
        assert all(mask[row, a] and mask[row, a + 1] for a in kept), (row, kept)
        assert len(set(kept)) == len(kept) == min(8, int(candidates[row, :-1].sum()))
    assert not keep[0].any() and anchors[1][keep[1]].tolist() == [10, 11]
    # drawn at random: another seed picks other anchors from the same candidates
    other, _ = sample_anchors(mask, 8, torch.Generator().manual_seed(2))
    assert not torch.equal(anchors[2:], other[2:])


def test_a_few_steps_on_a_fixed_batch_lower_the_loss() -> None:
    g = torch.Generator().manual_seed(3)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    draft = disk.new_dspark_draft(SMALL, FIELDS, 1, embed, head, seed=0)
    ids = torch.randint(0, 38, (2, 24), generator=g)
    context = torch.randn(2, 24, 2 * H, generator=g)
    target_logits = 3 * torch.randn(2, 24, V, generator=g)
    mask = torch.ones(2, 24, dtype=torch.bool)
    anchors, keep = sample_anchors(mask, 6, torch.Generator().manual_seed(0))
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(25):
        stats = block_step(draft, context, ids, target_logits, (anchors, keep, mask), DSparkObjective())
        opt.zero_grad()
        stats.loss.backward()
        opt.step()
        losses.append(float(stats.loss.detach()))
    assert losses[-1] < 0.7 * losses[0], losses
    assert torch.equal(draft.embed_tokens.weight, embed) and torch.equal(draft.lm_head.weight, head)


def test_settings_refuse_what_would_train_nothing() -> None:
    from mtp2draft.errors import OptionError

    with pytest.raises(OptionError, match="both 0"):
        DSparkObjective(ce_weight=0, tv_weight=0)
    with pytest.raises(OptionError, match="--new-dspark"):
        NewDSpark(new_dspark=[5, 2])


# ---- on the bundled target --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target() -> TargetModel:
    return TargetModel(str(TARGET))


def _start(target: TargetModel, out: Path, seed: int = 0) -> Path:
    """A new random drafter for the target, written as a speculators dspark directory."""
    from mtp2draft.train.dspark_run import new_dspark_for

    draft = new_dspark_for(target, NewDSpark(new_dspark=LAYERS, block_size=4, markov_rank=16), seed)
    out.mkdir()
    disk.save_dspark(draft, out, {"name_or_path": str(TARGET), "architectures": ["DeepseekV3ForCausalLM"]})
    return out


def block_acceptance(draft, target: TargetModel, examples: int = 24, anchors: int = 6) -> list[float]:
    """Oracle: per-slot acceptance of real block drafting (`draft_block`) at anchors of held-out text, greedy
    verification against the target's tokens given the text (slots 0..k must all match)."""
    tokenizer = load_tokenizer(target.path)
    held, _ = read_examples(HELDOUT, tokenizer, 96)
    bs = draft.block_size
    hits, total = [0] * bs, 0
    for ex in held[:examples]:
        batch = collate([ex], 0)
        feats = target.run(batch["input_ids"], aux_layers=LAYERS, want_final=False)
        context, greedy = context_of(feats.aux), feats.logits.argmax(-1)[0]
        s = batch["input_ids"].shape[1]
        for a in torch.linspace(s // 3, s - bs - 1, anchors).long().tolist():
            tokens, _ = draft.draft_block(context[:, :a], batch["input_ids"][:, a])
            ok = (tokens[0] == greedy[a : a + bs]).int().cumprod(0)
            hits = [h + int(o) for h, o in zip(hits, ok.tolist(), strict=True)]
            total += 1
    return [h / total for h in hits]


def test_distill_makes_a_better_drafter_and_never_writes_the_target(tmp_path: Path, target: TargetModel) -> None:
    """Real drafting quality (the oracle above) rises over the untrained drafter; the target's weights are the same
    bit for bit, the drafter's embedding and head are the target's own (shared, frozen, unchanged)."""
    start = _start(target, tmp_path / "start")
    before_state = {k: v.clone() for k, v in target.model.state_dict().items()}
    # a high learning rate and full cross-entropy weight, so 40 steps move a random drafter measurably
    cfg = DistillConfig(steps=40, batch_size=4, max_length=64, lr=1e-2, log_every=20, save_every=1000)
    objective = DSparkObjective(anchors=64, ce_weight=1.0)
    job = DistillJob(draft_dir=start, out=tmp_path / "out", target=str(TARGET), data=TrainingData(data=TRAIN),
                     config=cfg, dspark=objective)  # fmt: skip
    run = DSparkRun(job, "cpu")
    run.run()
    after = run.teacher.target.model.state_dict()
    assert all(torch.equal(before_state[k], after[k]) for k in before_state)
    embed, head = run.teacher.target.embedding(), run.teacher.target.lm_head()
    assert (
        run.draft.embed_tokens.weight.data_ptr() == embed.data_ptr() and not run.draft.embed_tokens.weight.requires_grad
    )
    assert run.draft.lm_head.weight.data_ptr() == head.data_ptr() and not run.draft.lm_head.weight.requires_grad
    assert torch.equal(embed, before_state["model.embed_tokens.weight"])
    assert torch.equal(head, before_state["lm_head.weight"])
    assert not {id(p) for p in run.params} & {id(embed), id(head), *map(id, target.model.parameters())}

    untrained = disk.open_dspark(start, target.embedding(), target.lm_head()).eval()
    trained = disk.open_dspark(tmp_path / "out", target.embedding(), target.lm_head()).eval()
    raw, tuned = block_acceptance(untrained, target), block_acceptance(trained, target)
    # measured: slot 0 from 0.007 to about 0.12; with the teacher taken one position late, 0.056 (this test fails)
    assert tuned[0] >= raw[0] + 0.06 and all(t >= r - 0.01 for t, r in zip(tuned, raw, strict=True)), (raw, tuned)


def test_teacher_forced_proxy_counts_contiguous_prefixes() -> None:
    rates, length = slot_rates([8, 4, 2], [10, 8, 4])
    assert rates == [0.8, 0.5, 0.5] and length == pytest.approx(1.8)


def test_cli_distills_a_speculators_dspark_drafter_and_it_reads_back(
    tmp_path: Path, target: TargetModel, capsys
) -> None:
    start = _start(target, tmp_path / "start", seed=1)
    out = tmp_path / "out"
    argv = ["distill", str(start), "--target", str(TARGET), "--data", str(TRAIN), "--heldout", str(HELDOUT),
            "--heldout-examples", "4", "--steps", "3", "--batch-size", "2", "--max-length", "64", "--anchors", "8",
            "--eval-every", "2", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3
    back = disk.open_dspark(out, target.embedding(), target.lm_head())
    assert back.fields == disk.open_dspark(start, target.embedding(), target.lm_head()).fields
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["distill"]["heldout"]["history"][0]["step"] == 0
    # the input is never touched; a second run into the same --out needs --overwrite
    assert main(argv) == 2 and "error:" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--steps", "2"]) == 0


def test_cli_starts_a_new_drafter_and_refuses_what_does_not_apply(tmp_path: Path, capsys) -> None:
    out = tmp_path / "new"
    common = ["--target", str(TARGET), "--data", str(TRAIN), "--steps", "2", "--batch-size", "2", "--max-length",
              "48", "--anchors", "4", "--out", str(out)]  # fmt: skip
    assert main(["distill", "--new-dspark", "2,5", "--block-size", "3", "--markov-rank", "8", *common]) == 0
    back = json.loads((out / "config.json").read_text())
    assert back["block_size"] == 3 and back["aux_hidden_state_layer_ids"] == [3, 6]
    capsys.readouterr()
    for extra, says in (
        (["--new-dspark", "2,99"], "layers 0..7"),
        (["--new-dspark", "2", "--ttt-steps", "2", "--serving-engine", "vllm"], "does not apply"),
        (["--new-dspark", "2", "--hidden-states", str(tmp_path)], "whole distribution"),
    ):
        assert main(["distill", *extra, *common[:-2], "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert says in err and len([x for x in err.splitlines() if x.startswith("error:")]) == 1, err
    assert not (tmp_path / "x").exists()
    with pytest.raises(Exception, match="not both"):
        distill_dspark(
            DistillJob(draft_dir=out, out=tmp_path / "y", target=str(TARGET), data=TrainingData(data=TRAIN),
                       new=NewDSpark(new_dspark=[1]))
        )  # fmt: skip


def test_a_killed_run_resumes_to_the_same_weights(tmp_path: Path, target: TargetModel) -> None:
    from safetensors.torch import load_file

    start = _start(target, tmp_path / "start", seed=2)
    cfg = DistillConfig(steps=3, batch_size=2, max_length=48, lr=3e-3, save_every=1)
    objective = DSparkObjective(anchors=6)

    def job(out: str, **kw) -> DistillJob:
        return DistillJob(draft_dir=start, out=tmp_path / out, target=str(TARGET), data=TrainingData(data=TRAIN),
                          config=cfg, dspark=objective, **kw)  # fmt: skip

    distill(job("whole"))
    stopped = distill(job("resumed", stop_after=2))
    assert stopped.steps == 2 and not (tmp_path / "resumed").exists()
    assert (tmp_path / "resumed.checkpoints" / "step-0000002" / "state.json").is_file()
    assert distill(job("resumed", resume=True)).resumed_from == 2
    whole, resumed = (
        load_file(tmp_path / "whole" / "model.safetensors"),
        load_file(tmp_path / "resumed" / "model.safetensors"),
    )
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not (tmp_path / "resumed.checkpoints").exists()
