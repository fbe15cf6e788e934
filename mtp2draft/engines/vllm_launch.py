"""How mtp2draft starts vLLM: the Python of its own venv, the directory of the drivers that Python runs
(`vllm_side/`), and the environment a driver runs in. Dumping (`vllm_dump`) and serving (`vllm_serve`) both start
vLLM through these, so the two runs see the same environment and the same CPU-build fixes.

What this module does not do: install vLLM (`environments.py`), write a driver's request or read its reply
(`vllm_dump`, `vllm_serve`), or import vllm (its transformers pin is not mtp2draft's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mtp2draft.engines import environments

VLLM_SIDE = Path(__file__).with_name("vllm_side")  # run by vLLM's Python, never imported here


def vllm_python() -> Path:
    """The Python of a complete vLLM venv (`mtp2draft engine install vllm`), else EngineUnavailable."""
    return environments.python("vllm")


def vllm_environment(
    kv_cache_gib: int = 1, pythonpath: Path | None = None, model: str | Path | None = None
) -> dict[str, str]:
    """The environment vLLM's subprocess runs in: nothing of mtp2draft's venv leaks into it (PYTHONPATH is only
    `pythonpath`); on the CPU build (vLLM 0.32.0) the KV cache size must be given and thread binding is off. For an
    MLA `model` it asks the drivers for the CPU build's rotary-embedding fix (`vllm_side/cpu_fixes.py`: without it
    vLLM's CPU build computes another model; a GPU build ignores the request), and for every model the rejection
    sampler's expand fix (without it the CPU build's temperature > 0 acceptance and recovered tokens come from logits
    divided by uninitialised memory)."""
    from mtp2draft.engines.vllm_side.cpu_fixes import NATIVE_EXPAND, NATIVE_ROPE

    env = dict(os.environ)
    if model is not None and uses_mla(Path(model)):
        env[NATIVE_ROPE] = "1"
    env.setdefault(NATIVE_EXPAND, "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def uses_mla(model: Path) -> bool:
    """Whether the checkpoint at `model` has multi-head latent attention (DeepSeek-style `kv_lora_rank`)."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(isinstance(text, dict) and text.get("kv_lora_rank"))
