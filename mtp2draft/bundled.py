"""Where the repository's bundled targets and data are (`examples/`), and whether they are there: a repository
checkout has them, an installed wheel does not (so the CLI does not offer `demo` there). Also the demo's default
step count, which the CLI's `demo --steps` and `pipeline.demo` share.

What this module does not do: read or build a target.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_TARGET = REPO_ROOT / "examples" / "targets" / "tiny-deepseek-v3"
BUNDLED_DATA = REPO_ROOT / "examples" / "data"
# Distillation steps `demo` runs by default (docs/results.md's demo settings).
DEMO_STEPS = 150


def has_bundled_target() -> bool:
    """Whether the demo's target is on disk (a repository checkout; not an installed wheel)."""
    return (BUNDLED_TARGET / "config.json").is_file()
