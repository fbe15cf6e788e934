"""evaluation.dspark: block drafting against the frozen target is lossless, and its bookkeeping is pinned by oracle
drafters (every proposal right, every proposal wrong, a confidence head that stops at a known slot)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mtp2draft.cli.app import main
from mtp2draft.draft.dspark_disk import new_dspark_draft, save_dspark
from mtp2draft.evaluation.decode import PromptResult, TargetRunner, greedy_reference
from mtp2draft.evaluation.dspark import block_decode, block_summary, slots_to_verify
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.formats.report import parse_report
from mtp2draft.target.hidden import TargetModel

PROMPTS = [[5, 17, 42, 9, 88, 23], [70, 71, 72, 3, 9], [40, 41]]
MAX_NEW = 20


def _fields(tm: TargetModel, block_size: int = 4) -> DSparkFields:
    return DSparkFields(block_size=block_size, target_layer_ids=tuple(range(tm.num_layers)),
                        noise_token_id=tm.vocab_size - 1, markov_rank=4, n_routed_experts=None,
                        num_experts_per_tok=None, section="config.json")  # fmt: skip


def _random_draft(tm: TargetModel, seed: int = 0, block_size: int = 4):
    """A random drafter with non-zero Markov and confidence heads (new drafters start them at zero)."""
    draft = new_dspark_draft(tm.raw_config, _fields(tm, block_size), 1, tm.embedding(), tm.lm_head(), seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in (draft.markov_head.markov_w2.weight, draft.confidence_head.weight, draft.confidence_head.bias):
            p.copy_(torch.randn(p.shape, generator=g))
    return draft.eval()


class OracleDSpark:
    """Knows the target's greedy continuation `sequence` (prompt + reference): drafts its next tokens (shift 0) or
    always a wrong token (shift 1); its confidence is high on every slot but `stop_at`, where it is low."""

    def __init__(
        self, fields: DSparkFields, sequence: list[int], vocab: int, shift: int = 0, stop_at: int | None = None
    ):
        self.fields, self.sequence, self.vocab, self.shift, self.stop_at = fields, sequence, vocab, shift, stop_at

    def draft_block(self, targets: torch.Tensor, last_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, bs = targets.shape[1], self.fields.block_size
        assert last_token.tolist() == [self.sequence[s]], "slot 0 must hold the token at position S"
        tokens = [(self.sequence[p] + self.shift) % self.vocab if p < len(self.sequence) else 0
                  for p in range(s + 1, s + 1 + bs)]  # fmt: skip
        confidence = torch.full((1, bs), 5.0)
        if self.stop_at is not None:
            confidence[0, self.stop_at] = -5.0
        return torch.tensor([tokens]), confidence


@pytest.fixture(scope="module")
def tm(target) -> TargetModel:
    return TargetModel(str(target("deepseek_v3")))


@pytest.fixture(scope="module")
def refs(tm) -> list[list[int]]:
    """The target's greedy continuation of each prompt (what every decoding here must reproduce)."""
    return [greedy_reference(TargetRunner(tm), prompt, MAX_NEW, None) for prompt in PROMPTS]


def _forwards(tokens: int, per_block: int) -> int:
    """Verification forwards to make `tokens` when each gives `per_block` (the prefill gives the first token)."""
    return math.ceil((tokens - 1) / per_block)


@pytest.mark.parametrize("bs", [1, 3, 4])
def test_oracle_drafters_pin_the_bookkeeping(tm, refs, bs: int) -> None:
    runner = TargetRunner(tm)
    fields = _fields(tm, bs)
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        perfect = OracleDSpark(fields, prompt + ref, tm.vocab_size)
        tokens, blocks = block_decode(runner, perfect, prompt, MAX_NEW, None)
        assert tokens == ref
        assert [a for a, _ in blocks[:-1]] == [bs] * (len(blocks) - 1)  # the last block may run past MAX_NEW
        assert all(n == bs for _, n in blocks) and len(blocks) == _forwards(MAX_NEW, bs + 1)
        wrong = OracleDSpark(fields, prompt + ref, tm.vocab_size, shift=1)
        tokens, blocks = block_decode(runner, wrong, prompt, MAX_NEW, None)
        assert tokens == ref and blocks == [(0, bs)] * (MAX_NEW - 1)  # one (bonus) token per forward


@pytest.mark.parametrize("stop_at", [0, 2])
def test_the_confidence_stop_cuts_each_block_before_its_first_unsure_slot(tm, refs, stop_at: int) -> None:
    runner, bs = TargetRunner(tm), 4
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        oracle = OracleDSpark(_fields(tm, bs), prompt + ref, tm.vocab_size, stop_at=stop_at)
        tokens, blocks = block_decode(runner, oracle, prompt, MAX_NEW, None, threshold=0.5)
        assert tokens == ref
        assert all(n == stop_at for _, n in blocks) and len(blocks) == _forwards(MAX_NEW, stop_at + 1)
        assert [a for a, _ in blocks[:-1]] == [stop_at] * (len(blocks) - 1)
        _, blocks = block_decode(runner, oracle, prompt, MAX_NEW, None)  # stop off: whole blocks
        assert all(n == bs for _, n in blocks)


