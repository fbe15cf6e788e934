"""What distill refuses before any work, written once: the held-out guard's options, `--steps 0` where nothing is
calibrated, and `--serving-engine` / `--hidden-handover` for a draft kind and family. `distill` checks them on the
loaded draft (`recipe.configure_draft`), `run` before anything is fetched.

What this module does not do: train, or check the data and dumps (`data.py`, `target/dump_checks.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtp2draft.errors import DataError, OptionError
from mtp2draft.family.schema import ENGINES
from mtp2draft.kinds import HIDDEN_PLACES, DraftKind
from mtp2draft.train.settings import DistillConfig

# distill without a draft directory: `distill` and `distill --plan` refuse it alike
NEEDS_DRAFT = "distill needs a draft directory (or --new-dspark LAYERS to start a DSpark drafter)"


def check_heldout_options(cfg: DistillConfig, heldout: str | Path | None, hidden_states: str | Path | None) -> None:
    """The held-out guard's options: it scores with the online target, and --patience stops on its scores."""
    if heldout is not None and hidden_states is not None:
        raise OptionError("--heldout needs the online target (--target and --data), not --hidden-states")
    if cfg.patience is not None and heldout is None:
        raise OptionError("--patience stops on held-out acceptance: it needs --heldout")


def refuse_untrained(cfg: DistillConfig, calibrates: bool) -> None:
    """`--steps 0` only makes sense where distill calibrates something (an EAGLE-3 draft converted from MTP): anything
    else would write an untrained copy. `run` calls it before anything is fetched (`calibrates`: an EAGLE-3 run)."""
    if cfg.steps == 0 and not calibrates:
        raise OptionError(
            "--steps 0 would write an untrained draft: 0 steps only calibrate an EAGLE-3 draft converted from MTP"
        )


def check_training_settings(kind: str, spec: Any, cfg: DistillConfig, layers: int = 1) -> None:
    """`--serving-engine` and `--hidden-handover` make sense for a draft of `kind` (of `layers` MTP layers: a chain
    when > 1) for `spec`'s family (None: the draft names none): distill checks it on the loaded draft, `run` before
    anything is fetched. An engine whose rule for the family's chain is "neither" cannot be trained for with a
    chain."""
    if cfg.serving_engine is not None:
        if spec is None:
            raise DataError(
                "--serving-engine needs a draft converted by mtp2draft (its config names the target's spec)"
            )
        if cfg.serving_engine not in ENGINES:
            raise DataError(f"--serving-engine must be one of {', '.join(ENGINES)}, got {cfg.serving_engine!r}")
        if not spec.serves(cfg.serving_engine, kind):
            facts = spec.engine(cfg.serving_engine)
            raise DataError(
                f"{cfg.serving_engine} {facts.version if facts else ''} cannot serve a {kind} draft for {spec.name} targets "
                f"(spec {spec.path}: [engines.{cfg.serving_engine}] methods = {list(facts.methods) if facts else []})"
            )
        if not spec.runs(cfg.serving_engine, kind, layers):
            raise DataError(spec.no_chain(cfg.serving_engine, layers))
    if cfg.hidden_handover is not None:
        if kind != DraftKind.MTP:
            raise DataError(
                "--hidden-handover applies to native MTP drafts (EAGLE-3 always hands on the pre-norm output)"
            )
        if cfg.hidden_handover not in HIDDEN_PLACES:
            raise DataError(f"--hidden-handover must be {' or '.join(HIDDEN_PLACES)}, got {cfg.hidden_handover!r}")
