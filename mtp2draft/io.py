"""The output and progress helpers under the one name the engine modules (`target/backend.py`,
`target/environments.py`, `evaluation/backend.py`) and `evaluation/decode.py` import them by. Each lives in its own
module: `outputs/` (directories, claims, identity), `manifest.py` (`write_json`) and `progress.py`.

What this module does not do: define anything. New code imports from those modules.
"""

from __future__ import annotations

from mtp2draft.manifest import write_json
from mtp2draft.outputs.claims import being_written, claim_output, lock_path
from mtp2draft.outputs.directories import check_output_dir
from mtp2draft.outputs.identity import dir_identity
from mtp2draft.progress import Progress, meter, quiet

__all__ = [
    "Progress",
    "being_written",
    "check_output_dir",
    "claim_output",
    "dir_identity",
    "lock_path",
    "meter",
    "quiet",
    "write_json",
]
