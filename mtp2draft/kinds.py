"""The enumerations every stage shares, defined once: the two kinds of draft mtp2draft makes (`DraftKind`, the
`convert --to` choices) and the one detector of a draft's kind from its config.json; where a hidden state is taken
(`Hidden`: post_norm / pre_norm); the weight dtypes it writes; the draft directory's file names. Torch-free, so that
the CLI can list choices without loading a model library.

A kind is also the speculative-decoding method an engine runs the draft with (`[engines.*] methods` in the specs).

What this module does not do: build or load drafts (`draft/modules.py`), or tell export formats apart (`formats`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from mtp2draft.errors import DraftError


class DraftKind(StrEnum):
    """A StrEnum: compares, formats and serialises (JSON) as its plain value, "mtp" or "eagle3"."""

    MTP = "mtp"  # the native MTP layer (NativeMtpDraft)
    EAGLE3 = "eagle3"  # an EAGLE-3 layer in SGLang's LlamaForCausalLMEagle3 layout (Eagle3Draft)

    @property
    def a_draft(self) -> str:
        """For messages: "a native MTP" / "an EAGLE-3" (followed by "draft")."""
        return "an EAGLE-3" if self is DraftKind.EAGLE3 else "a native MTP"


DRAFT_KINDS = tuple(k.value for k in DraftKind)


class Hidden(StrEnum):
    """Where a hidden state is taken, relative to a final RMSNorm: the target's hidden a draft reads at step 0
    (`[layer] hidden`, an engine's `hidden`), and the hidden a native draft hands to its next step (`handover`)."""

    POST_NORM = "post_norm"  # after the norm (DeepSeek's hnorm input; the normed output a draft hands on)
    PRE_NORM = "pre_norm"  # before it (the raw residual stream)


HIDDEN_PLACES = tuple(h.value for h in Hidden)
# The weight dtypes mtp2draft writes (`convert --dtype`, `export --dtype`, a draft config.json's `torch_dtype`); their torch
# dtypes: `io.TORCH_DTYPES`.
DTYPE_NAMES = ("bfloat16", "float16", "float32")

# How a draft proposes at a temperature (`evaluate --draft-sampling`, vLLM's draft_sample_method; see evaluation/sampling.py)
DRAFT_SAMPLING = ("greedy", "sample")
# A draft directory (`convert`, `distill`, the EAGLE-3 exports) holds these.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "provenance.json"
# what the commands do with a DSpark drafter today, said by every refusal of one
SUPPORTED_SO_FAR = (
    "so far mtp2draft reads DSpark drafters with `inspect` and `convert` (into a dspark draft directory) and "
    "distills speculators-format ones; evaluate and export do not take them yet"
)
DSPARK_KIND = "dspark"  # a DSpark drafter's directory (`conversion.dspark`); no stage takes one yet
EVALUATION_FILE = "evaluation.json"  # `evaluate --save`: the measured acceptance `push` puts on the model card
ACCEPTANCE_CHART = "acceptance.png"  # drawn from evaluation.json beside it (evaluation/charts.py); the card links it
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


def detect_kind(cfg: Mapping[str, Any], hint: str = "") -> DraftKind:
    """The kind of draft a draft directory's config.json describes (either EAGLE-3 layout); DraftError otherwise,
    with `hint` (e.g. which commands write draft directories) appended."""
    kind = kind_of(cfg)
    if kind is None and cfg.get("draft_kind") == DSPARK_KIND:
        raise DraftError(f"config.json describes a DSpark draft directory: {SUPPORTED_SO_FAR}")
    if kind is None:
        raise DraftError(
            "config.json describes neither an mtp2draft native MTP draft nor an EAGLE-3 draft"
            + (f" ({hint})" if hint else "")
        )
    return kind
