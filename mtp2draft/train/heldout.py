"""The held-out guard of a distill run (`--heldout`): measure the draft on prompts it never trains on, keep the best.

Every `--eval-every` steps (and before the first step, so the input draft is a candidate too) the draft's training-time
test is run without gradients over a fixed held-out set, teacher-forced exactly as training is. Per TTT step s it
counts how often the draft's top-1 equals the target's; the score is the acceptance length those rates imply for greedy
speculative decoding, sum_j prod_{i<=j} a_i (the rates taken as conditional acceptance: a proxy, cheap enough to run
often; `evaluate` measures the real thing). The run writes the weights of the best-scoring evaluation, never worse
than the input draft on this set; `--patience N` ends it after N evaluations without a gain.

Why: a head that is already good at position 1 (a shipped one accepts 80-90 %) can be pulled down by a fine-tune
tuned on weak heads; the guard makes "distill never harms" a property of the run rather than of its settings.

What this module does not do: decode (`evaluation/decode.py`), read JSONL itself (`data.py`), or choose the held-out
prompts: they must not overlap the training data, and reporting acceptance on the same prompts that chose the step
overstates it (evaluate on others).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.data import load_tokenizer, read_examples
from mtp2draft.errors import DataError, DraftError, read_json_object
from mtp2draft.manifest import write_json
from mtp2draft.outputs.checkpoint_folder import make_checkpoint_folder
from mtp2draft.outputs.directories import publish_dir
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.train import parallel
from mtp2draft.train.teacher import Teacher, collate
from mtp2draft.train.ttt import ttt_forward

BEST_DIR = "best"  # inside the run's checkpoint folder: `best-<step>`, the best weights so far, for --resume


def best_dir(folder: Path, step: int) -> Path:
    """Where the best weights found at `step` are kept in the checkpoint folder `folder`."""
    return folder / f"{BEST_DIR}-{step:07d}"


def implied_acceptance(rates: list[float]) -> float:
    """sum_j prod_{i<=j} a_i: the mean acceptance length (bonus token excluded) of rates taken as conditional."""
    total, run = 0.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


@dataclass
class HeldoutGuard:
    """The held-out examples of one run and what their evaluations found."""

    path: Path
    teacher: Teacher  # the run's teacher with the held-out examples in place of the training ones
    every: int
    patience: int | None
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None  # {"step", "score", "accuracy"}
    best_state: dict[str, torch.Tensor] | None = None  # rank 0's CPU copy of the best weights (None: the current)
    stopped_at: int | None = None

    @classmethod
    def build(
        cls, path: str | Path, train: Teacher, limit: int, batch_size: int, max_length: int, **kw
    ) -> HeldoutGuard:
        """Held-out examples tokenised as the training ones (the target's tokenizer, same max length), at most
        `limit`, a whole number of batches (every rank runs every batch)."""
        if train.target is None:
            raise DataError("--heldout needs the online target (--target and --data): a dump holds no other prompts")
        tokenizer = load_tokenizer(train.target.path)
        examples, _ = read_examples(path, tokenizer, max_length)
        n = min(len(examples), limit) // batch_size * batch_size
        if n == 0:
            raise DataError(
                f"{path}: {len(examples)} usable held-out example(s), fewer than one batch of --batch-size {batch_size}"
            )
        teacher = Teacher(**{**vars(train), "examples": examples[:n], "size": n})
        return cls(Path(path), teacher, **kw)

    def due(self, step: int, last: int) -> bool:
        return step % self.every == 0 or step == last

    def measure(self, recipe: Any) -> tuple[list[float], float]:
        """Per-step top-1 agreement with the target over the held-out set, and its implied acceptance length."""
        draft, cfg, par = recipe.draft, recipe.cfg, recipe.par
        n, bs, k = self.teacher.size, cfg.batch_size, cfg.ttt_steps
        correct, count = [0] * k, [0] * k
        was_training = draft.training
        draft.eval()
        with torch.no_grad(), recipe.autocast():
            for start in range(0, n, bs):
                idx = list(range(start, start + bs))
                batch = collate([self.teacher.examples[i] for i in idx], self.teacher.pad_id)
                batch = {key: v[par.rows(bs)] for key, v in batch.items()}
                feats = self.teacher.features_of(draft, batch, recipe.device)
                stats = ttt_forward(
                    recipe.model, feats, batch["input_ids"].to(recipe.device), batch["loss_mask"].to(recipe.device),
                    k, recipe.weights, recipe.vocab_ids,
                )  # fmt: skip
                correct = [a + b for a, b in zip(correct, stats.per_step_correct, strict=True)]
                count = [a + b for a, b in zip(count, stats.per_step_count, strict=True)]
        draft.train(was_training)
        totals = par.sum(correct + count)
        rates = [c / max(m, 1.0) for c, m in zip(totals[:k], totals[k:], strict=True)]
        return rates, implied_acceptance(rates)

    def update(self, recipe: Any, step: int) -> bool:
        """Evaluate at `step`; keep the weights when they score best so far. True: --patience says stop here."""
        if any(h["step"] == step for h in self.history):  # a resumed run re-enters at a measured step
            return False
        rates, score = self.measure(recipe)
        self.history.append({"step": step, "accuracy": rates, "score": score})
        recipe.progress(
            f"held-out at step {step}: top-1 per step " + " ".join(f"{a:.3f}" for a in rates)
            + f", implied acceptance length {score:.3f}"
            + ("" if self.best is None else f" (best {self.best['score']:.3f} at step {self.best['step']})")
        )  # fmt: skip
        if self.best is None or score > self.best["score"]:
            self.best = {"step": step, "score": score, "accuracy": rates}
            state = parallel.full_state_dict(recipe.draft, recipe.par)  # collective under FSDP; rank 0 gets it
            if recipe.par.is_main:
                state = state if state is not None else recipe.draft.state_dict()
                self.best_state = {key: v.detach().cpu().clone() for key, v in state.items()}
                self._save(recipe.job.checkpoints)
            return False
        since = sum(1 for h in self.history if h["step"] > self.best["step"])
        if self.patience is not None and since >= self.patience:
            self.stopped_at = step
            recipe.progress(
                f"held-out: no gain in {since} evaluation(s) since step {self.best['step']}: stopping (--patience)"
            )
            return True
        return False

    def _save(self, folder: Path) -> None:
        """The best weights beside the run's checkpoints (`best-<step>`), so a resumed run still writes them: written
        whole in a temporary folder, then renamed, so an interrupt or a full disk leaves the previous best intact."""
        make_checkpoint_folder(folder)
        step = self.best["step"]
        tmp = folder / f".{BEST_DIR}-{step:07d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            save_tensors(tmp / "model.safetensors", {k: v.contiguous() for k, v in self.best_state.items()})
            write_json(tmp / "best.json", {**self.best, "history": self.history})
            publish_dir(tmp, best_dir(folder, step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(folder, step)

    @staticmethod
    def _prune(folder: Path, newest: int) -> None:
        """Drop the best weights no resume can ask for: a resume starts from the latest complete checkpoint and needs
        the best its held-out history names (`restore`); every later one is kept too (the next checkpoint names it)."""
        latest = sorted(p for p in folder.glob("step-*") if (p / parallel.STATE_FILE).is_file())
        needed = newest
        if latest:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                state = json.loads((latest[-1] / parallel.STATE_FILE).read_text())
                history = [h for h in state.get("heldout", []) if h["step"] <= state["step"]]
                needed = max(history, key=lambda h: h["score"])["step"] if history else newest
        for old in folder.glob(f"{BEST_DIR}-*"):
            if old.name[len(BEST_DIR) + 1 :].isdigit() and int(old.name[len(BEST_DIR) + 1 :]) < min(needed, newest):
                shutil.rmtree(old, ignore_errors=True)

    def restore(self, recipe: Any, start: int, history: list[dict[str, Any]]) -> None:
        """On --resume: the held-out history the checkpoint recorded, and the best weights when they were found at
        or before its step (a best found later is found again: the run is deterministic)."""
        from safetensors.torch import load_file

        folder = recipe.job.checkpoints
        self.history = [h for h in history if h["step"] <= start]
        if not self.history:
            return
        top = max(self.history, key=lambda h: h["score"])  # the first of equal scores, as `update` keeps it
        self.best = {k: top[k] for k in ("step", "score", "accuracy")}
        if not recipe.par.is_main:
            return
        # `best/` is where older versions kept the one best so far
        for saved in (best_dir(folder, self.best["step"]), folder / BEST_DIR):
            found = (saved / "best.json").is_file() and (saved / "model.safetensors").is_file()
            if found and read_json_object(saved / "best.json", DraftError).get("step") == self.best["step"]:
                self.best_state = load_file(str(saved / "model.safetensors"))
                check_tensors(saved / "model.safetensors", self.best_state, action="start over with --overwrite")
                return
        raise DataError(
            f"{best_dir(folder, self.best['step'])} does not hold the best held-out weights (step "
            f"{self.best['step']}): resume without --heldout, or start over with --overwrite"
        )

    def record(self) -> dict[str, Any]:
        """What the written draft's provenance says about the guard."""
        return {
            "file": str(self.path),
            "examples": self.teacher.size,
            "every": self.every,
            "patience": self.patience,
            "score": "implied acceptance length: sum_j prod_{i<=j} (teacher-forced top-1 agreement at TTT step i)",
            "history": self.history,
            "best_step": self.best["step"] if self.best else None,
            "stopped_at": self.stopped_at,
        }
