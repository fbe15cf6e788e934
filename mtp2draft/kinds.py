"""Draft kinds: the two kinds of draft mtp2draft makes (`convert --to` choices), torch-free so that the CLI can list
them without loading a model library.

What this module does not do: build or load drafts (`draft.py`).
"""

from __future__ import annotations

DRAFT_KINDS = ("mtp", "eagle3")
