"""scripts/bench_gpu.sh, the prepared GPU check: its time caps fit the device run (a 60-second smoke run first, at
most 5 minutes in all), and its dry mode goes end to end on the CPU with tiny sizes, writing the summary the GPU run
would (at most 8 files under $OUT, nothing left in scratch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.sh"


def test_the_gpu_run_fits_five_minutes_with_a_one_minute_smoke_run_first() -> None:
    text = SCRIPT.read_text()
    steps = re.findall(r"^\s*(?:if )?step ([\w-]+) (\d+) ", text, re.M)
    assert steps[0] == ("smoke", "60")
    assert re.search(r"BUDGET=\$\{BENCH_GPU_BUDGET:-\$\(\(300 \* SCALE\)\)\}", text)  # every step within the budget
    assert "SCALE=1\n" in text and "timeout -k 5" in text
    assert {name for name, _ in steps} >= {"smoke", "evaluate", "gpu-tests", "distill-eager", "distill"}
    assert [name for name, _ in steps][-1] == "distill" and '"${COMMON[@]}" --compile' in text  # compiled, last


@pytest.mark.slow
def test_dry_run_goes_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT), "--dry"], env=env, capture_output=True, text=True, timeout=1800)
    log = (out / "bench.log").read_text() if (out / "bench.log").is_file() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True and summary["dry"] is True
    assert list(summary["steps"]) == ["smoke", "convert", "evaluate", "gpu-tests", "distill-eager"]  # no compile
    d = summary["distill_eager"]
    assert (d["draft"], d["train_subset"], d["precision"]) == ("mtp", "no-routed-experts", "bf16")
    assert d["tokens_per_s"] > 0 and 0 < d["trainable_params"] < d["parameters"]
    assert d["plan_total_bytes"] == sum(d["plan_bytes"].values()) > 0 and d["measured_peak_bytes"] is None  # CPU
    ev = summary["evaluate"]
    # lossless, or diverging only at bf16 ties of the top two logits (counted; any other difference fails evaluate)
    assert ev["lossless"] is True or (ev["lossless"] is False and ev["ties"] > 0)
    assert (ev["device"], ev["dtype"], ev["tie_tolerance"]) == ("cpu", "bfloat16", 4 * 2**-7)
    assert "skipped" in summary["gpu_tests"] and "failed" not in summary["gpu_tests"]  # no CUDA here
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.log", "distill-eager.json", "evaluate.json", "smoke.json", "summary.json", "summary.md"]
