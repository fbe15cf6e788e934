"""The engine tests' and benchmarks' view of vLLM: creating its venv on demand and comparing figures; and where
speculators' own venv is (the `speculators-mtp` engine test loads exports with speculators itself).

The harness itself (served views, speculative configs, `run_vllm` and the driver it starts in vLLM's venv) is
`mtp2draft.engines.vllm_serve`, which `evaluate --engine vllm` uses; this module only adds what tests need.

What this module does not do: install vLLM or speculators (`mtp2draft.engines.environments` does) or anything a user's
command needs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtp2draft.engines import environments
from mtp2draft.engines.vllm_serve import EngineRun, EngineSetup, Generation, run_vllm

VLLM_VERSION = "0.32.0"  # the version the engine tests' facts were read from


def vllm_python(create: bool = False) -> Path:
    """The Python of a complete vLLM venv; with `create`, build it first (`mtp2draft engine install vllm`:
    idempotent, minutes the first time). Raises EngineUnavailable when there is none."""
    if create:
        environments.install("vllm", platform="cpu")
    return environments.python("vllm")


def speculators_python() -> Path:
    """The Python of a complete speculators venv ($MTP2DRAFT_SPECULATORS_VENV, default
    ~/.cache/mtp2draft/speculators-venv), else EngineUnavailable."""
    return environments.python("speculators")


def relative_gap(ours: float, engine: float) -> float:
    """|engine - ours| / ours."""
    return abs(engine - ours) / ours


def main(argv: Sequence[str] | None = None) -> int:
    """`PYTHONPATH=tests python -m support.engine REQUEST.json`: run a request file (the driver's format) and print the
    reply, for trying a configuration by hand."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: PYTHONPATH=tests python -m support.engine REQUEST.json", file=sys.stderr)
        return 2
    req: Mapping[str, Any] = json.loads(Path(args[0]).read_text())
    runs = [EngineRun(r["name"], r["model"], r.get("speculative_config")) for r in req["runs"]]
    setup = EngineSetup(dtype=req.get("dtype", "float32"))
    version, results = run_vllm(runs, req["prompts"], Generation(max_new_tokens=req["max_new_tokens"]), setup)
    print(json.dumps({"vllm_version": version, "runs": {k: vars(v) for k, v in results.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
