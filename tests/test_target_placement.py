"""Where and in what dtype the frozen target runs (`--device`, `--dtype`, `--device-map` of evaluate and distill's
online target): a bf16 evaluate of a bundled target stays lossless under the bf16 tie tolerance, the tolerance is
the derived one, a device this machine lacks is one `error:` line, and the CUDA path (marked gpu) is lossless."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.dtypes import DTYPE_NAMES
from mtp2draft.evaluation.decode import TIE_ULPS, tie_tolerance, top_two_tie

ROOT = Path(__file__).resolve().parents[1]
TINY_MIMO = ROOT / "examples" / "targets" / "tiny-mimo"
HELDOUT = ROOT / "examples" / "data" / "heldout.jsonl"


@pytest.fixture(scope="module")
def raw_mimo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The raw draft `mtp2draft convert` makes of the bundled tiny-mimo target (fp32 weights)."""
    out = tmp_path_factory.mktemp("placement") / "raw"
    convert(str(TINY_MIMO), out, dtype="float32")
    return out


def _lossless(report: dict) -> bool:
    """Every output equal to the target's greedy one, or diverging only at a tie of its top two logits within the
    dtype's tolerance (a mismatch anywhere else raises LosslessError: evaluate fails)."""
    return report["lossless"] is True or all(r["ties"] > 0 for r in report["results"] if not r["lossless"])


def _evaluate(capsys, draft: Path, *options: str) -> tuple[int, dict | None, str]:
    args = ["evaluate", str(draft), "--target", str(TINY_MIMO), "--data", str(HELDOUT), "--max-prompts", "6"]
    code = main([*args, "--max-new-tokens", "32", "-k", "3", "--json", *options])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_tie_tolerance_is_a_few_ulps_of_the_dtype() -> None:
    assert TIE_ULPS == 4
    assert tie_tolerance(torch.bfloat16) == 4 * 2**-7
    assert tie_tolerance(torch.float16) == 4 * 2**-10
    assert tie_tolerance(torch.float32) == 4 * 2**-23
    assert tie_tolerance(torch.float32) < 1e-4 < tie_tolerance(torch.bfloat16)  # the old fixed 1e-4 fits neither


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tie_is_judged_in_the_targets_dtype(dtype: torch.dtype) -> None:
    """Top logit 10: a gap of 3 ulps (relative) is a tie, one of 5 is not, in bf16 and in fp32 alike."""
    eps = torch.finfo(dtype).eps

    def runner(gap_ulps: float):
        logits = torch.tensor([[0.0, 10.0, 10.0 - gap_ulps * eps * 10.0, 1.0]], dtype=torch.float64)
        return SimpleNamespace(target=SimpleNamespace(dtype=dtype), start=lambda: None, forward=lambda *_: (logits, 0))

    assert top_two_tie(runner(3), [1, 2], [3], 0)
    assert not top_two_tie(runner(5), [1, 2], [3], 0)


@pytest.mark.slow
def test_bf16_evaluate_of_a_bundled_target_is_lossless(raw_mimo: Path, capsys) -> None:
    """The target in bf16 on the CPU, the fp32 raw draft cast to follow it: lossless, with the bf16 tolerance."""
    code, report, err = _evaluate(capsys, raw_mimo, "--device", "cpu", "--dtype", "bfloat16")
    assert code == 0, err
    assert _lossless(report) and report["dtype"] == "bfloat16" and report["device"] == "cpu"
    assert report["tie_tolerance"] == tie_tolerance(torch.bfloat16) == 4 * 2**-7
    steps = [a for prompt in report["results"][0]["accepted_by_prompt"] for a in prompt]
    assert report["results"][0]["target_forwards"] == len(steps) > 0
    assert report["mean_acceptance_length"] == pytest.approx(sum(a + 1 for a in steps) / len(steps), abs=1e-3)


@pytest.mark.parametrize(
    "options, says",
    [
        (["--device", "foo"], "error: --device 'foo': not a device torch knows"),
        (["--device", "cuda"], "error: --device cuda: this machine has no cuda device"),
        (["--dtype", "float64"], "error: --dtype must be one of " + ", ".join(DTYPE_NAMES)),
    ],
)
def test_a_device_or_dtype_this_machine_lacks_is_one_error_line(raw_mimo: Path, capsys, options, says) -> None:
    if "cuda" in options and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    code, _, err = _evaluate(capsys, raw_mimo, *options)
    assert code == 2 and err.startswith(says) and err.count("\n") == 1 and "Traceback" not in err


def test_distill_refuses_a_missing_device_in_one_line(raw_mimo: Path, tmp_path: Path, capsys) -> None:
    code = main(["distill", str(raw_mimo), "--target", str(TINY_MIMO), "--data", str(HELDOUT), "--out",
                 str(tmp_path / "o"), "--device", "foo"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and err == "error: --device 'foo': not a device torch knows (cpu, cuda, cuda:N, mps, ...)\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is not None, reason="accelerate is installed here")
def test_device_map_without_accelerate_is_one_error_line(raw_mimo: Path, capsys) -> None:
    code, _, err = _evaluate(capsys, raw_mimo, "--device-map", "auto")
    assert code == 2 and err.startswith("error: --device-map auto: ") and "accelerate" in err
    assert err.count("\n") == 1


def test_online_teacher_runs_the_target_in_its_dtype_and_hands_fp32_features(raw_mimo: Path) -> None:
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.settings import Placement
    from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData
    from mtp2draft.train.teacher import online_teacher

    draft = load_draft(raw_mimo)
    job = DistillJob(draft_dir=raw_mimo, out=raw_mimo.parent / "unused", target=str(TINY_MIMO),
                     data=TrainingData(data=HELDOUT), config=DistillConfig(max_length=32),
                     where=Placement(dtype="bfloat16"))  # fmt: skip
    teacher = online_teacher(draft, job, "cpu")
    assert teacher.target.dtype == torch.bfloat16 and next(teacher.target.model.parameters()).dtype == torch.bfloat16
    batch, feats = teacher.batch(draft, 0, 2, 0, 32, slice(None), "cpu", final=True)
    assert feats.final.dtype == torch.float32 and feats.logits.dtype == torch.float32
    assert feats.final.shape[:2] == batch["input_ids"].shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_evaluate_on_cuda_is_lossless(raw_mimo: Path, capsys, dtype: str) -> None:
    code, report, err = _evaluate(capsys, raw_mimo, "--device", "cuda", "--dtype", dtype)
    assert code == 0, err
    assert _lossless(report) and report["device"].startswith("cuda") and report["dtype"] == dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="--device-map needs accelerate")
def test_evaluate_with_a_device_map_is_lossless(raw_mimo: Path, capsys) -> None:
    code, report, err = _evaluate(capsys, raw_mimo, "--device-map", "auto", "--dtype", "bfloat16")
    assert code == 0, err
    assert _lossless(report) and report["device"] == "device_map=auto"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_distill_on_cuda_with_a_bf16_online_target(raw_mimo: Path, tmp_path: Path, capsys) -> None:
    code = main(["distill", str(raw_mimo), "--target", str(TINY_MIMO), "--data", str(HELDOUT), "--out",
                 str(tmp_path / "ft"), "--device", "cuda", "--dtype", "bfloat16", "--steps", "3", "--batch-size", "2",
                 "--max-length", "64", "--save-every", "100"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    settings = json.loads((tmp_path / "ft" / "provenance.json").read_text())["distill"]["settings"]
    assert settings["target_dtype"] == "bfloat16" and settings["precision"] == "bf16"
