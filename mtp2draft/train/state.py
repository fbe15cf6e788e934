"""What a distill run writes: resumable checkpoints, the guard that a resume uses the same settings, the result.

- checkpoints: `torch.distributed.checkpoint` folders through `parallel.save` / `parallel.load` (one process or
  many; any world size loads them), with the draft's config and the settings hash in their `state.json`, in a
  checkpoint folder claimed for the run and marked as one (`manifest.CHECKPOINTS_MARKER`): anything else there is refused;
- the result: the fine-tuned draft in the same format as its input (dtype of the input's `torch_dtype`), its
  provenance extended with a `distill` section; written atomically.

What this module does not do: decide when to save (the recipe in `train/recipe.py`) or shard anything (`train/parallel.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtp2draft.draft.disk import read_draft_config
from mtp2draft.draft.eagle3 import Eagle3Draft, without_identity_maps
from mtp2draft.errors import DraftError
from mtp2draft.formats import charts
from mtp2draft.kinds import CONFIG_FILE, PROVENANCE_FILE, TRAINING_CHART, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.checkpoint_folder import check_checkpoint_folder, remove_checkpoint_folder
from mtp2draft.outputs.claims import claim_output
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.progress import Progress, quiet
from mtp2draft.train import parallel
from mtp2draft.train.parallel import Parallel


@dataclass
class DistillResult:
    """What a distill run returns (either draft kind): where it wrote, how far it trained, its history."""

    out: Path
    steps: int
    seconds: float
    per_step_accuracy: list[float]
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    heldout: dict[str, Any] | None = None
    """The held-out guard's record (train/heldout.py), when the run had one."""
    is_main: bool = True
    """False on ranks other than 0 under torchrun: they wrote nothing and should print nothing."""


def settings_hash(settings: dict[str, Any]) -> str:
    # neither changes the math, so a run may resume with or without them
    # nor do the held-out guard's settings: they choose which step's weights are written, not what a step computes
    skip = ("save_every", "log_every", "steps", "compile", "activation_checkpointing")
    skip += ("eval_every", "patience", "heldout_examples")
    keep = {k: v for k, v in settings.items() if k not in skip}
    if keep.get("teacher_temperature") == 1.0:  # the default is left out: checkpoints written before it existed resume
        del keep["teacher_temperature"]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(
    folder: Path, step: int, draft, optimizer: torch.optim.Optimizer, meta: dict[str, Any], par: Parallel | None = None
) -> None:
    """Atomically write step `step` (weights, AdamW moments, progress) and keep the two newest.

    torch.distributed.checkpoint, keyed by parameter name, on one process or many (see parallel.py): a checkpoint
    loads on any world size."""
    parallel.save(folder, step, draft, optimizer, {**meta, "draft_config": draft.draft_config()}, par or Parallel())


def check_checkpoints(folder: Path, inputs: list, resume: bool, overwrite: bool, par: Parallel) -> None:
    """Refuse a checkpoint folder mtp2draft did not write as one (a draft, your files: never filled, never deleted),
    and checkpoints of an earlier run without --resume or --overwrite; --overwrite removes them (rank 0)."""
    check_checkpoint_folder(folder, inputs)
    if not resume and latest_checkpoint(folder) is not None:
        if not overwrite:
            raise DraftError(
                f"{folder} holds checkpoints of an earlier run: pass --resume to continue it, or --overwrite to "
                "start over"
            )
        parallel.run_main_only(par, lambda: remove_checkpoint_folder(folder))


@contextlib.contextmanager
def claim_checkpoints(folder: Path) -> Iterator[None]:
    """Hold the claim on the checkpoint folder for the run (`outputs.claims.claim_output`). A folder the run made that holds no
    checkpoint when it ends (refused, interrupted, out of disk) is removed: what it held (the held-out best so far)
    a fresh run finds again; checkpoints stay for --resume, and on success the folder is already gone."""
    made = not folder.exists()
    with claim_output(folder):
        try:
            yield
        finally:
            if made and folder.is_dir() and latest_checkpoint(folder) is None:
                remove_checkpoint_folder(folder)


def latest_checkpoint(folder: Path) -> Path | None:
    done = sorted(p for p in folder.glob("step-*") if (p / parallel.STATE_FILE).is_file())
    return done[-1] if done else None


def load_checkpoint(path: Path, draft, optimizer: torch.optim.Optimizer, par: Parallel | None = None) -> dict[str, Any]:
    return parallel.load(path, draft, optimizer, par or Parallel())


def write_result(
    draft,
    draft_dir: str | Path,
    out: Path,
    overwrite: bool,
    info: dict[str, Any],
    full_state: dict[str, torch.Tensor] | None = None,
    progress: Progress = quiet,
) -> None:
    """The fine-tuned draft in the same format as its input, provenance extended with a `distill` section, and the
    training curves (`charts.TRAINING_CHART`) drawn from its history.

    full_state: the gathered state dict of a sharded draft (parallel.full_state_dict); else draft.state_dict()."""
    src_cfg = read_draft_config(draft_dir)
    prov_path = Path(draft_dir) / PROVENANCE_FILE
    provenance = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    provenance["distill"] = info
    dtype = {"float32": torch.float32, "float16": torch.float16}.get(src_cfg.get("torch_dtype"), torch.bfloat16)
    buffers = {k for k, _ in draft.named_buffers()} | _stored_float32(Path(draft_dir) / WEIGHTS_FILE)
    state = {
        k: (v.to(dtype) if v.is_floating_point() and k not in buffers else v).detach().cpu().contiguous()
        for k, v in (full_state if full_state is not None else draft.state_dict()).items()
    }
    if isinstance(draft, Eagle3Draft):
        config = {**src_cfg, **draft.draft_config()}
        state = without_identity_maps(state, draft.vocab_size, draft.draft_vocab_size)
    else:
        config = {**src_cfg, **draft.computation(), "engine": draft.engine}
    with atomic_output_dir(out, overwrite, inputs=[draft_dir]) as tmp:
        save_tensors(tmp / WEIGHTS_FILE, state, {"format": "pt"})
        write_json(tmp / CONFIG_FILE, config)
        write_json(tmp / PROVENANCE_FILE, provenance)
        try:  # where matplotlib is installed; a cosmetic step never discards the trained draft
            charts.save_training_chart(info.get("history") or [], tmp)
        except Exception as exc:
            (tmp / TRAINING_CHART).unlink(missing_ok=True)
            progress(f"warning: the training chart could not be drawn ({type(exc).__name__}: {exc}); draft saved")


def _stored_float32(weights: Path) -> set[str]:
    """The tensors input draft `weights` holds in fp32 under a narrower `torch_dtype` (a checkpoint's own fp32
    tensors, convert keeps them so): the distilled draft keeps them fp32 too, never rounded on the way out."""
    from safetensors import safe_open

    if not weights.is_file():
        return set()
    with safe_open(str(weights), framework="pt") as fh:
        return {k for k in fh.keys() if fh.get_slice(k).get_dtype() == "F32"}  # noqa: SIM118
