"""Export formats: one module per format family (the files a serving engine loads for a draft).

What this package does not do: convert, train or evaluate drafts.
"""

from __future__ import annotations

# format -> the draft kind it takes (`mtp2draft export --format` choices come from here)
FORMATS: dict[str, str] = {"sglang": "eagle3", "speculators": "eagle3", "nextn": "mtp", "stitched": "mtp"}
# `validate` also knows mtp2draft's own native draft directory (`convert --to mtp`, `distill`).
VALIDATE_FORMATS = (*FORMATS, "mtp")
