"""Shared test fixtures: tiny hub-layout checkpoints (built once per session) and the loopback Hub.

Every test runs offline: HF_ENDPOINT points at a closed loopback port unless a test activates the loopback Hub, so a
stray call to the real Hub fails at once instead of hanging.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ.pop("MTP2DRAFT_DEBUG", None)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def build(fixture_root: Path):
    """build(name, **options) -> path of fixture checkpoint `name`, built once per distinct options."""
    from support.fixtures import build_fixture

    made: dict[tuple, Path] = {}

    def _build(name: str, **options) -> Path:
        key = (name, tuple(sorted(options.items())))
        if key not in made:
            suffix = "-".join(f"{k}{v}" for k, v in sorted(options.items())).replace("/", "_")
            made[key] = build_fixture(name, fixture_root / (name + ("-" + suffix if suffix else "")), **options)
        return made[key]

    return _build


@pytest.fixture(scope="session")
def target(build):
    """target(name) -> a fixture checkpoint that also has a (character-level, ChatML) tokenizer: a runnable target."""
    from support.fixtures import write_char_tokenizer

    def _target(name: str, **options) -> Path:
        path = build(name, **options)
        if not (path / "tokenizer.json").is_file():
            write_char_tokenizer(path)
        return path

    return _target


@pytest.fixture(scope="session")
def text_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small JSONL of Python-like text records (deterministic)."""
    import json
    import random

    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    lines = []
    for _ in range(24):
        body = "\n".join(f"def f{j}(x):\n    return x + {rng.randint(0, 9)}" for j in range(rng.randint(2, 4)))
        lines.append(json.dumps({"text": body}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """A loopback Hub the real huggingface_hub client talks to, with a fresh HF cache and range cache."""
    from huggingface_hub import constants
    from support.hub_server import HubServer

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(cache))
    monkeypatch.setenv("MTP2DRAFT_CACHE", str(cache / "mtp2draft"))
    with HubServer() as server, server.activate():
        yield server
