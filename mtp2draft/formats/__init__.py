"""Export formats: one module per format family (the files a serving engine loads for a draft).

What this package does not do: convert, train or evaluate drafts.
"""

from __future__ import annotations

from ..kinds import DraftKind

# format -> the draft kind it takes (`mtp2draft export --format` choices come from here)
FORMATS: dict[str, DraftKind] = {
    "sglang": DraftKind.EAGLE3,
    "speculators": DraftKind.EAGLE3,
    "nextn": DraftKind.MTP,
    "stitched": DraftKind.MTP,
}
# `validate` also knows mtp2draft's own native draft directory (`convert --to mtp`, `distill`).
VALIDATE_FORMATS = (*FORMATS, "mtp")


def format_kind(fmt: str) -> DraftKind:
    """The kind of draft a format (any of `VALIDATE_FORMATS`: "mtp" is the native draft directory) holds."""
    return FORMATS[fmt] if fmt in FORMATS else DraftKind(fmt)
