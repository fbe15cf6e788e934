"""Fixtures of the engine tests (marker `engine`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vllm() -> Path:
    """vLLM's venv python (scripts/vllm_env.sh). Without it the engine tests skip, except under CI (`CI` set), where
    they fail."""
    from mtp2draft.target.engine import EngineUnavailable
    from mtp2draft.testing.engine import vllm_python

    try:
        return vllm_python()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: CI must run the engine tests (.ci/run creates the venv)")
        pytest.skip(str(exc))
