"""What one distill run is asked to do, declared once: the training settings (`DistillConfig`, built by the CLI's
`distill` and `run` from their options by field name, and validated on construction) and the rest of the call
(`DistillJob`: inputs, outputs, resume and where the target runs). Both are frozen: built once, passed whole.

What this module does not do: train (`train/recipe.py`), or import torch (the CLI builds these before any work).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mtp2draft.errors import OptionError

if TYPE_CHECKING:
    from mtp2draft.io import Progress


@dataclass(frozen=True)
class DistillConfig:
    """The training settings of one distill run: declared once here. The CLI's `distill` and `run` build it from
    their parsed options by field name (`from_options`); `LIBRARY_ONLY` lists the fields no command offers, and why
    (tests/test_cli.py holds the CLI's options against these fields)."""

    steps: int = 300
    ttt_steps: int = 3
    lr: float = 1e-4  # SpecForge's EAGLE-3 recipe; tiny targets (tests, demo) want ~1e-3
    batch_size: int = 8
    max_length: int = 256
    draft_vocab_size: int | None = None
    seed: int = 0
    step_weights: list[float] | None = None
    """Loss weight of each TTT step; default 0.8**s (EAGLE-3)."""
    teacher_temperature: float = 1.0
    """The draft learns the target's distribution sharpened to p**(1/T) (renormalised): 1 is the target's own, below
    1 puts the KL's weight on the target's top token, what greedy verification accepts. Online teachers only (an
    offline top-k file keeps no tail to sharpen)."""
    warmup_steps: int | None = None
    """Default: 5 % of the steps."""
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    save_every: int = 50
    log_every: int = 10
    serving_engine: str | None = None
    """Train for what this engine (`spec.ENGINES`) computes with the family: for native MTP drafts its step-0
    hidden, final norm and hand-over (the spec's `[engines.<engine>]`); refused when the engine cannot serve the
    draft's kind for this family. None keeps the draft's setting."""
    hidden_handover: str | None = None
    """Native MTP drafts: the hidden handed to the next step, overriding the serving engine's (`post_norm` | `pre_norm`).
    None: the serving engine's, or the draft's setting."""
    precision: str | None = None
    """fp32 or bf16 (see parallel.PRECISIONS); None: bf16 on CUDA, fp32 elsewhere."""
    train_subset: str = "all"
    """Which parameters train (parallel.TRAIN_SUBSETS); the rest stay frozen."""
    activation_checkpointing: bool = False
    """Recompute the block's MLP in backward (saves its activations; the math is unchanged)."""
    compile: bool = False
    """torch.compile the draft's block (GPU runs; the math is unchanged up to kernel rounding)."""
    eval_every: int = 50
    """With a held-out set (`DistillJob.heldout`): evaluate on it every N steps (and before the first)."""
    patience: int | None = None
    """With a held-out set: stop after N evaluations without a gain. None: run every step (the best is written)."""
    heldout_examples: int = 64
    """With a held-out set: use at most this many of its examples (a whole number of batches)."""

    def __post_init__(self) -> None:
        """Refuse values that would crash later or silently train nothing (one line each, before any work)."""
        for name in ("steps", "ttt_steps", "batch_size", "save_every", "log_every", "eval_every", "heldout_examples"):
            value = getattr(self, name)
            least = 0 if name == "steps" else 1  # 0 steps: calibrate an EAGLE-3 draft only (distill checks it)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(f"--{name.replace('_', '-')} must be a whole number >= {least}, got {value!r}")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 2:
            raise OptionError(f"--max-length must be a whole number >= 2, got {self.max_length!r}")
        for name in ("lr", "grad_clip", "teacher_temperature"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise OptionError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise OptionError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if self.patience is not None and (
            isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1
        ):
            raise OptionError(f"--patience must be a whole number >= 1, got {self.patience!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise OptionError(f"--draft-vocab-size must be >= 1, got {self.draft_vocab_size}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise OptionError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.step_weights is not None:
            if len(self.step_weights) != self.ttt_steps:
                raise OptionError(f"--step-weights has {len(self.step_weights)} values for {self.ttt_steps} TTT steps")
            if not all(math.isfinite(w) and w >= 0 for w in self.step_weights) or not any(self.step_weights):
                raise OptionError(f"--step-weights must be finite, >= 0 and not all zero, got {self.step_weights}")

    LIBRARY_ONLY: ClassVar[dict[str, str]] = {
        "warmup_steps": "5 % of the steps suits every run measured; benchmarks and tests set it from Python",
        "weight_decay": "0 as in SpecForge's EAGLE-3 recipe; nothing measured here asks for another value",
        "grad_clip": "0.5 as in SpecForge's EAGLE-3 recipe; a safety rail, not a tuning knob",
        "log_every": "the log line cadence; the progress bar shows every step",
    }

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> DistillConfig:
        """The config of a command's parsed options (click's `ctx.params`): every option named like a field (a
        trailing `_` dropped: `compile_` is `--compile`) sets it; other options are not training settings."""
        names = {f.name for f in fields(cls)}
        return cls(**{key.rstrip("_"): value for key, value in options.items() if key.rstrip("_") in names})

    def weights(self) -> list[float]:
        if self.step_weights:
            return list(self.step_weights)
        return [0.8**s for s in range(self.ttt_steps)]


@dataclass(frozen=True, kw_only=True)
class DistillJob:
    """What one `distill()` call was asked to do, besides the training settings (`DistillConfig`)."""

    draft_dir: str | Path
    out: Path
    data: str | Path | None = None
    target: str | None = None
    hidden_states: str | Path | None = None
    heldout: str | Path | None = None
    """Held-out JSONL: evaluated every `eval_every` steps; the best-scoring weights are written (`train/heldout.py`)."""
    revision: str | None = None
    token: str | bool | None = None
    resume: bool = False
    overwrite: bool = False
    regenerate_data: bool = False
    sample: bool = False
    skip_bad: bool = False
    checkpoint_dir: str | Path | None = None
    progress: Progress = lambda _: None
    stop_after: int | None = None
    target_dtype: str = "float32"  # the online target's dtype and device map (TargetModel's)
    device_map: str | dict | None = None

    @property
    def inputs(self) -> list:
        return [self.draft_dir, self.target, self.data, self.hidden_states, self.heldout]

    @property
    def checkpoints(self) -> Path:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return self.out.parent / f"{Path(os.path.abspath(self.out)).name}.checkpoints"
