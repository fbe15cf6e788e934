"""What one distill run is asked to do, declared once: the training settings (`DistillConfig`, built by the CLI's
`distill` and `run` from their options by field name, and validated on construction), what it trains on
(`TrainingData`), a DSpark drafter's objective and start, and the request that holds them all with the run's inputs
and outputs (`DistillJob`). All are frozen: built once, passed whole.

What this module does not do: train (`train/recipe.py`), or import torch (the CLI builds these before any work).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from mtp2draft.errors import OptionError
from mtp2draft.progress import Progress, quiet
from mtp2draft.settings import HubAccess, Placement, check_seed, floats, ints, setting


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """The training settings of one distill run, each declared once here (`settings.setting`): the CLI's `distill`
    and `run` offer every field not marked `cli=False` (whose help says why no command offers it)."""

    steps: int = setting(300, "Optimizer steps (0: only calibrate an EAGLE-3 draft).")
    ttt_steps: int = setting(3, "Draft steps unrolled per position (K, the training-time test).")
    lr: float = setting(1e-4, "Peak learning rate (AdamW, warm-up + cosine; tiny targets want ~1e-3).")
    # 1e-4: SpecForge's EAGLE-3 recipe
    batch_size: int = setting(8, "Sequences per step (the global batch under torchrun).")
    max_length: int = setting(256, "Tokens per sequence.")
    draft_vocab_size: int | None = setting(None, "eagle3: keep the V most frequent target tokens.")
    seed: int = setting(0, "Seed of the data order.")
    step_weights: list[float] | None = setting(
        None, "Loss weight per TTT step, e.g. '1,0.8,0.64' (default 0.8^s, EAGLE-3's).", advanced=True, parse=floats
    )
    teacher_temperature: float = setting(
        1.0,
        "Learn the target's distribution sharpened to p^(1/T); below 1 favours its top token (greedy serving). "
        "Online teachers only.",
        advanced=True,
    )
    # an offline top-k file keeps no tail to sharpen; 1 is the target's own distribution
    warmup_steps: int | None = setting(
        None, "5 % of the steps suits every run measured; benchmarks and tests set it from Python", cli=False
    )
    weight_decay: float = setting(
        0.0, "0 as in SpecForge's EAGLE-3 recipe; nothing measured here asks for another value", cli=False
    )
    grad_clip: float = setting(0.5, "0.5 as in SpecForge's EAGLE-3 recipe; a safety rail, not a tuning knob", cli=False)
    save_every: int = setting(50, "Checkpoint every N steps.")
    log_every: int = setting(10, "the log line cadence; the progress bar shows every step", cli=False)
    serving_engine: str | None = setting(
        None,
        "Train for what this engine computes with the family (facts per family: `mtp2draft specs`):",
        choices="engines",
    )
    # native MTP drafts: the engine's step-0 hidden, final norm and hand-over (the spec's `[engines.<engine>]`);
    # refused when the engine cannot serve the draft's kind for this family. None keeps the draft's setting.
    hidden_handover: str | None = setting(
        None, "mtp: the hidden handed to the next step, post_norm | pre_norm, overriding --serving-engine's.",
        advanced=True,
    )  # fmt: skip
    precision: str | None = setting(None, "fp32 or bf16 (default: bf16 on CUDA, fp32 elsewhere).")
    train_subset: str = setting("all", "Parameters to train (the rest stay frozen):", choices="subsets")
    activation_checkpointing: bool = setting(False, "Recompute the block's MLP in backward (saves its activations).")
    compile: bool = setting(False, "torch.compile the draft's block (GPU runs; the math is unchanged).")
    eval_every: int = setting(50, "With --heldout: evaluate every N steps (and before the first).")
    patience: int | None = setting(None, "With --heldout: stop after N evaluations without a gain.")
    heldout_examples: int = setting(64, "With --heldout: use at most N of its examples (whole batches).")

    def __post_init__(self) -> None:
        """Refuse values that would crash later or silently train nothing (one line each, before any work)."""
        for name in ("steps", "ttt_steps", "batch_size", "save_every", "log_every", "eval_every", "heldout_examples"):
            value = getattr(self, name)
            least = 0 if name == "steps" else 1  # 0 steps: calibrate an EAGLE-3 draft only (distill checks it)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(f"--{name.replace('_', '-')} must be a whole number >= {least}, got {value!r}")
        check_seed(self.seed)
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

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (both draft kinds' loops): linear warm-up over `warmup_steps`
        (default 5 % of the steps), then a cosine from `lr` down to 0.1 x `lr` at the last step."""
        warm = self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)
        if step < warm:
            return self.lr * (step + 1) / warm
        progress = (step - warm) / max(1, self.steps - warm)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    def weights(self) -> list[float]:
        if self.step_weights:
            return list(self.step_weights)
        return [0.8**s for s in range(self.ttt_steps)]


@dataclass(frozen=True, kw_only=True)
class TrainingData:
    """What a distill run trains on, declared once for `distill`, `run` and (regenerate, sample) `dump-hidden`: JSONL
    records with the online target, or a `dump-hidden` directory, and the held-out prompts that pick the weights."""

    data: Path | None = setting(None, "Training JSONL: {'text': ...} or {'messages': [...]} per line.")
    hidden_states: Path | None = setting(None, "Train from a `dump-hidden` directory instead of a target.")
    heldout: Path | None = setting(
        None,
        "Held-out JSONL (prompts the training never sees): evaluated every --eval-every steps and before the first; "
        "the best-scoring weights are written, never worse than the input draft on it.",
    )
    regenerate: bool = setting(
        False, "Replace the data's responses with the target's own to the same prompts (greedy; see --sample)."
    )
    sample: bool = setting(False, "With --regenerate: sample the responses (temperature 0.8) instead of greedy.")


