"""The acceptance chart under the name `evaluation/decode.py` imports it by: `formats/charts.py` draws it.

What this module does not do: define anything.
"""

from __future__ import annotations

from mtp2draft.formats.charts import ACCEPTANCE_CHART, acceptance_png

__all__ = ["ACCEPTANCE_CHART", "acceptance_png"]
