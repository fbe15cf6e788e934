"""What the hostile-case tables compare before and after a command: every path under some roots, never followed.

One helper for tests/test_bad_inputs.py, test_bad_commands.py and test_bad_dumps.py (they had three copies that
differed in how they saw links): `lstat` throughout, so a link (broken or not) is recorded as a link, not as what it
points to, and a new link is as visible as a new file.
"""

from __future__ import annotations

import stat
from pathlib import Path


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of each regular file; (-1, 0) for a directory, (-2, 0) for a link."""
    files: dict[str, tuple[int, int]] = {}
    for root in roots:
        for p in root.rglob("*"):
            info = p.lstat()
            if stat.S_ISLNK(info.st_mode):
                files[str(p)] = (-2, 0)
            elif stat.S_ISREG(info.st_mode):
                files[str(p)] = (info.st_size, info.st_mtime_ns)
            else:
                files[str(p)] = (-1, 0)
    return files
