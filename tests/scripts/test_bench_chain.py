"""scripts/bench_chain.py's later passes: each pass's set holds no record an earlier pass read, and its steps read
each record at most once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_chain  # noqa: E402
import wide_data  # noqa: E402


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


def test_pass_steps_read_each_record_once_up_to_the_recipe(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"text": str(i)}) + "\n" for i in range(100)))
    assert bench_chain.pass_steps(path) == 12  # 100 records: 12 batches of 8, none read twice
    path.write_text("".join(json.dumps({"text": str(i)}) + "\n" for i in range(8 * 1600)))
    assert bench_chain.pass_steps(path) == bench_chain.PASS_STEPS == 1500


def test_later_pass_sets_hold_nothing_an_earlier_pass_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    for name in ("alpha", "beta", "gamma", "delta", "eps"):  # 3 files a package, 40 kB: some 25 chunks each
        (site / name).mkdir(parents=True)
        for f in range(3):
            lines = [f"{name}_{f}_{i:04d} = compute('{name}', {i}, 'padding to a useful length')\n" for i in range(600)]
            (site / name / f"mod{f}.py").write_text("".join(lines))
    monkeypatch.setattr(wide_data, "seen_sources", lambda: (set(), set()))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps({"text": "in no record"}) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    # pass 1's set as --wide writes it (6 chunks a file; here a cap that takes one file a package: 30 records, of which
    # its pass reads 24), then passes 2 and 3 as later_pass_data writes them
    first = [str(site), "--out", str(work / "wide.jsonl"), "--per-file", "6", "--cap", "1", "--heldout", str(heldout)]
    assert wide_data.main(first) == 0
    assert len(_texts(work / "wide.jsonl")) == 30
    read = {}  # set -> the records its pass read: its first pass_steps x 8
    for n in (2, 3):
        earlier = work / ("wide.jsonl" if n == 2 else f"wide{n - 1}.jsonl")
        read[earlier.name] = _texts(earlier)[: bench_chain.pass_steps(earlier) * bench_chain.BATCH]
        assert read[earlier.name]
        assert wide_data.main([*bench_chain.later_pass_args(site, work, n), "--heldout", str(heldout)]) == 0
        new = _texts(work / f"wide{n}.jsonl")
        assert len(new) >= 8
        assert not set(new) & {t for texts in read.values() for t in texts}  # nothing any earlier pass read
        # what the last pass left unread stays, less what the sets before it held (excluded whole)
        before = [work / "wide.jsonl", *[work / f"wide{j}.jsonl" for j in range(2, n)]][: n - 2]
        left = set(_texts(earlier)[len(read[earlier.name]) :]) - {t for p in before for t in _texts(p)}
        assert left and left <= set(new)
    assert not set(_texts(work / "wide3.jsonl")) & set(_texts(work / "wide.jsonl"))  # pass 1's set, whole, is out


def test_resample_starts_from_the_last_passs_drafts_on_copies_of_the_domain(tmp_path: Path) -> None:
    assert bench_chain.last_pass({"wide", "sharpen"}) == 1
    assert bench_chain.last_pass({"sharpen", "pass2", "pass3", "pass4", "resample"}) == 4
    runs = bench_chain.resample_runs(4, {"resample"})
    assert runs == [
        ("resample-chain", "pass4-chain", []),
        ("resample-first", "pass4-first", ["--serving-engine", "vllm"]),
    ]
    assert [start for _, start, _ in bench_chain.resample_runs(1, {"resample"})] == ["wide-chain-t05", "wide-first-t05"]
    (tmp_path / "domain.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    out = bench_chain.resample_data(tmp_path, tmp_path)
    assert _texts(out) == ["a", "b"] * bench_chain.RESAMPLE_COPIES


def test_later_resample_rounds_go_on_from_the_round_before_under_another_seed() -> None:
    runs = bench_chain.resample_runs(4, {"resample", "resample-chain2", "resample-chain3", "resample-first2"})
    assert runs[2:] == [
        ("resample2-chain", "resample-chain", ["--seed", "1"]),
        ("resample2-first", "resample-first", ["--serving-engine", "vllm", "--seed", "1"]),
        ("resample3-chain", "resample2-chain", ["--seed", "2"]),
    ]
    for name, start, opts in runs:  # a draft for vLLM's rule stays one, from round 1 on
        assert name.endswith("-first") == start.endswith("-first") == ("--serving-engine" in opts)
    seeds = [opts[opts.index("--seed") + 1] for name, _, opts in runs if name.endswith("-chain") and "--seed" in opts]
    assert seeds == ["1", "2"]  # round 1 ran at distill's default seed, 0: each round samples anew


def test_every_resample_evaluation_puts_its_new_draft_first_beside_what_it_came_from() -> None:
    extras = {"resample", *[f"resample-{way}{r}" for way in ("chain", "first") for r in (2, 3, 4)]}
    runs = {name: start for name, start, _ in bench_chain.resample_runs(4, extras)}
    assert len(runs) == 8
    evaluations = bench_chain.resample_evaluations(4)
    tags = [tag for _, tag, _ in evaluations]
    assert len(set(tags)) == len(tags)  # one file each
    for _, _, names in evaluations:
        if names[0] in runs:
            assert runs[names[0]] in names[1:]  # the gain over the draft it started from is measured
    for extra, suffix, names, _, columns in bench_chain.resample_tables(4):
        assert (extra, suffix, names) in evaluations
        assert all(c in names for col in columns for c in ([col] if isinstance(col, str) else col))
    assert all(names[0] in runs for _, _, names in evaluations)  # every run is evaluated
    served = {draft for _, _, draft in bench_chain.SERVED}
    assert {name for name in runs if name.endswith("-first")} <= served  # each draft for vLLM's rule is served
    assert len({tag for _, tag, _ in bench_chain.SERVED}) == len(bench_chain.SERVED)


def _draft(path: Path, tensors: dict, config: str = '{"a": 1}\n') -> Path:
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(config)
    (path / "provenance.json").write_text(json.dumps({"spec": "mimo", "distill": {"steps": 3}}))
    save_file(tensors, path / "model.safetensors")
    return path


def test_average_drafts_takes_each_tensors_mean_and_names_its_sources(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    a = _draft(tmp_path / "a", {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])})
    b = _draft(tmp_path / "b", {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([1.5])})
    bench_chain.average_drafts(tmp_path / "m", [a, b])
    mean = load_file(tmp_path / "m" / "model.safetensors")
    assert mean["w"].tolist() == [2.0, 4.0] and mean["b"].tolist() == [1.0] and mean["w"].dtype == torch.float32
    provenance = json.loads((tmp_path / "m" / "provenance.json").read_text())
    assert provenance["average_of"] == [str(a), str(b)] and "distill" not in provenance  # not one distill's record
    assert (tmp_path / "m" / "config.json").read_text() == '{"a": 1}\n'
    other = _draft(tmp_path / "c", {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}, '{"a": 2}\n')
    with pytest.raises(SystemExit, match="differ in config.json"):
        bench_chain.average_drafts(tmp_path / "n", [a, other])
    wrong = _draft(tmp_path / "d", {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([0.5])})
    with pytest.raises(SystemExit, match="tensor names or shapes"):
        bench_chain.average_drafts(tmp_path / "n", [a, wrong])
    assert not (tmp_path / "n").exists()  # nothing written on a refusal


def test_average_runs_from_the_rounds_mean_and_soups_the_whole_line() -> None:
    extras = {"resample", "resample-chain2", "resample-chain3", "resample-first2", "average"}
    chain = bench_chain.average_sources(4, "chain", extras)
    assert chain == {
        "mean-chain": ["resample-chain", "resample2-chain", "resample3-chain"],
        "soup-chain": ["pass4-chain", "resample-chain", "resample2-chain", "resample3-chain", "weighted-chain"],
    }
    assert bench_chain.average_sources(4, "first", extras)["mean-first"] == ["resample-first", "resample2-first"]
    for way in ("chain", "first"):
        _, suffix, names = bench_chain.average_evaluation(way)
        assert names[:4] == (f"soup-{way}", "raw-chain" if way == "chain" else "raw-first", f"weighted-{way}",
                             f"mean-{way}")  # fmt: skip
        assert suffix not in {s for _, s, _ in bench_chain.resample_evaluations(4)}  # a file of its own
    for extra, suffix, names, _, columns in bench_chain.average_tables():
        assert extra == "average" and (extra, suffix, names) in map(bench_chain.average_evaluation, ("chain", "first"))
        assert all(c in names for col in columns for c in ([col] if isinstance(col, str) else col))
    served = {draft for extra, _, draft in bench_chain.SERVED if extra == "average"}
    assert served == {"weighted-first", "soup-first"}
    steps = bench_chain.WEIGHTED[bench_chain.WEIGHTED.index("--step-weights") + 1]
    assert [float(w) for w in steps.split(",")] == sorted((float(w) for w in steps.split(",")), reverse=True)
