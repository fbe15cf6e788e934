"""distill under torchrun (CPU, gloo): the result does not depend on the number of ranks, and a run killed with
SIGKILL on one rank resumes, on 2 ranks or on 1, to the weights of the uninterrupted run.

Tolerance (TOL): the ranks compute the same sums in another order (each rank sums its rows, then the reduce-scatter
adds the shards), so gradients differ by fp32 rounding (~1e-7 relative). Two measures, both relative to how far
the 10 steps moved the draft, so that a draft that did not train fails:
- weights: ||a - b|| / ||a - raw|| over all tensors together. Not per tensor: a parameter whose exact gradient is
  zero (a key bias, to which softmax is invariant) gets pure rounding noise as gradient, which AdamW normalises to
  steps of size ~lr in a run-dependent direction: it differs at the 1e-3 level between any two summation orders
  while having no effect on what the draft computes;
- function: the draft's logits over 3 TTT steps on held-out text, ||a - b|| / ||a - raw||.
Measured here: weights 1.8e-5, logits 8.7e-7 (printed with -s); TOL = 1e-4 leaves a 5x margin on the weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mtp2draft.conversion import convert

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "targets" / "tiny-mimo"
DATA = ROOT / "examples" / "data" / "train.jsonl"
TOL = 1e-4  # max |a - b| / max |a - raw| per tensor; see the module docstring
ARGS = ["--steps", "10", "--batch-size", "4", "--max-length", "64", "--save-every", "5", "--lr", "1e-3"]
ARGS += ["--ttt-steps", "3", "--device", "cpu"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(**env), timeout=600)


def _torchrun(n: int, script: list[str], *args: str, **env: str) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    return _run([*launcher, *script, "distill", *args], **env)


def _one(*args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "mtp2draft", "distill", *args])


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def heldout():
    """The target's features for 8 held-out sequences, and a function from a draft directory to its TTT logits."""
    from mtp2draft.data import load_tokenizer, read_examples
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.target.hidden import TargetModel
    from mtp2draft.train.teacher import collate
    from mtp2draft.train.ttt import ttt_logits

    tm = TargetModel(str(TARGET))
    examples, _ = read_examples(ROOT / "examples" / "data" / "heldout.jsonl", load_tokenizer(tm.path), 64)
    batch = collate(examples[:8], 0)
    feats = tm.features(batch["input_ids"], batch["attention_mask"], want_final=True)
    keep = batch["attention_mask"].bool()

    def logits(path: Path) -> torch.Tensor:
        draft = load_draft(path).attach_target(tm.embedding(), tm.lm_head()).eval()
        with torch.no_grad():
            out = ttt_logits(draft, feats, batch["input_ids"], 3)
        return torch.stack(out)[:, keep]  # [K, tokens, V]

    return logits


def _assert_close(a: Path, b: Path, raw: Path, logits) -> tuple[float, float]:
    wa, wb, w0 = _weights(a), _weights(b), _weights(raw)
    assert wa.keys() == wb.keys()
    diff = moved = 0.0
    for key in wa:
        if not wa[key].is_floating_point():
            assert torch.equal(wa[key], wb[key]), key
            continue
        diff += (wa[key] - wb[key]).double().pow(2).sum().item()
        moved += (wa[key] - w0[key]).double().pow(2).sum().item()
    weights = (diff / moved) ** 0.5
    la, lb, l0 = logits(a), logits(b), logits(raw)
    function = ((la - lb).norm() / (la - l0).norm()).item()
    assert moved > 0 and (la - l0).norm() > 0, "the draft did not train"
    assert weights <= TOL and function <= TOL, (weights, function)
    return weights, function


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("parallel")
    convert(str(TARGET), work / "raw", dtype="float32")  # fp32 weights on disk: the comparison is not bf16-rounded
    common = [str(work / "raw"), "--target", str(TARGET), "--data", str(DATA), *ARGS]
    out = {"raw": work / "raw"}
    one = _one(*common, "--out", str(work / "one"))
    assert one.returncode == 0, one.stderr
    two = _torchrun(2, ["-m", "mtp2draft"], *common, "--out", str(work / "two"))
    assert two.returncode == 0, two.stderr
    assert "FSDP2 over 2 rank(s)" in two.stderr
    out.update(one=work / "one", two=work / "two")
    # kill -9 rank 0 (the one that writes) right after the step-5 checkpoint, twice: resume on 2 ranks and on 1
    killer = [str(ROOT / "tests" / "kill_rank_after_checkpoint.py")]
    for name in ("killed2", "killed1"):
        dead = _torchrun(2, killer, *common, "--out", str(work / name), KILL_AFTER_STEP="5", KILL_RANK="0")
        assert dead.returncode != 0 and not (work / name).exists(), dead.stderr
        assert (work / f"{name}.checkpoints" / "step-0000005" / "state.json").is_file()
    resumed2 = _torchrun(2, ["-m", "mtp2draft"], *common, "--out", str(work / "killed2"), "--resume")
    assert resumed2.returncode == 0, resumed2.stderr
    assert "resuming from step-0000005" in resumed2.stderr
    resumed1 = _one(*common, "--out", str(work / "killed1"), "--resume")
    assert resumed1.returncode == 0, resumed1.stderr
    assert "resuming from step-0000005" in resumed1.stderr
    out.update(resumed2=work / "killed2", resumed1=work / "killed1")
    return out


@pytest.mark.slow
def test_two_ranks_equal_one_rank(runs: dict[str, Path], heldout) -> None:
    weights, function = _assert_close(runs["one"], runs["two"], runs["raw"], heldout)
    print(f"2 ranks vs 1 rank: weights {weights:.1e}, logits {function:.1e} (relative to the training change)")


@pytest.mark.slow
@pytest.mark.parametrize("resumed", ["resumed2", "resumed1"])
def test_kill9_then_resume_on_any_world_size(runs: dict[str, Path], resumed: str, heldout) -> None:
    for ref in ("two", "one"):
        weights, function = _assert_close(runs[ref], runs[resumed], runs["raw"], heldout)
        print(f"{resumed} vs uninterrupted {ref}: weights {weights:.1e}, logits {function:.1e}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_on_cuda_trains_and_writes_fp32_master_weights(tmp_path: Path) -> None:
    """One process on CUDA: bf16 autocast by default, the written draft moved and is finite."""
    convert(str(TARGET), tmp_path / "raw", dtype="float32")
    common = [str(tmp_path / "raw"), "--target", str(TARGET), "--data", str(DATA), *ARGS[:-2]]
    done = _one(*common, "--device", "cuda", "--out", str(tmp_path / "ft"))
    assert done.returncode == 0, done.stderr
    assert "bf16" in done.stderr
    a, raw = _weights(tmp_path / "ft"), _weights(tmp_path / "raw")
    assert all(torch.isfinite(v.float()).all() for v in a.values())
    assert not torch.equal(a["eh_proj.weight"], raw["eh_proj.weight"])


def test_rank_rows_split_the_global_batch() -> None:
    from mtp2draft.train.parallel import Parallel

    for world in (1, 2, 3, 4):
        rows = [Parallel(rank=r, world=world).rows(10) for r in range(world)]
        assert sum((list(range(10))[s] for s in rows), []) == list(range(10))


def test_shard_units_cover_the_experts_first(build, tmp_path: Path) -> None:
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.train.parallel import shard_units

    convert(str(build("deepseek_v3")), tmp_path / "d", dtype="float32")
    units = shard_units(load_draft(tmp_path / "d"))
    assert units and units[0].endswith("mlp.experts")  # innermost first: the fused routed experts are one unit
