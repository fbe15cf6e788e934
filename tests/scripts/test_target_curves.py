"""scripts/target_curves.py on the bundled targets' training.json, and train_target.py's phase table (--extend)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extrapolation_is_past_the_run_where_the_bar_is_not_reached() -> None:
    curves = _script("target_curves")
    for name in ("tiny-deepseek-v3", "tiny-mimo"):
        report = json.loads((ROOT / "examples" / "targets" / name / "training.json").read_text())
        res = curves.analyse(report, 0.40)
        assert res["fit_points"] >= 3 and res["fit"]["per_ln_token"] > 0  # still improving when training stopped
        if report["next_token_top1"] < 0.40:
            assert res["bar"]["tokens"] > report["tokens_seen"] and res["bar"]["cpu_hours"] > res["cpu_minutes"] / 60
        else:
            assert "bar" not in res


def test_extend_appends_warm_restarts_after_the_planned_phases() -> None:
    train = _script("train_target")
    args = argparse.Namespace(steps=100, lr=3e-3, mtp_only_steps=20, mtp_lr=1e-3, extensions=[])
    assert train.phases(args) == [("joint", 0, 100, 3e-3), ("mtp_only", 100, 20, 1e-3)]
    args.extensions = [{"steps": 50, "mtp_only_steps": 0, "lr": 1e-3}, {"steps": 10, "mtp_only_steps": 5, "lr": 5e-4}]
    assert train.phases(args) == [
        ("joint", 0, 100, 3e-3), ("mtp_only", 100, 20, 1e-3), ("joint", 120, 50, 1e-3),
        ("joint", 170, 10, 5e-4), ("mtp_only", 180, 5, 1e-3),
    ]  # fmt: skip
