"""scripts/bench_unseen.py's data: named, deterministic, and prompts never drawn from a training file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_unseen.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_unseen", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unseen_data_is_deterministic_and_prompts_are_disjoint_from_training(tmp_path: Path) -> None:
    mod = _module()
    info = mod.build_data(tmp_path / "a")
    mod.build_data(tmp_path / "b")
    for name in ("train.jsonl", "prompts.jsonl", "data.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert info["source"].startswith("huggingface_hub ")
    assert 0 < info["prompt_files"] < info["files"] and info["train_records"] > 0 and info["prompts"] > 0
    train = [json.loads(line)["text"] for line in (tmp_path / "a" / "train.jsonl").read_text().splitlines()]
    prompts = [json.loads(line)["text"] for line in (tmp_path / "a" / "prompts.jsonl").read_text().splitlines()]
    corpus = "\n".join(train)
    # a prompt chunk is whole lines of a prompt file: found verbatim in the training text only if a file leaked
    # (short, boilerplate-only chunks could repeat across files; every chunk here is 400+ characters)
    leaked = [p for p in prompts if p in corpus]
    assert len(leaked) <= len(prompts) // 20, f"{len(leaked)} of {len(prompts)} prompts occur verbatim in training"


def _curves():
    spec = importlib.util.spec_from_file_location("bench_curves", SCRIPT.parent / "bench_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_row_is_a_valid_distill_config() -> None:
    mod = _module()
    for name, (_label, start, steps, extra) in mod.ROWS.items():
        if steps is not None:
            mod.DistillConfig(**{**mod.BASE, "steps": steps, **extra})  # raises on e.g. a wrong step-weight count
        assert start in ("mtp", "eagle3", "eagle3-random", "eagle3-oracle", "eagle3-deep"), name


def test_time_to_90_percent_is_the_first_measured_step_reaching_it() -> None:
    mod = _curves()
    curve = {0: 1.0, 30: 1.8, 60: 2.6, 120: 2.5, 240: 3.0}
    seconds = {0: 0.0, 30: 25.0, 60: 50.0, 120: 100.0, 240: 200.0}
    # 90 % of 3.0 is 2.7: only the final point reaches it (60's 2.6 is under it, 120's 2.5 dips back)
    assert mod.first_reaching(curve, seconds, gain=False) == {"goal": 2.7, "step": 240, "seconds": 200.0}
    # 1 + 90 % of the gain 2.0 is 2.8: likewise; with a higher step 60 it would be 60
    assert mod.first_reaching({**curve, 60: 2.8}, seconds, gain=True) == {"goal": 2.8, "step": 60, "seconds": 50.0}
    assert mod.first_reaching({**curve, 30: 2.75}, seconds, gain=False)["step"] == 30
