"""From the wheel, as a user installs it (marker `engine`): `pip install mtp2draft-*.whl` into a fresh venv, then
`mtp2draft engine install vllm` and `mtp2draft convert` + `mtp2draft evaluate --engine vllm` on a bundled target,
all run by the installed console script, none of it by this checkout's code.

`engine install` reuses the venv the engine tests use ($MTP2DRAFT_VLLM_VENV or the default; CI builds it first): a
complete venv with the same pins is reused, which is what it promises. Without one the test skips, except under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "examples" / "targets" / "tiny-mimo"
HELDOUT = ROOT / "examples" / "data" / "heldout.jsonl"
K = 2


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-4000:])
    return done


@pytest.fixture(scope="module")
def installed(vllm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The console script of the wheel, installed with its dependencies into a fresh venv (torch: the CPU wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp), str(ROOT)])
    (wheel,) = tmp.glob("mtp2draft-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "torch==2.13.0"])  # the CPU wheel first, so the wheel's `torch>=2.6` is met without a CUDA build
    _run([*pip, str(wheel), "torch==2.13.0"])
    return venv / "bin" / "mtp2draft"


def test_engine_install_then_evaluate_in_vllm_from_the_wheel(installed: Path, vllm: Path, tmp_path: Path) -> None:
    env = {**os.environ, "MTP2DRAFT_VLLM_VENV": str(vllm.parents[1])}
    env.pop("PYTHONPATH", None)  # nothing of this checkout on the path: the wheel's own modules only
    python = _run([str(installed), "engine", "install", "vllm", "--platform", "cpu"], env=env, cwd=tmp_path)
    assert Path(python.stdout.strip()) == vllm  # complete with the same pins: reused, not rebuilt
    draft = tmp_path / "raw"
    _run([str(installed), "convert", str(TARGET), "--out", str(draft)], env=env, cwd=tmp_path)
    args = [str(installed), "evaluate", str(draft), "--target", str(TARGET), "--data", str(HELDOUT), "--engine", "vllm"]
    args += ["-k", str(K), "--max-new-tokens", "16", "--max-prompts", "2", "--max-prompt-length", "64", "--json"]
    report = json.loads(_run(args, env=env, cwd=tmp_path).stdout)
    assert report["engine"]["name"] == "vllm" and report["num_prompts"] == 2 and report["lossless"] is True
    assert len(report["acceptance_per_position"]) == K
    where = _run(
        [str(installed.with_name("python")), "-c", "import mtp2draft; print(mtp2draft.__file__)"], env=env, cwd=tmp_path
    )
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout
