"""The MTP key lists of real releases, as committed test data (`tests/data/hub_keys/<family>.json`), and the diff of a
fixture's MTP keys against them.

A fixture writes its MTP tensors through the spec's own inverse mapping, so a test that reads the fixture back with
the same spec proves nothing about the hub layout. Each data file holds the key list of a released checkpoint taken
from a stored copy of its `model.safetensors.index.json` (or a weights report of the release), with the source cited
in the file. Keys are compared as patterns: the MTP layer's index becomes `{n}` (the fixture has 2 trunk layers, the
release 47 or 78) and an expert index becomes `{e}` (the fixture has 8 experts, the release 64 or 256).

What this module does not do: build fixtures (`fixtures.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "hub_keys"

_EXPERT = re.compile(r"\.experts\.\d+\.")


def load(family: str) -> dict[str, Any]:
    return json.loads((DATA_DIR / f"{family}.json").read_text())


def pattern(key: str, layer_prefix: str) -> str:
    """`key` with the MTP layer's prefix replaced by `{n}.` (when it starts with it) and expert indices by `{e}`."""
    if layer_prefix and key.startswith(layer_prefix):
        key = "{n}." + key[len(layer_prefix) :]
    return _EXPERT.sub(".experts.{e}.", key)


def patterns(keys: Iterable[str], layer_prefix: str) -> set[str]:
    return {pattern(k, layer_prefix) for k in keys}


def experts(keys: Iterable[str]) -> set[int]:
    """Expert indices present among `keys`."""
    return {int(m.group(0).split(".")[2]) for k in keys if (m := _EXPERT.search(k))}
