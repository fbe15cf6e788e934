"""Speculative decoding: lossless for every draft, acceptance bookkeeping checked with oracle drafts, and the raw
DeepSeek MTP head cross-checked against transformers' own generate(use_mtp=True)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from support.fixtures import eagle3_depth

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.data import load_tokenizer
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.modules import DraftCache
from mtp2draft.evaluation.decode import (
    TargetRunner,
    draft_chain,
    greedy_reference,
    speculative_decode,
    summarise,
    tie_tolerance,
)
from mtp2draft.target.hidden import TargetModel

PROMPTS = [[5, 17, 42, 9, 88, 23], [70, 71, 72, 3, 9], [40, 41]]


class OracleDraft:
    """Knows the target's greedy continuation: proposes exactly it (shift=0), or always something else (shift=1)."""

    kind = "mtp"
    hidden_handover = "post_norm"

    def __init__(self, sequence: list[int], vocab: int, shift: int) -> None:
        self.sequence, self.vocab, self.shift = sequence, vocab, shift

    def initial_hidden(self, features):
        return features

    def to_target_ids(self, ids):
        return ids

    def __call__(self, input_ids, hidden, position_ids, attention_mask=None, cache: DraftCache | None = None):
        # the entry at position q reads token q and proposes token q + 1
        nxt = [
            [
                (self.sequence[q + 1] + self.shift) % self.vocab if q + 1 < len(self.sequence) else 0
                for q in row.tolist()
            ]
            for row in position_ids
        ]
        return torch.nn.functional.one_hot(torch.tensor(nxt), self.vocab).float(), hidden