def test_slots_to_verify() -> None:
    logits = torch.tensor([2.0, 0.1, -0.1, 3.0])  # sigmoid: 0.88, 0.52, 0.48, 0.95
    assert slots_to_verify(logits, None) == 4
    assert slots_to_verify(logits, 0.5) == 2  # the first slot under 0.5 is slot 2: slots 0 and 1 are verified
    assert slots_to_verify(logits, 0.9) == 0 and slots_to_verify(logits, 0.0) == 4


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_random_drafters_are_lossless_and_their_counts_add_up(tm, refs, threshold: float | None) -> None:
    runner, bs = TargetRunner(tm), 3
    for seed in (0, 1):
        draft = _random_draft(tm, seed, bs)
        results, blocks = [], []
        for prompt, ref in zip(PROMPTS, refs, strict=True):
            tokens, steps = block_decode(runner, draft, prompt, MAX_NEW, None, threshold)
            assert tokens == ref
            assert 1 + sum(a + 1 for a, _ in steps[:-1]) < MAX_NEW <= 1 + sum(a + 1 for a, _ in steps)
            results.append(PromptResult(tokens, [a for a, _ in steps], ref, True))
            blocks.append(steps)
        row = block_summary("r", "d", bs, results, blocks, 0.0, threshold)
        flat = [b for p in blocks for b in p]
        assert sum(row["slots_accepted"]) == row["tokens_accepted"] == sum(a for a, _ in flat)
        assert row["slots_reached"][0] == sum(1 for _, n in flat if n >= 1)
        for k in range(1, bs):  # slot k + 1 is reached by the blocks that accepted slot k and verified slot k + 1
            stopped = sum(1 for a, n in flat if a >= k and n == k)
            assert row["slots_reached"][k] == row["slots_accepted"][k - 1] - stopped
        assert row["tokens_drafted"] == sum(n for _, n in flat) and row["target_forwards"] == len(flat)
        assert row["forwards"] == {"speculative": len(PROMPTS) + len(flat), "plain_greedy": len(PROMPTS) * MAX_NEW}
        if threshold is None:  # whole blocks: slot k + 1 is reached exactly when slot k was accepted
            reached = [len(flat), *row["slots_accepted"][:-1]]
            assert row["slots_reached"] == reached
            assert row["acceptance_per_position"] == pytest.approx(
                [x / r if r else 0.0 for x, r in zip(row["slots_accepted"], reached, strict=True)]
            )


def test_summary_arithmetic() -> None:
    """Slot k's acceptance is over the blocks that reached it: a block cut at n never reaches slot n + 1."""
    results = [PromptResult([], [2, 0, 1], [], True)]
    row = block_summary("x", "d", 3, results, [[(2, 3), (0, 3), (1, 1)]], 0.0, 0.5)
    assert row["slots_reached"] == [3, 1, 1] and row["slots_accepted"] == [2, 1, 0]  # (1, 1) stops after slot 1
    assert row["acceptance_per_position"] == pytest.approx([2 / 3, 1.0, 0.0])
    assert row["per_draft_acceptance"] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert row["mean_acceptance_length"] == pytest.approx((3 + 1 + 2) / 3)
    assert row["tokens_drafted"] == 7


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"text": "def f(x):\\n    return x + 1"}\n{"text": "hello there, how"}\n')
    return data


def test_cli_evaluates_a_saved_dspark_directory_against_a_baseline(target, tmp_path: Path, capsys) -> None:
    path = target("deepseek_v3")
    tm = TargetModel(str(path))
    verifier = {"name_or_path": str(path), "architectures": tm.raw_config["architectures"]}
    for name, seed in (("ft", 0), ("raw", 1)):
        (tmp_path / name).mkdir()
        save_dspark(_random_draft(tm, seed), tmp_path / name, verifier)
    argv = ["evaluate", str(tmp_path / "ft"), "--target", str(path), "--data", str(_data(tmp_path)),
            "--max-new-tokens", "12", "--baseline", str(tmp_path / "raw")]  # fmt: skip
    assert main([*argv, "--json", "--save"]) == 0
    report = json.loads(capsys.readouterr().out)
    saved = parse_report(json.loads((tmp_path / "ft" / "evaluation.json").read_text()))  # as push reads it
    assert len(saved.results) == 2 and len(saved.draft.acceptance_per_position) == 4
    assert report["draft_kind"] == "dspark" and report["block_size"] == 4 and report["lossless"] is True
    assert [r["name"] for r in report["results"]] == ["draft", f"baseline: {tmp_path / 'raw'}"]
    for rows in (report["results"], report["confidence_stop"]["results"]):
        for r in rows:
            assert r["lossless"] is True and r["num_draft_tokens"] == 4 and len(r["acceptance_per_position"]) == 4
            assert r["forwards"]["plain_greedy"] == 2 * 12
            assert r["forwards"]["speculative"] == 2 + r["target_forwards"]
    assert report["confidence_stop"]["threshold"] == 0.5
    assert report["comparison"][0]["prompts"] == 2 and report["confidence_stop"]["comparison"]
    assert main([*argv, "--confidence-threshold", "0.7"]) == 0
    text = capsys.readouterr().out
    assert "DSpark: blocks of 4 draft tokens" in text and "sigmoid(confidence) < 0.7" in text
    assert "plain greedy 24" in text and "paired bootstrap over 2 prompts" in text


def test_cli_refusals(target, tmp_path: Path, capsys) -> None:
    path = target("deepseek_v3")
    tm = TargetModel(str(path))
    (tmp_path / "d").mkdir()
    save_dspark(_random_draft(tm), tmp_path / "d", {"name_or_path": str(path), "architectures": ["X"]})
    common = ["evaluate", str(tmp_path / "d"), "--target", str(path), "--data", str(_data(tmp_path))]
    for extra, says in (
        (["--engine", "vllm"], "does not run DSpark drafts yet"),
        (["-k", "3"], "drafts blocks of 4 tokens in one pass"),
        (["--temperature", "1"], "greedily"),
    ):
        assert main([*common, *extra]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and says in lines[0], (extra, lines)
