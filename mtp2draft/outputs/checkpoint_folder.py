"""A distill run's checkpoint folder (`<out>.checkpoints`, or --checkpoint-dir): marked as one the moment it exists,
told apart from a draft mtp2draft wrote there (which a run must never fill with checkpoints nor delete), and emptied
of what the run wrote when it finishes.

What this module does not do: write or read the checkpoints themselves (`train/state.py`, `train/parallel.py`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path

from mtp2draft.errors import OutputExistsError
from mtp2draft.manifest import CHECKPOINT_ENTRY, CHECKPOINTS_MARKER, MARKER, is_ours, mark
from mtp2draft.outputs.directories import check_output_dir, check_outside_inputs

# A distill run's checkpoint folder (`<out>.checkpoints`, or --checkpoint-dir) carries CHECKPOINTS_MARKER as well: it
# tells the folder apart from a draft mtp2draft wrote there (`convert --out foo.checkpoints`), which a later
# `distill --out foo` must never fill with checkpoints nor delete when it finishes.
_OLD_BEST_FILES = {"best.json", "best.json.tmp", "model.safetensors"}


def is_checkpoint_folder(folder: Path) -> bool:
    """Whether `folder` is a distill run's checkpoint folder: it carries `CHECKPOINTS_MARKER`; or, written by an older
    mtp2draft, every entry is one a run writes there and it carries `MARKER`, or it only holds the `best/` that older
    runs killed before their first checkpoint left unmarked."""
    if (folder / CHECKPOINTS_MARKER).is_file():
        return True
    entries = list(folder.iterdir())
    if not all(CHECKPOINT_ENTRY.match(p.name) for p in entries):
        return False
    if is_ours(folder):
        return True
    return [p.name for p in entries] == ["best"] and all(p.name in _OLD_BEST_FILES for p in entries[0].iterdir())


def check_checkpoint_folder(folder: Path, inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse a checkpoint folder that is an input, a file, or a non-empty directory that is not a checkpoint folder
    (a user's files, or a draft mtp2draft wrote): distill fills it and deletes it when it finishes."""
    if folder.is_dir() and any(folder.iterdir()) and is_checkpoint_folder(folder):
        check_outside_inputs(folder, inputs)
        return
    check_output_dir(folder, True, inputs)
    if folder.is_dir() and any(folder.iterdir()):
        raise OutputExistsError(
            f"{folder} is not a checkpoint folder of mtp2draft's (it holds a draft or other files), and distill "
            "keeps its checkpoints there and deletes them when it finishes: move it away, or choose another --out "
            "or --checkpoint-dir"
        )


def make_checkpoint_folder(folder: Path) -> bool:
    """Create (and mark) the checkpoint folder if needed; True when this call created it. Marked the moment it exists:
    a run killed between the two leaves an empty folder, which every rule accepts."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / CHECKPOINTS_MARKER).is_file():
        (folder / CHECKPOINTS_MARKER).write_text("a distill run's checkpoints; distill deletes them when it finishes\n")
        if not is_ours(folder):
            mark(folder)
    return made


def remove_checkpoint_folder(folder: Path) -> None:
    """Delete what distill wrote in its checkpoint folder, then the folder if that leaves it empty: a file someone
    put there is kept (and the folder with it)."""
    if not folder.is_dir() or not is_checkpoint_folder(folder):
        return
    for entry in folder.iterdir():
        if CHECKPOINT_ENTRY.match(entry.name) and entry.name not in (MARKER, CHECKPOINTS_MARKER):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    if all(p.name in (MARKER, CHECKPOINTS_MARKER) for p in folder.iterdir()):
        for name in (CHECKPOINTS_MARKER, MARKER):
            (folder / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