@pytest.fixture(scope="module")
def ds_target(target):
    return TargetModel(str(target("deepseek_v3")))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_drafts_pin_the_acceptance_bookkeeping(ds_target, k: int) -> None:
    runner = TargetRunner(ds_target)  # no draft: the final hidden, as a native MTP draft reads it
    for prompt in PROMPTS:
        ref = greedy_reference(runner, prompt, 24, None)
        perfect = OracleDraft(prompt + ref, ds_target.vocab_size, 0)
        tokens, accepted = speculative_decode(runner, perfect, prompt, k, 24, None)
        assert tokens == ref
        assert accepted[:-1] == [k] * (len(accepted) - 1)  # every proposal accepted (the last may run past the end)
        assert len(accepted) == -(-24 // (k + 1))  # ceil: k + 1 tokens per target forward
        wrong = OracleDraft(prompt + ref, ds_target.vocab_size, 1)
        tokens, accepted = speculative_decode(runner, wrong, prompt, k, 24, None)
        assert tokens == ref and accepted == [0] * 23  # one (bonus) token per forward after the prefill's


def test_summary_arithmetic() -> None:
    from mtp2draft.evaluation.decode import PromptResult

    results = [PromptResult([], [3, 1, 0, 2], [], True), PromptResult([], [3], [], True)]
    s = summarise("x", "d", 3, results, 0.0)
    assert s.mean_acceptance_length == (4 + 2 + 1 + 3 + 4) / 5
    # position j: P(accepted j | accepted j-1): 4/5, then 3/4, then 2/3
    assert s.acceptance_per_position == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert (s.tokens_drafted, s.tokens_accepted, s.target_forwards) == (15, 9, 5)


@pytest.mark.parametrize("fixture", ["deepseek_v3", "mimo"])
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_speculative_output_equals_target_greedy(target, tmp_path: Path, fixture: str, kind: str) -> None:
    tgt = target(fixture, **eagle3_depth(fixture, kind))
    convert(str(tgt), tmp_path / "d", to=kind, dtype="float32")
    tm = TargetModel(str(tgt))
    draft = load_draft(tmp_path / "d").eval()
    draft.attach_target(tm.embedding().float(), tm.lm_head().float())
    runner = TargetRunner(tm, draft)
    for prompt in PROMPTS:
        ref = greedy_reference(runner, prompt, 20, None)
        for k in (1, 4):
            tokens, accepted = speculative_decode(runner, draft, prompt, k, 20, None)
            assert tokens == ref
            # bookkeeping: the prefill gives 1 token, each verification a + 1; the last one crosses max_new (20)
            made = [1 + sum(x + 1 for x in accepted[:i]) for i in range(len(accepted) + 1)]
            assert made[-2] < 20 <= made[-1], (made, accepted)


TRAINED = Path(__file__).resolve().parents[1] / "examples" / "targets" / "tiny-deepseek-v3"


@pytest.mark.parametrize("which", ["fixture", "trained"])
def test_transformers_generate_use_mtp_agrees_with_the_raw_head(target, tmp_path: Path, which: str) -> None:
    """Cross-check with an independent implementation: transformers' generate(use_mtp=True) on the same target
    drafts one token per forward with the raw MTP head; outputs and target forward counts must match ours (k=1).
    On the trained target the head is right most of the time, so the counts test acceptance, not just rejection."""
    tgt = target("deepseek_v3") if which == "fixture" else TRAINED
    convert(str(tgt), tmp_path / "raw", dtype="float32")
    tm = TargetModel(str(tgt))
    cfg = json.loads((tgt / "config.json").read_text())
    # transformers finds the MTP keys through this attribute (hard-coded to the release's layer 61)
    tm.model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{cfg['num_hidden_layers']}.*"]
    tm.model.config.name_or_path = str(tgt)
    draft = load_draft(tmp_path / "raw").eval()
    draft.attach_target(tm.embedding().float(), tm.lm_head().float())
    runner = TargetRunner(tm, draft)
    accepted_total = 0
    for prompt in PROMPTS:
        calls = []
        hook = tm.model.register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        try:
            out = tm.model.generate(
                torch.tensor([prompt]),
                use_mtp=True,
                max_new_tokens=16,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        finally:
            hook.remove()
        theirs = out[0, len(prompt) :].tolist()
        ours, accepted = speculative_decode(runner, draft, prompt, 1, 16, None)
        assert ours == theirs
        assert 1 + len(accepted) == len(calls)  # prefill + one verification per drafted token
        accepted_total += sum(accepted)
    if which == "trained":  # the comparison covered accepted drafts, not only rejections
        assert accepted_total > 0


TRAINED_TARGETS = TRAINED.parent


@pytest.mark.parametrize("name", ["tiny-deepseek-v3", "tiny-mimo"])
@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_decoding_accepts_exactly_where_the_forced_chain_predicts_the_target(
    tmp_path: Path, name: str, kind: str
) -> None:
    """The decoding loop (incremental target, draft cache cropped and refilled after each verification) against the
    chain recomputed from scratch on the finished greedy text (draft_chain, which the TTT equivalence test ties to
    training): at every round, the number of accepted tokens must equal the number of leading chain predictions
    that match the target's tokens. Trained targets, so that both acceptances and rejections occur."""
    tgt = TRAINED_TARGETS / name
    convert(str(tgt), tmp_path / "d", to=kind, dtype="float32")
    tm = TargetModel(str(tgt))
    draft = load_draft(tmp_path / "d").eval()
    draft.attach_target(tm.embedding().float(), tm.lm_head().float())
    runner = TargetRunner(tm, draft)
    aux = draft.aux_layer_ids if kind == "eagle3" else None
    rounds, accepted_total = 0, 0
    tok = load_tokenizer(tgt)
    for text in ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "for i in range(10):\n    print(i)\n"):
        prompt = tok(text)["input_ids"]  # code, as the targets were trained on: both acceptances and rejections
        ref = greedy_reference(runner, prompt, 24, None)
        full = torch.tensor([prompt + ref])
        step0 = tm.features(full, aux_layers=aux).step0_input(kind)
        for k in (1, 3):
            _, accepted = speculative_decode(runner, draft, prompt, k, 24, None)
            o = len(prompt) - 1
            for a in accepted:
                if o + 1 + k >= full.shape[1]:  # the last rounds propose past the reference text
                    break
                with torch.no_grad():
                    chain = draft_chain(draft, step0, full, o, k)
                preds = [int(draft.to_target_ids(logits.argmax())) for logits in chain]
                expected = 0
                while expected < k and preds[expected] == int(full[0, o + 2 + expected]):
                    expected += 1
                assert a == expected, f"round at origin {o}, k={k}"
                rounds, accepted_total = rounds + 1, accepted_total + a
                o += 1 + a
    assert rounds >= 10 and accepted_total > 0


def test_evaluate_cli_reports_the_documented_keys(target, text_data, tmp_path: Path, capsys) -> None:
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw")
    convert(str(tgt), tmp_path / "e3", to="eagle3")
    code = main(
        [
            "evaluate",
            str(tmp_path / "e3"),
            "--target",
            str(tgt),
            "--data",
            str(text_data),
            "--baseline",
            str(tmp_path / "raw"),
            "-k",
            "3",
            "--max-new-tokens",
            "8",
            "--max-prompts",
            "3",
            "--json",
            "--save",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    for key in ("mean_acceptance_length", "acceptance_per_position", "lossless", "num_draft_tokens", "num_prompts"):
        assert key in report
    assert report["num_prompts"] == 3 and report["num_draft_tokens"] == 3 and report["lossless"] is True
    first = report["results"][0]  # the top-level figures are the first draft's, from its own counts
    assert report["mean_acceptance_length"] == pytest.approx(
        (first["tokens_accepted"] + first["target_forwards"]) / first["target_forwards"]
    )
    assert first["tokens_drafted"] == 3 * first["target_forwards"] and len(report["acceptance_per_position"]) == 3
    assert [r["name"] for r in report["results"]] == ["draft", f"baseline: {tmp_path / 'raw'}"]
    assert json.loads((tmp_path / "e3" / "evaluation.json").read_text())["results"] == report["results"]
    assert "and " + str(tmp_path / "e3" / "acceptance.png") in err  # the chart beside it (tests/test_charts.py)
    (cmp,) = report["comparison"]  # the draft against its baseline, on the same prompts
    assert cmp["prompts"] == 3 and cmp["baseline"] == report["results"][1]["name"]
    gap = report["results"][0]["mean_acceptance_length"] - report["results"][1]["mean_acceptance_length"]
    assert cmp["difference"]["mean_acceptance_length"]["value"] == pytest.approx(gap, abs=1e-4)
    code = main(
        [
            "evaluate",
            str(tmp_path / "e3"),
            "--target",
            str(tgt),
            "--data",
            str(text_data),
            "-k",
            "2",
            "--max-new-tokens",
            "4",
            "--max-prompts",
            "2",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0 and "accept len" in out and "pos 2" in out


def test_summary_reports_acceptance_per_draft_beside_the_conditional() -> None:
    from mtp2draft.evaluation.decode import PromptResult

    results = [PromptResult([], [3, 1, 0, 2], [], True), PromptResult([], [3], [], True)]
    s = summarise("x", "d", 3, results, 0.0)
    # position j per draft: P(a >= j) over the 5 drafts: 4/5, 3/5, 2/5 (falls with j by construction)
    assert s.per_draft_acceptance == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    # ... and it is the running product of the conditional figures
    running = [s.acceptance_per_position[0]]
    for c in s.acceptance_per_position[1:]:
        running.append(running[-1] * c)
    assert s.per_draft_acceptance == pytest.approx(running)


@pytest.mark.slow
def test_evaluate_cli_at_a_temperature(target, text_data, tmp_path: Path, capsys) -> None:
    """--temperature: seeded (same seed, same report), both acceptance metrics, a distribution check instead of the
    token-for-token one; bad sampling options are one-line errors."""
    tgt = target("mimo", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "raw")
    args = ["evaluate", str(tmp_path / "raw"), "--target", str(tgt), "--data", str(text_data), "-k", "3"]
    args += ["--max-new-tokens", "12", "--max-prompts", "3", "--temperature", "1", "--top-p", "0.95"]
    reports = []
    for _ in range(2):
        assert main([*args, "--draft-sampling", "sample", "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    first, again = reports
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in (first["results"][0], again["results"][0])]
    assert strip[0] == strip[1]  # seeded
    assert (first["temperature"], first["top_p"], first["draft_sampling"]) == (1.0, 0.95, "sample")
    result = first["results"][0]
    assert result["lossless"] is None and first["lossless"] is None
    check = result["distribution_check"]
    assert check["tokens"] == 3 * 12
    # the p-value belongs to the reported D at n = 36 (Stephens: t = (sqrt n + 0.12 + 0.11 / sqrt n) D, then
    # P(K > t) = 2 sum_j (-1)^(j-1) exp(-2 j^2 t^2)), not merely to [0, 1]
    t = (6 + 0.12 + 0.11 / 6) * check["pit_ks_statistic"]
    by_hand = 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * t * t) for j in range(1, 50))
    assert 0 < check["pit_ks_statistic"] < 1 and check["pit_ks_p_value"] == pytest.approx(min(1.0, by_hand))
    assert len(result["per_draft_acceptance"]) == 3 == len(first["per_draft_acceptance"])
    assert result["per_draft_acceptance"][0] == pytest.approx(result["acceptance_per_position"][0])
    assert main([*args, "--seed", "7"]) == 0  # argmax proposals, the table
    out = capsys.readouterr().out
    assert "seed 7, draft proposes by argmax" in out and "KS p = " in out
    for bad, message in ((["--top-p", "0"], "--top-p"), (["--draft-sampling", "beam"], "--draft-sampling")):
        assert main(args + bad) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


# ---- a draft against its baseline: paired bootstrap -----------------------------------------------------------------
def _result(name: str, steps: list[list[int]], k: int = 3) -> dict:
    return {"name": name, "num_draft_tokens": k, "accepted_by_prompt": steps}


def test_paired_bootstrap_pools_like_evaluate_and_brackets_its_estimate() -> None:
    from mtp2draft.evaluation.compare import paired_bootstrap, pooled

    rng = random.Random(1)
    base = [[rng.choice([0, 0, 1, 2]) for _ in range(rng.randrange(3, 12))] for _ in range(40)]
    better = [[min(a + 1, 3) for a in p] for p in base]  # one more token accepted at every forward
    assert pooled([[0, 1], [3]], 3) == [(1 + 2 + 4) / 3, 2 / 3, 1 / 3, 1 / 3]
    cmp = paired_bootstrap(_result("ft", better), _result("raw", base), samples=500)
    d = cmp["difference"]["mean_acceptance_length"]
    assert d["low"] <= d["value"] <= d["high"] and d["low"] > 0  # better on every prompt: the interval excludes 0
    assert d["value"] == pytest.approx(pooled(better, 3)[0] - pooled(base, 3)[0], abs=1e-4)
    assert cmp == paired_bootstrap(_result("ft", better), _result("raw", base), samples=500)  # seeded
    same = paired_bootstrap(_result("a", base), _result("b", base), samples=200)["difference"]
    assert all(v == {"value": 0.0, "low": 0.0, "high": 0.0} for v in same.values())  # paired: no noise of its own


def test_paired_bootstrap_interval_covers_zero_for_noise_and_needs_the_same_prompts() -> None:
    from mtp2draft.evaluation.compare import paired_bootstrap

    rng = random.Random(2)
    one = [[rng.choice([0, 1, 2, 3]) for _ in range(8)] for _ in range(64)]
    two = [[rng.choice([0, 1, 2, 3]) for _ in range(8)] for _ in range(64)]  # the same law: no real difference
    d = paired_bootstrap(_result("a", one), _result("b", two))["difference"]["per_draft_acceptance_1"]
    assert d["low"] < 0 < d["high"]
    with pytest.raises(ValueError, match="same prompts"):
        paired_bootstrap(_result("a", one), _result("b", two[:10]))


def test_evaluate_text_prints_the_comparison_line() -> None:
    from mtp2draft.cli.output import comparison_text

    diff = {"value": 0.1234, "low": 0.05, "high": 0.2}
    line = comparison_text(
        {
            "draft": "draft",
            "baseline": "baseline: raw",
            "prompts": 64,
            "level": 0.95,
            "difference": {"mean_acceptance_length": diff, "per_draft_acceptance_1": diff},
        }
    )
    assert line.startswith("draft - baseline: raw: accept len +0.123 [+0.050, +0.200]") and "64 prompts" in line


# ---- the lossless check can fail ---------------------------------------------------------------------------------
class TiedRunner(TargetRunner):
    """The target with its top two logits made exactly equal where it predicts absolute position `at`: a real tie,
    as bf16 rounding makes them (greedy argmax then takes the lower id)."""

    def __init__(self, target, at: int) -> None:
        super().__init__(target)
        self.at = at

    def forward(self, ids: list[int], cache):
        past = cache.get_seq_length()
        logits, feats = super().forward(ids, cache)
        row = self.at - 1 - past  # row i predicts position past + i + 1
        if 0 <= row < len(ids):
            logits = logits.clone()
            first, second = logits[row].topk(2).indices.tolist()
            logits[row, second] = logits[row, first]
        return logits, feats


def _evaluate_one(runner, prompt: list[int], ref: list[int]):
    from mtp2draft.evaluation.decode import Decoding, evaluate_draft

    draft = OracleDraft(prompt + greedy_reference(runner, prompt, 16, None), runner.target.vocab_size, 0)
    return evaluate_draft(runner, draft, "d", "d", [prompt], [ref], Decoding(k=3, max_new=16, eos=None),
                          progress=lambda *_: None)  # fmt: skip


def test_a_greedy_difference_without_a_tie_raises_and_one_at_a_real_tie_passes(ds_target) -> None:
    """The product's first promise can fail. A reference that parts from the output where the target's top two logits
    are far apart (checked here by hand against the fp32 tolerance) raises `LosslessError`; the same parting at a
    real tie (the two logits made equal) is recorded as one tie, not raised."""
    from mtp2draft.evaluation.decode import LosslessError

    prompt, at = PROMPTS[0], 5
    runner = TargetRunner(ds_target)
    ref = greedy_reference(runner, prompt, 16, None)
    logits, _ = runner.forward(prompt + ref[:at], runner.start())
    top = logits[-1].topk(2)
    assert float(top.values[0] - top.values[1]) > 1e3 * tie_tolerance(torch.float32) * max(1, abs(top.values[0]))
    forced = ref[:at] + [int(top.indices[1])] + ref[at + 1 :]  # the target's second choice: no tie there
    assert _evaluate_one(runner, prompt, ref).lossless is True
    with pytest.raises(LosslessError, match=f"at generated token {at} of prompt 1 \\(no logit tie there\\)"):
        _evaluate_one(runner, prompt, forced)

    tied = TiedRunner(ds_target, len(prompt) + at)
    out = greedy_reference(tied, prompt, 16, None)
    logits, _ = tied.forward(prompt + out[:at], tied.start())
    first, second = logits[-1].topk(2).indices.tolist()
    assert logits[-1, first] == logits[-1, second] and out[at] == min(first, second)
    other = out[:at] + [max(first, second)] + out[at + 1 :]  # the other side of the tie
    result = _evaluate_one(tied, prompt, other)
    assert result.lossless is False and result.ties == 1


def _bootstrap_percentiles(a: list[list[int]], b: list[list[int]], levels: list[float]) -> tuple[list, float]:
    """The paired bootstrap from its definition, with numpy's own resampling (200,000 draws) and percentiles:
    resample prompts with replacement, the same for both drafts; pooled mean acceptance length = sum (a + 1) / steps
    on the resample; the level-L interval is the ((1 - L) / 2, (1 + L) / 2) quantiles of the difference.
    Returns ([(low, high) per level], the difference's bootstrap standard deviation)."""
    import numpy as np

    steps_a, sum_a = np.array([len(p) for p in a]), np.array([sum(x + 1 for x in p) for p in a])
    steps_b, sum_b = np.array([len(p) for p in b]), np.array([sum(x + 1 for x in p) for p in b])
    pick = np.random.default_rng(123).integers(0, len(a), size=(200_000, len(a)))
    diff = sum_a[pick].sum(1) / steps_a[pick].sum(1) - sum_b[pick].sum(1) / steps_b[pick].sum(1)
    bounds = [tuple(np.percentile(diff, [50 * (1 - lv), 50 * (1 + lv)])) for lv in levels]
    return bounds, float(diff.std())


def test_paired_bootstrap_bounds_are_the_percentiles_of_its_level() -> None:
    """The reported 95 % interval is the 2.5th and 97.5th percentiles of the resampled difference, against an
    independent bootstrap (numpy's generator and percentiles); level=0.9 gives the 5th and 95th. The tolerance,
    0.1 bootstrap standard deviations, is ~4 standard errors of a percentile estimated from 10,000 resamples
    (sqrt(0.025 * 0.975 / 10,000) / phi(1.96) = 0.027 sd), while a 90 % interval reported as 95 % moves each bound
    by (1.96 - 1.645) = 0.31 sd."""
    from mtp2draft.evaluation.compare import paired_bootstrap

    rng = random.Random(7)
    base = [[rng.choice([0, 0, 1, 2]) for _ in range(rng.randrange(4, 16))] for _ in range(14)]
    ft = [[min(x + rng.choice([0, 0, 1]), 2) for x in p] for p in base]  # better on some forwards, by chance
    (ref95, ref90), sd = _bootstrap_percentiles(ft, base, [0.95, 0.90])
    assert ref95[1] - ref90[1] > 0.25 * sd  # the data tell the two levels apart
    default = paired_bootstrap(_result("ft", ft, 2), _result("raw", base, 2), samples=10_000)
    ninety = paired_bootstrap(_result("ft", ft, 2), _result("raw", base, 2), samples=10_000, level=0.9)
    assert default["level"] == 0.95 and ninety["level"] == 0.9
    for report, (low, high) in ((default, ref95), (ninety, ref90)):
        d = report["difference"]["mean_acceptance_length"]
        assert d["low"] == pytest.approx(low, abs=0.1 * sd) and d["high"] == pytest.approx(high, abs=0.1 * sd)


@pytest.mark.parametrize("n", [2, 7, 10, 2000])
def test_bootstrap_percentiles_equal_numpys(n: int) -> None:
    """The interpolated percentiles the bounds are read at, against numpy's default (linear) percentile."""
    import numpy as np

    from mtp2draft.evaluation.compare import _percentiles

    values = sorted(random.Random(n).gauss(0, 1) for _ in range(n))
    for lo, hi in ((0.025, 0.975), (0.05, 0.95), (0.0, 1.0)):
        assert _percentiles(values, lo, hi) == pytest.approx(tuple(np.percentile(values, [100 * lo, 100 * hi])))


def test_bootstrap_compare_to_baselines_puts_the_first_draft_against_each_other() -> None:
    from mtp2draft.evaluation.compare import compare_to_baselines, paired_bootstrap

    rng = random.Random(3)
    a, b, c = ([[rng.choice([0, 1, 2]) for _ in range(6)] for _ in range(5)] for _ in range(3))
    got = compare_to_baselines([_result("a", a), _result("b", b), _result("c", c)], seed=4)
    assert [(g["draft"], g["baseline"]) for g in got] == [("a", "b"), ("a", "c")]
    assert got[1] == paired_bootstrap(_result("a", a), _result("c", c), seed=4)


def test_the_engine_clock_says_what_it_measures_and_that_it_is_no_serving_figure() -> None:
    """`evaluate --engine vllm`: tok/s and ms/token named for what they are, the caveat that a tiny target on a
    CPU measures nothing about serving, and why a baseline gets no paired interval there (vLLM counts totals)."""
    from mtp2draft.cli.output import _engine_clock

    clock = {"output_tokens_per_s": 1100.0, "tpot_ms": 3.5}
    report = {
        "num_prompts": 16,
        "results": [{"name": "draft", "clock": clock}, {"name": "baseline: raw", "clock": clock}],
        "engine": {"name": "vllm", "version": "0.32.0", "tensor_parallel_size": 1, "plain": clock},
    }
    text = _engine_clock(report)
    assert "tok/s = every request's output tokens over the pass's span (throughput)" in text
    assert "ms/token = each request's time between its first and last token" in text
    assert "measures the engine's overheads, nothing about serving a real model on a GPU" in text
    assert text.splitlines()[0].startswith("no paired interval: vLLM's counters are totals")
    report["comparison"] = [{}]
    assert "no paired interval" not in _engine_clock(report)
    assert _engine_clock({"results": []}) == ""  # the transformers path prints no clock
