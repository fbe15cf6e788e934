"""Stage 2: fine-tune a draft against the frozen target with training-time test (TTT), as a recipe.

`distill()` runs `DistillRecipe` in torchtune's shape, each part one method:
- `check_outputs` / `check_memory`: refuse a run before anything loads (an --out we did not write, stale
  checkpoints, a memory plan the device cannot hold);
- `setup_model`: the draft, trained for the serving engine's computation (`--serving-engine`);
- `setup_data`: the teacher (online target + examples, or `dump-hidden` files; `train/teacher.py`);
- `setup_draft`: EAGLE-3 draft vocabulary and calibration on fresh runs (`train/calibrate.py`), or the checkpoint's shape
  on resumed ones;
- `setup_optimizer`: subset freezing, activation checkpointing, FSDP2, compile, then AdamW (built once) and the
  checkpoint's state;
- `train`: the loop (the math is `train/ttt.py`), logging and periodic checkpoints (`train/state.py`);
- `save`: the draft directory and its provenance, written by rank 0.

Both draft kinds go through the same loop; nothing here depends on the family (the spec and the draft module carry
that). The target is never written: its parameters are frozen, no optimizer sees them, and its weight hash is
checked before the result is written.

What this module does not do: declare its settings (`train/settings.py`), the TTT math (`train/ttt.py`), measure acceptance (`evaluation/decode.py`), read checkpoints of the
target (`checkpoint/reader.py`), or shard and checkpoint by itself (`train/parallel.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.draft.disk import load_draft, read_draft_config
from mtp2draft.draft.eagle3 import Eagle3Draft
from mtp2draft.errors import DataError, DraftError, OptionError
from mtp2draft.family.spec import get_spec
from mtp2draft.kinds import DraftKind, is_dspark_draft
from mtp2draft.outputs.checkpoint_folder import remove_checkpoint_folder
from mtp2draft.outputs.claims import claim_output
from mtp2draft.outputs.directories import check_output_dir
from mtp2draft.progress import Progress, meter, quiet
from mtp2draft.redact import command_line
from mtp2draft.target.device import resolve_device
from mtp2draft.target.dump_checks import check_finite_state, check_offline_options
from mtp2draft.train import memory, parallel
from mtp2draft.train.calibrate import (
    calibrate_pending,
    choose_and_narrow,
    narrow_vocab,
)
from mtp2draft.train.checks import NEEDS_DRAFT, check_heldout_options, check_training_settings, refuse_untrained
from mtp2draft.train.heldout import HeldoutGuard
from mtp2draft.train.parallel import Parallel
from mtp2draft.train.settings import DistillConfig, DistillJob
from mtp2draft.train.state import (
    DistillResult,
    check_checkpoints,
    claim_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    settings_hash,
    write_result,
)
from mtp2draft.train.teacher import Teacher, offline_teacher, online_teacher
from mtp2draft.train.ttt import TOP_K_NOT_SHARPENED, StepStats, draft_target_ids, ttt_forward


def distill(job: DistillJob) -> DistillResult:
    """Fine-tune the draft in `job.draft_dir` against the frozen target; write the result to `job.out`.

    `job` is the whole request (`DistillJob`): the training settings (`job.config`), and data either from
    `job.data.data` with the online `job.target` (loaded as `job.where` says: its dtype, on its device or spread
    by its device map; default cuda when available), or from a `dump-hidden` directory (`job.data.hidden_states`).
    A DSpark drafter, or `job.new.new_dspark`, is trained by `train/dspark_run.py` with `job.dspark`'s objective.
    Under torchrun every rank calls this; the global batch is split between them and rank 0 logs and writes (see
    parallel.py)."""
    if job.new.new_dspark or (job.draft_dir is not None and is_dspark_draft(job.draft_dir)):
        from mtp2draft.train.dspark_run import distill_dspark  # it builds on this module's pieces

        return distill_dspark(job)
    if job.draft_dir is None:
        raise OptionError(NEEDS_DRAFT)
    owned = not torch.distributed.is_initialized()
    par = Parallel.from_env(resolve_device(job.where.device))
    if not par.is_main:  # other torchrun ranks: rank 0 reports
        job = replace(job, progress=quiet)
    try:
        result = DistillRecipe(par, job).run()
        if owned:
            par.barrier()  # every rank done (rank 0's claim released) before any rank tears the process group down
        return result
    finally:
        if owned:
            par.close()


class DistillRecipe:
    """One distillation run on this rank (see the module docstring for the order of its parts)."""

    def __init__(self, par: Parallel, job: DistillJob) -> None:
        self.par, self.job = par, job
        self.cfg = cfg = job.config
        self.device = par.device
        self.precision = parallel.resolve_precision(cfg.precision, par.device)
        self.progress = job.progress
        self.weights = cfg.weights()
        self.latest: Path | None = None  # the checkpoint a resumed run starts from
        self.calibration: dict | None = None
        self.history: list[dict[str, Any]] = []
        self.start = 0
        self.guard: HeldoutGuard | None = None

    def run(self) -> DistillResult:
        """The whole run holds the claim on --out (rank 0, which writes): a second run into it is refused at once,
        not after hours of training, and the two can never share its checkpoints."""
        with contextlib.ExitStack() as held:
            # a refusal on one rank (rank 0 finds --out claimed by another run) fails every rank with its line
            parallel.together(self.par, lambda: self.claim(held))
            return self._run()

    def claim(self, held: contextlib.ExitStack) -> None:
        check_output_dir(self.job.out, self.job.overwrite, self.job.inputs)  # refused before anything is claimed
        if self.par.is_main:  # --out, and the checkpoint folder beside it (`convert --out OUT.checkpoints` waits)
            held.enter_context(claim_output(self.job.out))
            held.enter_context(claim_checkpoints(self.job.checkpoints))

    def _run(self) -> DistillResult:
        self.check_agreement()
        self.check_outputs()
        self.check_memory()
        self.setup_model()
        self.started = time.perf_counter()
        self.setup_data()
        self.setup_draft()
        self.setup_optimizer()
        end = self.cfg.steps if self.job.stop_after is None else min(self.cfg.steps, self.start + self.job.stop_after)
        self.train(end)
        if end < self.cfg.steps and not (self.guard and self.guard.stopped_at):
            # stopped early on purpose (stop_after): checkpoints stay, nothing is written
            return DistillResult(
                self.job.out, end, time.perf_counter() - self.started, [], self.history, self.start or None
            )
        return self.save()

    # -- before anything loads --
    def check_agreement(self) -> None:
        """Under torchrun, before any other collective: every rank was started with the same settings, or every rank
        fails with the same line (ranks that disagree would wait on each other forever)."""
        job = self.job
        given = {k: getattr(job, k) for k in ("draft_dir", "out", "target", "resume", "overwrite", "skip_bad")}
        given |= {"checkpoint_dir": job.checkpoint_dir, "stop_after": job.stop_after, "revision": job.hub.revision}
        given |= {f"data.{k}": v for k, v in asdict(job.data).items()}
        device = torch.device(self.device).type
        parallel.check_same_settings(
            self.par, {**asdict(self.cfg), **given, "precision": self.precision, "device": device}
        )

    def check_outputs(self) -> None:
        """--resume continues from checkpoints; it never stands in for --overwrite: an existing --out is only
        replaced with --overwrite, and only when mtp2draft wrote it."""
        job, par, ckpt = self.job, self.par, self.job.checkpoints
        if job.data.hidden_states is not None:
            check_offline_options(job)
            if self.cfg.teacher_temperature != 1.0:
                raise OptionError(TOP_K_NOT_SHARPENED)
        check_heldout_options(self.cfg, job.data.heldout, job.data.hidden_states)
        if self.cfg.batch_size < par.world:
            raise DataError(
                f"--batch-size {self.cfg.batch_size} is the global batch: it must be at least the {par.world} ranks"
            )
        check_output_dir(job.out, job.overwrite, job.inputs)
        check_checkpoints(ckpt, job.inputs, job.resume, job.overwrite, par)
        latest = latest_checkpoint(ckpt) if job.resume else None
        if latest is not None:
            try:
                state = json.loads((latest / parallel.STATE_FILE).read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DraftError(
                    f"{latest / parallel.STATE_FILE} is not valid JSON ({exc}): start over with --overwrite"
                ) from exc
            done = state.get("step") if isinstance(state, dict) else None
            if not isinstance(done, int) or isinstance(done, bool) or done < 1:
                raise DraftError(
                    f"{latest / parallel.STATE_FILE} records no valid step ({done!r}): start over with --overwrite"
                )
            if done >= self.cfg.steps:
                raise OptionError(
                    f"--steps {self.cfg.steps} with --resume: {latest} is already at step {done}, so nothing would "
                    f"train and its weights would be recorded as {self.cfg.steps} steps; resume with --steps above "
                    f"{done}, or start over with --overwrite"
                )

    def check_memory(self) -> None:
        """The memory plan, from the draft's config alone, printed; refused when the device cannot hold it."""
        online = self.job.data.hidden_states is None
        draft_config = read_draft_config(self.job.draft_dir)
        mem = memory.plan(draft_config, self.cfg, world=self.par.world, precision=self.precision, online_logits=online)
        self.progress(f"{memory.render([mem])}")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.par.world))
        reason = memory.check_fits(mem, self.device, local_world if self.device == "cpu" else 1)
        if reason:
            raise DraftError(reason)

    # -- setup --
    def setup_model(self) -> None:
        torch.manual_seed(self.cfg.seed)
        self.draft = load_draft(self.job.draft_dir).to(self.device)
        configure_draft(self.draft, self.cfg)

    def setup_data(self) -> None:
        job, cfg, draft = self.job, self.cfg, self.draft
        if job.data.hidden_states is not None:
            self.teacher: Teacher = offline_teacher(job.data.hidden_states, draft, job.draft_dir, cfg.max_length)
        else:
            # regenerate only what this run will see: one pass of steps x batch size examples (data order is seeded)
            regen = max(cfg.steps * cfg.batch_size, cfg.batch_size) if job.data.regenerate else None
            self.teacher = online_teacher(draft, job, self.device, regen)
        self.fingerprint = self.teacher.fingerprint()
        draft.attach_target(self.teacher.embed.to(self.device), self.teacher.head.to(self.device))
        self.settings = {
            **asdict(cfg),
            "precision": self.precision,
            "kind": draft.kind,
            "draft": str(job.draft_dir),
            "data_hash": self.teacher.data_hash,
            "target": self.teacher.source,
        }
        if job.data.hidden_states is None and job.where.torch_dtype != "float32":  # left out: older hashes hold
            self.settings["target_dtype"] = job.where.torch_dtype
        parallel.check_same_settings(self.par, self.settings, "data")  # every rank read the same data and target
        if job.data.heldout is not None:
            self.guard = HeldoutGuard.build(
                job.data.heldout, self.teacher, cfg.heldout_examples, cfg.batch_size, cfg.max_length,
                every=cfg.eval_every, patience=cfg.patience,
            )  # fmt: skip
            self.progress(
                f"held-out guard: {self.guard.teacher.size} examples of {job.data.heldout}, every {cfg.eval_every} steps"
                + (f", patience {cfg.patience}" if cfg.patience else "")
            )

    def batch(self, step: int, final: bool = False, whole: bool = False):
        """Step `step`'s batch and features: this rank's rows of the global batch (all of it when `whole`)."""
        cfg, n = self.cfg, self.cfg.batch_size
        rows = slice(None) if whole else self.par.rows(n)
        return self.teacher.batch(self.draft, step, n, cfg.seed, cfg.max_length, rows, self.device, final)

    def setup_draft(self) -> None:
        """Draft vocabulary and calibration on a fresh run; a resumed run finds them in its checkpoint."""
        job, draft = self.job, self.draft
        self.latest = latest_checkpoint(job.checkpoints) if job.resume else None
        if job.resume and self.latest is None:
            self.progress(f"no checkpoint in {job.checkpoints}: starting from step 0")
        fresh = self.latest is None
        choose_and_narrow(
            draft, self.cfg.draft_vocab_size, self.teacher.examples, self.teacher.head, self.progress, fresh
        )
        if fresh:  # every rank fits the same, on the whole batch
            first = lambda: self.batch(0, final=True, whole=True)  # noqa: E731
            self.calibration = calibrate_pending(draft, job.draft_dir, first, self.teacher.embed, self.progress)
        refuse_untrained(self.cfg, calibrates=self.calibration is not None)
        if not fresh:
            self._take_checkpoint_shape()

    def _take_checkpoint_shape(self) -> None:
        """Refuse a checkpoint written with other settings; give the draft the vocabulary it was narrowed to."""
        state = json.loads((self.latest / parallel.STATE_FILE).read_text())
        if state.get("settings_hash") != settings_hash(self.settings):
            raise DraftError(
                f"{self.latest} was written with other settings: resume with the same options or start over"
            )
        if state["draft_config"].get("draft_vocab_size") != getattr(self.draft, "draft_vocab_size", None):
            # the checkpoint narrowed the vocabulary: rebuild the head to its size before loading weights
            vd = int(state["draft_config"]["draft_vocab_size"])
            narrow_vocab(self.draft, torch.arange(vd), self.teacher.head.float())
        if isinstance(self.draft, Eagle3Draft):
            self.draft.eagle_config.update(state["draft_config"])

    def setup_optimizer(self) -> None:
        """Subset, activation checkpointing, FSDP2, compile; then AdamW over the trainable parameters, loaded from
        the checkpoint on a resumed run."""
        cfg = self.cfg
        self.model, self.autocast = _prepare(self.draft, cfg, self.par, self.precision, self.progress)
        self.params = self.draft.trainable_parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        if self.latest is not None:
            meta = load_checkpoint(self.latest, self.draft, self.optimizer, self.par)
            self.start = int(meta["step"])
            self.history = meta.get("history", [])
            if self.guard is not None:
                self.guard.restore(self, self.start, meta.get("heldout", []))
            written = f" (written by {meta['world_size']} rank(s))" if self.par.distributed else ""
            self.progress(f"resuming from {self.latest.name}{written}")
        self.vocab_ids = draft_target_ids(self.draft)

    # -- the loop --
    def train_step(self, step: int) -> StepStats:
        """One optimizer step on step `step`'s batch; the stats are the global batch's."""
        # a batch refused on one rank (NaN in its rows of a dump) is refused on every rank, before any step
        batch, feats = parallel.together(self.par, lambda: self.batch(step))
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr_at(step)
        with self.autocast():
            stats = ttt_forward(
                self.model,
                feats,
                batch["input_ids"].to(self.device),
                batch["loss_mask"].to(self.device),
                self.cfg.ttt_steps,
                self.weights,
                self.vocab_ids,
                temperature=self.cfg.teacher_temperature,
            )
        loss = stats.loss
        if self.par.distributed:
            stats, loss = _global_stats(stats, self.weights, self.par)
        value = float(stats.loss.detach())
        if not math.isfinite(value):  # the global loss: every rank refuses the same step
            raise DataError(
                f"step {step + 1}: the loss is {value}: no optimizer step is taken on it (the batch or the draft "
                "holds values that overflow)"
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: the global norm, on every rank
        if not bool(torch.isfinite(norm)):
            raise DataError(f"step {step + 1}: the gradient norm is {float(norm)}: the update is not applied")
        self.optimizer.step()
        return stats

    def train(self, end: int) -> None:
        """Steps `self.start` .. `end`: log every `log_every` steps, checkpoint every `save_every` (not the last)."""
        cfg, log = self.cfg, self.progress
        self.draft.train()
        bar = meter(self.progress, "distill", cfg.steps, "step", initial=self.start)
        log = bar.write  # log lines above a bar, not through it
        window: list[list[float]] = []
        if self.guard is not None:
            self.guard.update(self, self.start)  # step 0: the input draft is the first candidate
        for step in range(self.start, end):
            stats = self.train_step(step)
            acc = [c / max(n, 1) for c, n in zip(stats.per_step_correct, stats.per_step_count, strict=True)]
            window.append(acc)
            bar.update(1, f"loss {stats.loss.item():.3f} top-1 " + " ".join(f"{a:.2f}" for a in acc))
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                mean = [sum(a[s] for a in window) / len(window) for s in range(cfg.ttt_steps)]
                self.history.append({"step": step + 1, "loss": stats.loss.item(), "accuracy": mean})
                log(
                    f"step {step + 1}/{cfg.steps}  loss {stats.loss.item():.4f}  top-1 per step "
                    + " ".join(f"{a:.2f}" for a in mean)
                    + f"  ({time.perf_counter() - self.started:.0f} s)"
                )
                window = []
            if self.guard is not None and self.guard.due(step + 1, cfg.steps) and self.guard.update(self, step + 1):
                break  # --patience: no held-out gain for that many evaluations
            if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                meta = {"settings_hash": settings_hash(self.settings), "history": self.history}
                if self.guard is not None:
                    meta["heldout"] = self.guard.history
                save_checkpoint(self.job.checkpoints, step + 1, self.draft, self.optimizer, meta, self.par)
        bar.close()

    # -- the result --
    def save(self) -> DistillResult:
        """Check the target is unchanged, gather the draft, and (rank 0) write it with its provenance."""
        job, par, cfg = self.job, self.par, self.cfg
        if self.fingerprint is not None and self.teacher.fingerprint() != self.fingerprint:
            raise RuntimeError("the target's weights changed during distillation: this is a bug")
        seconds = time.perf_counter() - self.started
        final_acc = self.history[-1]["accuracy"] if self.history else []
        resumed = self.start or None
        guard = self.guard
        trained = guard.stopped_at if guard and guard.stopped_at else cfg.steps
        state = parallel.full_state_dict(self.draft, par)  # collective: every rank takes part
        record = guard.record() if guard else None
        if not par.is_main:
            parallel.together(par, lambda: None)  # rank 0 writes the result, then everyone returns (or fails)
            return DistillResult(job.out, trained, seconds, final_acc, self.history, resumed, record, is_main=False)
        if guard is not None and guard.best["step"] != trained:  # an earlier step scored best on the held-out set
            state = guard.best_state
            self.progress(
                f"held-out: writing the weights of step {guard.best['step']} (implied acceptance length "
                f"{guard.best['score']:.3f}; step {trained}: {guard.history[-1]['score']:.3f})"
                + (": the input draft, unchanged" if guard.best["step"] == 0 else "")
            )
        info = {
            "settings": self.settings,
            "target_commit": self.teacher.commit,
            "steps": trained,
            "heldout": record,
            "seconds": round(seconds, 1),
            "final_accuracy_per_step": final_acc,
            "calibration": self.calibration,
            "history": self.history,
            "resumed_from_step": resumed,
            "command": command_line(),
            "version": __version__,
            "world_size": par.world,
        }

        def write() -> None:
            check_finite_state(
                state if state is not None else self.draft.state_dict(), f"the distilled draft {job.out}"
            )
            write_result(self.draft, job.draft_dir, job.out, job.overwrite, info, state, self.progress)
            remove_checkpoint_folder(job.checkpoints)

        parallel.together(par, write)
        return DistillResult(job.out, trained, seconds, final_acc, self.history, resumed, record)


def configure_draft(draft, cfg: DistillConfig) -> None:
    """Train for `--serving-engine`'s computation and `--hidden-handover`, refused where they do not apply."""
    kind = draft.kind
    spec_name = getattr(getattr(draft, "spec", None), "name", None) or (
        (getattr(draft, "eagle_config", {}) or {}).get("mtp2draft") or {}
    ).get("spec")
    layers = int(getattr(draft, "num_layers", 1) or 1)  # a chain draft (convert --all-layers) holds several
    check_training_settings(kind, get_spec(spec_name) if spec_name else None, cfg, layers)
    if cfg.serving_engine is not None and kind == DraftKind.MTP:
        draft.train_for_engine(cfg.serving_engine)
    if cfg.hidden_handover is not None:
        draft.hidden_handover = cfg.hidden_handover


def _prepare(draft, cfg: DistillConfig, par: Parallel, precision: str, progress: Progress):
    """Subset, activation checkpointing, FSDP2 and compile, in that order, on the loaded (and narrowed) draft.

    Returns (the module ttt_forward calls, a context manager for the step: autocast for one-process bf16)."""
    frozen = parallel.freeze_subset(draft, cfg.train_subset)
    if frozen:
        progress(f"--train-subset {cfg.train_subset}: {len(frozen)} parameter tensor(s) frozen")
    if cfg.activation_checkpointing:
        parallel.checkpoint_mlp(draft)
    autocast = contextlib.nullcontext
    if par.distributed:
        parallel.broadcast_parameters(draft, par)
        units = parallel.shard(draft, par, precision)
        progress(f"FSDP2 over {par.world} rank(s): units {', '.join(units) or '(root only)'} + root; {precision}")
    elif precision == "bf16":
        device_type = torch.device(par.device).type

        def autocast():
            return torch.autocast(device_type, dtype=torch.bfloat16)

    if cfg.compile:
        for block in parallel.draft_blocks(draft):
            block.compile()
    return draft, autocast


def _global_stats(stats: StepStats, weights: Sequence[float], par: Parallel) -> tuple[StepStats, torch.Tensor]:
    """Stats over the global batch, and the loss this rank back-propagates.

    The 1-rank loss is sum_s w_s * S_s / n_s (S_s: KL summed over the batch's valid tokens, n_s: their count). Each
    rank holds its rows' part of S_s; with the GLOBAL n_s, sum over ranks of the rank losses is the 1-rank loss, and
    FSDP averages gradients over ranks, hence the factor N."""
    k = len(weights)
    counts = par.sum(stats.per_step_count + stats.per_step_correct + [float(x.detach()) for x in stats.per_step_sum])
    n, correct, sums = counts[:k], counts[k : 2 * k], counts[2 * k :]
    loss = sum(weights[s] * stats.per_step_sum[s] / max(n[s], 1.0) for s in range(k)) * par.world
    per_step = [sums[s] / max(n[s], 1.0) for s in range(k)]
    total = torch.tensor(sum(weights[s] * per_step[s] for s in range(k)))
    out = StepStats(total, per_step, [int(c) for c in correct], [int(c) for c in n])
    return out, loss
