"""The enumerations every stage shares, defined once: the two kinds of draft mtp2draft makes (`DraftKind`, the
`convert --to` choices) and the one detector of a draft's kind from its config.json; where a hidden state is taken
(`Hidden`: post_norm / pre_norm); the draft directory's file names. The weight dtype names are `dtypes`'. Torch-free, so that
the CLI can list choices without loading a model library.

A kind is also the speculative-decoding method an engine runs the draft with (`[engines.*] methods` in the specs).

What this module does not do: build or load drafts (`draft/modules.py`), or tell export formats apart (`formats`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from mtp2draft.dtypes import DTYPE_NAMES  # noqa: F401 - read here by the engine modules
from mtp2draft.errors import DraftError


class DraftKind(StrEnum):
    """A StrEnum: compares, formats and serialises (JSON) as its plain value, "mtp" or "eagle3"."""

    MTP = "mtp"  # the native MTP layer (NativeMtpDraft)
    EAGLE3 = "eagle3"  # an EAGLE-3 layer in SGLang's LlamaForCausalLMEagle3 layout (Eagle3Draft)
    DSPARK = "dspark"  # a DSpark block drafter (`conversion.dspark`, `draft.dspark_disk`); `export` takes it so far

    @property
    def a_draft(self) -> str:
        """For messages: "a native MTP" / "an EAGLE-3" (followed by "draft")."""
        return {DraftKind.EAGLE3: "an EAGLE-3", DraftKind.DSPARK: "a DSpark"}.get(self, "a native MTP")


# the kinds `convert --to` makes from an MTP layer (a DSpark drafter is converted as it is, never made)
DRAFT_KINDS = (DraftKind.MTP.value, DraftKind.EAGLE3.value)


class Hidden(StrEnum):
    """Where a hidden state is taken, relative to a final RMSNorm: the target's hidden a draft reads at step 0
    (`[layer] hidden`, an engine's `hidden`), and the hidden a native draft hands to its next step (`handover`)."""

    POST_NORM = "post_norm"  # after the norm (DeepSeek's hnorm input; the normed output a draft hands on)
    PRE_NORM = "pre_norm"  # before it (the raw residual stream)


HIDDEN_PLACES = tuple(h.value for h in Hidden)

# How a draft proposes at a temperature (`evaluate --draft-sampling`, vLLM's draft_sample_method; see evaluation/sampling.py)
DRAFT_SAMPLING = ("greedy", "sample")
# A draft directory (`convert`, `distill`, the EAGLE-3 exports) holds these.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "provenance.json"
# what the commands do with a DSpark drafter today, said by every refusal of one
SUPPORTED_SO_FAR = (
    "mtp2draft reads DSpark drafters with `inspect` and `convert` (into a dspark draft directory), distills and "
    "evaluates them, and writes them with `export` (speculators-dspark, stitched)"
)
DSPARK_KIND = DraftKind.DSPARK.value  # a DSpark drafter's directory (`conversion.dspark`, `draft.dspark_disk`)
EVALUATION_FILE = "evaluation.json"  # `evaluate --save`: the measured acceptance `push` puts on the model card
ACCEPTANCE_CHART = "acceptance.png"  # drawn from evaluation.json beside it (formats/charts.py); the card links it
TRAINING_CHART = "training.png"  # distill's loss and per-step top-1 curves, beside the distilled draft
# config.json markers: mtp2draft's native draft says `draft_kind: mtp`; an EAGLE-3 draft carries SGLang's
# architecture, or is vLLM's speculators layout of one.
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def kind_of(cfg: Mapping[str, Any]) -> DraftKind | None:
    """The kind of draft a config.json describes (a draft directory's, either EAGLE-3 layout), None for any other
    config (a checkpoint's, an export laid out as one)."""
    if cfg.get("draft_kind") == DraftKind.MTP:
        return DraftKind.MTP
    if EAGLE3_ARCHITECTURE in (cfg.get("architectures") or []) or cfg.get("speculators_model_type") == "eagle3":
        return DraftKind.EAGLE3
    return None


def is_dspark_dir(cfg: Mapping[str, Any]) -> bool:
    """Whether a config.json is a DSpark draft directory's: a release's stages as `convert` writes them
    (`draft_kind: dspark`) or a Qwen3-style drafter in speculators' dspark layout (`draft.dspark_disk`)."""
    return cfg.get("draft_kind") == DSPARK_KIND or cfg.get("speculators_model_type") == DSPARK_KIND


def is_dspark_draft(path: str | Path) -> bool:
    """Whether the directory `path` holds a DSpark draft (`is_dspark_dir` of its config.json); False for anything
    else, including a missing or unreadable config (the other kinds' loaders give their own messages)."""
    config = Path(path) / CONFIG_FILE
    try:
        cfg = json.loads(config.read_text()) if config.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and is_dspark_dir(cfg)


def detect_kind(cfg: Mapping[str, Any], hint: str = "") -> DraftKind:
    """The kind of draft a draft directory's config.json describes (either EAGLE-3 layout); DraftError otherwise,
    with `hint` (e.g. which commands write draft directories) appended."""
    kind = kind_of(cfg)
    if kind is None and is_dspark_dir(cfg):
        raise DraftError(
            f"config.json describes a DSpark draft directory, which this command does not take: {SUPPORTED_SO_FAR}"
        )
    if kind is None:
        raise DraftError(
            "config.json describes neither an mtp2draft native MTP draft nor an EAGLE-3 draft"
            + (f" ({hint})" if hint else "")
        )
    return kind
