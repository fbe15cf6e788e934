"""The whole DSpark path on the bundled DSpark target (examples/targets/tiny-deepseek-v4-dspark: tiny-deepseek-v4's
trunk with a DSpark drafter trained post hoc under `mtp.*`, DeepSeek-V4-Flash-0731's layout; scripts/dspark_target.py):
inspect finds the drafter, convert reads it exactly, evaluate drafts blocks against the release losslessly and saves
target forwards, distill fine-tunes the stages, export writes them back into the release's layout and validate reads
the overlay as the release's loader does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mtp2draft.cli.app import main

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "examples" / "targets" / "tiny-deepseek-v4-dspark"
HELDOUT = REPO / "examples" / "data" / "heldout.jsonl"
TRAIN = REPO / "examples" / "data" / "train.jsonl"


def _run(argv: list, capsys) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _shipped() -> dict[str, torch.Tensor]:
    index = json.loads((TARGET / "model.safetensors.index.json").read_text())
    out = {}
    for name, file in index["weight_map"].items():
        if name.startswith("mtp."):
            with safe_open(str(TARGET / file), framework="pt") as fh:
                out[name] = fh.get_tensor(name)
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundled-dspark") / "dspark"
    assert main(["convert", str(TARGET), "--out", str(out), "--dtype", "float32"]) == 0
    return out


def test_the_bundled_target_ships_dspark_stages_and_no_mtp_layer(capsys) -> None:
    config = json.loads((TARGET / "config.json").read_text())
    shipped = _shipped()
    assert config["dspark_block_size"] == 4 and config["dspark_target_layer_ids"] == [1, 2, 3]
    assert {k.split(".")[1] for k in shipped} == {"0", "1"}
    assert not any(k.endswith(("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight")) for k in shipped)
    out = _run(["inspect", TARGET], capsys)
    assert "stage 0:" in out and "stage 1:" in out and "stage 2:" not in out


def test_convert_reads_the_stages_exactly(converted: Path) -> None:
    got, shipped = load_file(str(converted / "model.safetensors")), _shipped()
    assert set(got) == set(shipped)
    assert all(torch.equal(got[k].to(v.dtype), v) and got[k].dtype == torch.float32 for k, v in shipped.items())


def test_evaluate_is_lossless_and_the_shipped_drafter_saves_target_forwards(converted: Path, capsys) -> None:
    """Greedy block drafting against the release: its output is the target's own greedy output, acceptance is
    reported per slot, and the trained drafter's accepted tokens cut the target forwards below plain decoding's (a
    drafter whose proposals are never accepted costs one forward per token, as plain greedy does)."""
    argv = ["evaluate", converted, "--target", TARGET, "--data", HELDOUT, "--max-prompts", "4",
            "--max-new-tokens", "32", "--json"]  # fmt: skip
    report = json.loads(_run(argv, capsys))
    draft = report["results"][0]
    assert report["lossless"] is True and draft["lossless"] is True
    assert len(draft["acceptance_per_position"]) == 4 and draft["acceptance_per_position"][0] > 0
    assert draft["forwards"]["speculative"] < draft["forwards"]["plain_greedy"]
    assert draft["mean_acceptance_length"] > 1


def test_distill_then_export_stitched_is_the_release_s_layout(converted: Path, tmp_path: Path, capsys) -> None:
    tuned, overlay = tmp_path / "tuned", tmp_path / "overlay"
    argv = ["distill", converted, "--target", TARGET, "--data", TRAIN, "--out", tuned, "--steps", "2",
            "--batch-size", "2", "--max-length", "64", "--anchors", "16", "--lr", "1e-3"]  # fmt: skip
    _run(argv, capsys)
    before, after = load_file(str(converted / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    assert set(before) == set(after) and any(not torch.equal(before[k], after[k]) for k in before)
    _run(["export", tuned, "--format", "stitched", "--target", TARGET, "--out", overlay], capsys)
    shipped = _shipped()
    index = json.loads((overlay / "model.safetensors.index.json").read_text())
    written = {}
    for file in sorted({index["weight_map"][k] for k in shipped}):
        written |= {k: v for k, v in load_file(str(overlay / file)).items() if k.startswith("mtp.")}
    # the release's names and dtypes, the fine-tuned values (rounded to them)
    assert {k: (v.dtype, v.shape) for k, v in written.items()} == {k: (v.dtype, v.shape) for k, v in shipped.items()}
    assert all(torch.equal(written[k], after[k].to(v.dtype)) for k, v in shipped.items())
    out = _run(["validate", overlay, "--json"], capsys)
    assert json.loads(out)["ok"] is True
