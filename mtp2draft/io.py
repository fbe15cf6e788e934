"""The output and progress helpers under the one name `evaluation/decode.py` imports them by. Each lives in its own
module: `outputs/` (claims, identity), `manifest.py` (`write_json`) and `progress.py`.

What this module does not do: define anything. New code imports from those modules.
"""

from __future__ import annotations

from mtp2draft.manifest import write_json
from mtp2draft.outputs.claims import being_written, claim_output
from mtp2draft.outputs.identity import dir_identity
from mtp2draft.progress import Progress, meter, quiet

__all__ = ["Progress", "being_written", "claim_output", "dir_identity", "meter", "quiet", "write_json"]
