"""Draft kinds and the draft directory's file names: the two kinds of draft mtp2draft makes (`DraftKind`, the `convert --to` choices) and the one detector
of a draft's kind from its config.json. Torch-free, so that the CLI can list kinds without loading a model library.

A kind is also the speculative-decoding method an engine runs the draft with (`[engines.*] methods` in the specs).

What this module does not do: build or load drafts (`draft.py`), or tell export formats apart (`formats`).
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
# A draft directory (`convert`, `distill`, the EAGLE-3 exports) holds these.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "provenance.json"
# config.json markers: mtp2draft's native draft says `draft_kind: mtp`; an EAGLE-3 draft carries SGLang's
# architecture, or is vLLM's speculators layout of one.
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def detect_kind(cfg: Mapping[str, Any], hint: str = "") -> DraftKind:
    """The kind of draft a draft directory's config.json describes (either EAGLE-3 layout); DraftError otherwise,
    with `hint` (e.g. which commands write draft directories) appended."""
    if cfg.get("draft_kind") == DraftKind.MTP:
        return DraftKind.MTP
    if EAGLE3_ARCHITECTURE in (cfg.get("architectures") or []) or cfg.get("speculators_model_type") == "eagle3":
        return DraftKind.EAGLE3
    raise DraftError(
        "config.json describes neither an mtp2draft native MTP draft nor an EAGLE-3 draft"
        + (f" ({hint})" if hint else "")
    )
