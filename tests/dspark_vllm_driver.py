"""Run by vLLM's own Python (tests/testing/test_engine_dspark.py): read a `speculators-dspark` export with vLLM's own
functions and ask vLLM to configure an engine that serves it. Imports only the standard library and vllm.

    python dspark_vllm_driver.py EXPORT_DIR REPLY.json

Reply: {"vllm_version", "pre_trained_config": what `SpeculatorsConfig.extract_transformers_pre_trained_config` builds,
"speculative_config": `extract_vllm_speculative_config`'s dict, "has_triton": vllm.triton_utils.HAS_TRITON,
"engine_config_error": the error `EngineArgs(model=EXPORT_DIR).create_engine_config()` raises (null: none)}."""

from __future__ import annotations

import copy
import json
import sys


def main(path: str, reply: str) -> None:
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig
    from vllm.triton_utils import HAS_TRITON

    with open(f"{path}/config.json") as fh:
        config = json.load(fh)
    pre = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(config))
    spec = SpeculatorsConfig.extract_vllm_speculative_config(copy.deepcopy(config))
    error = None
    try:
        EngineArgs(model=path, dtype="float32", max_model_len=256).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        error = f"{type(exc).__name__}: {exc}"
    out = {"vllm_version": vllm.__version__, "pre_trained_config": pre, "speculative_config": spec,
           "has_triton": bool(HAS_TRITON), "engine_config_error": error}  # fmt: skip
    with open(reply, "w") as fh:
        json.dump(out, fh, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
