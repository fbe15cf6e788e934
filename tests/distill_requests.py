"""The distill request the training tests make most: a draft converted under `tmp_path` (`raw` unless named),
trained online against a tiny target on a JSONL file. One helper for the tests that distill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtp2draft.train.settings import DistillJob, TrainingData


def online(
    tmp_path: Path, target: Path, out: str, data: Path, heldout: Path | None = None, draft: str = "raw", **parts: Any
) -> DistillJob:
    """`DistillJob` from `tmp_path / draft` into `tmp_path / out`; `parts` are its other fields (config, resume...)."""
    return DistillJob(
        draft_dir=tmp_path / draft, out=tmp_path / out, target=str(target),
        data=TrainingData(data=data, heldout=heldout), **parts,
    )  # fmt: skip