# DeepSpec's DSpark recipe (deepseek-ai/DeepSpec `config/dspark/dspark_qwen3_4b_online.py` @8c483c7): 0.1 x CE +
# 0.9 x total variation + 1.0 x confidence BCE, slot k weighted exp(-k / 4), 512 anchors per sequence.
@dataclass(frozen=True, kw_only=True)
class DSparkObjective:
    """How a DSpark drafter is trained (`distill` of a dspark directory): DeepSpec's objective and its weights."""

    ce_weight: float = setting(0.1, "dspark: weight of the cross-entropy to the target's greedy token.", advanced=True)
    tv_weight: float = setting(
        0.9, "dspark: weight of the total variation |p_draft - p_target|_1 to the target's distribution.", advanced=True
    )
    confidence_weight: float = setting(
        1.0, "dspark: weight of the confidence head's BCE to each slot's acceptance rate.", advanced=True
    )
    loss_decay_gamma: float | None = setting(
        4.0, "dspark: slot k of a block weighs exp(-k / gamma) (0: every slot alike).", advanced=True
    )
    anchors: int = setting(
        512, "dspark: blocks drawn per sequence, at random among the positions that can start one.", advanced=True
    )

    def __post_init__(self) -> None:
        for name in ("ce_weight", "tv_weight", "confidence_weight", "loss_decay_gamma"):
            value = getattr(self, name)
            if value is None and name == "loss_decay_gamma":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise OptionError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value!r}")
        if not (self.ce_weight or self.tv_weight):
            raise OptionError("--ce-weight and --tv-weight are both 0: the drafter's tokens would learn nothing")
        if isinstance(self.anchors, bool) or not isinstance(self.anchors, int) or self.anchors < 1:
            raise OptionError(f"--anchors must be a whole number >= 1, got {self.anchors!r}")

    @property
    def weights(self) -> tuple[float, float, float]:
        """(ce, tv, confidence): `draft.dspark.dspark_loss`'s order."""
        return (float(self.ce_weight), float(self.tv_weight), float(self.confidence_weight))


@dataclass(frozen=True, kw_only=True)
class NewDSpark:
    """`distill --new-dspark LAYERS`: start a Qwen3-style DSpark drafter for a target that ships none."""

    new_dspark: list[int] | None = setting(
        None, "Start a new DSpark drafter reading these target layers (e.g. '2,5'), instead of a draft directory.",
        parse=ints,
    )  # fmt: skip
    block_size: int = setting(4, "With --new-dspark: draft tokens per block.")
    dspark_layers: int = setting(1, "With --new-dspark: the drafter's decoder layers.")
    markov_rank: int = setting(256, "With --new-dspark: rank of the Markov head (DeepSpec's 256).", advanced=True)
    noise_token_id: int | None = setting(
        None, "With --new-dspark: the noise (mask) token id (default: the tokenizer's mask, else pad, else the last id).",
        advanced=True,
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("block_size", "dspark_layers", "markov_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        ids = self.new_dspark
        if ids is not None and (
            not ids or any(i < 0 for i in ids) or any(b <= a for a, b in zip(ids, ids[1:], strict=False))
        ):
            raise OptionError(f"--new-dspark must list target layers 0.. in increasing order, got {ids!r}")
        if self.noise_token_id is not None and self.noise_token_id < 0:
            raise OptionError(f"--noise-token-id must be >= 0, got {self.noise_token_id}")


@dataclass(frozen=True, kw_only=True)
class DistillJob:
    """One `distill` request, whole: the draft and where it goes, the frozen target and what it trains on, and each
    of the run's records (training settings, data, where the target runs, Hub access; a DSpark drafter's objective and start).
    The CLI's `distill` and `run` build it the same way, from the records their options fill; `distill()` hands it
    down as it is, to the recipe, the teacher and the target."""

    draft_dir: str | Path | None
    """The draft directory to fine-tune; None only with `new.new_dspark` (a new DSpark drafter). Held as a Path."""
    out: str | Path
    """Held as a Path."""
    target: str | None = None
    """The frozen target (Hub id or local directory) of an online run; None with `data.hidden_states`."""
    data: TrainingData = field(default_factory=TrainingData)
    config: DistillConfig = field(default_factory=DistillConfig)
    where: Placement = field(default_factory=Placement)
    """Where the online target runs (its dtype, device or device map); the draft trains on its device."""
    hub: HubAccess = field(default_factory=HubAccess)
    """The target's revision and the token that reaches it."""
    dspark: DSparkObjective = field(default_factory=DSparkObjective)
    new: NewDSpark = field(default_factory=NewDSpark)
    resume: bool = False
    overwrite: bool = False
    skip_bad: bool = False
    checkpoint_dir: str | Path | None = None
    stop_after: int | None = None
    """End the run after that many steps without writing `out` (its checkpoints stay): for tests."""
    progress: Progress = quiet

    def __post_init__(self) -> None:
        # paths as Path whatever a caller passed, so the run's result and records name them one way (frozen: set once)
        object.__setattr__(self, "out", Path(self.out))
        if self.draft_dir is not None:
            object.__setattr__(self, "draft_dir", Path(self.draft_dir))
        if self.stop_after is not None and (
            isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int) or self.stop_after < 1
        ):
            raise OptionError(f"stop_after must be a whole number >= 1, got {self.stop_after!r}")

    @property
    def inputs(self) -> list:
        """What the run reads, and so never writes or deletes."""
        return [self.draft_dir, self.target, self.data.data, self.data.hidden_states, self.data.heldout]

    @property
    def checkpoints(self) -> Path:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return Path(self.out).parent / f"{Path(os.path.abspath(self.out)).name}.checkpoints"
