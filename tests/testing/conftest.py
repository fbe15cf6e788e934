"""Fixtures of the engine tests (marker `engine`): the engines' own venvs. Without one the tests that need it skip,
except under CI (`CI` set), where they fail (.ci/run creates both)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def _venv_python(find: Callable[[], Path]) -> Path:
    from mtp2draft.engines.environments import EngineUnavailable

    try:
        return find()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: CI must run the engine tests (.ci/run creates the venv)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def vllm() -> Path:
    """vLLM's venv python (`mtp2draft engine install vllm`)."""
    from support.engine import vllm_python

    return _venv_python(vllm_python)


@pytest.fixture(scope="session")
def speculators() -> Path:
    """speculators' venv python (`mtp2draft engine install speculators`)."""
    from support.engine import speculators_python

    return _venv_python(speculators_python)
