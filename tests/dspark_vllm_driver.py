"""Run by vLLM's own Python (tests/testing/test_engine_dspark.py): read a `speculators-dspark` export with vLLM's own
code, ask vLLM to configure an engine that serves it, and load its weights into vLLM's own module tree. Imports only
the standard library, torch, safetensors and vllm.

    python dspark_vllm_driver.py EXPORT_DIR OUT_DIR

Writes OUT_DIR/reply.json: {"vllm_version", "pre_trained_config": what
`SpeculatorsConfig.extract_transformers_pre_trained_config` builds, "speculative_config":
`extract_vllm_speculative_config`'s dict, "has_triton": vllm.triton_utils.HAS_TRITON, "engine_config_error": the
error `EngineArgs(model=EXPORT_DIR).create_engine_config()` raises (null: none), "parameters": the parameter names of
vLLM's `Qwen3DSparkForCausalLM` as that config builds it}, and OUT_DIR/loaded.safetensors: its parameters after its
own `load_weights` read the export's model.safetensors. To build the module tree on the CPU build, the V1 model
runner's refusal of DSpark is skipped (the model is only built and loaded, never run).
"""

from __future__ import annotations

import copy
import json
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(path: str, out: str) -> None:
    import torch
    import vllm
    from safetensors.torch import load_file, save_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig
    from vllm.triton_utils import HAS_TRITON

    with open(f"{path}/config.json") as fh:
        config = json.load(fh)
    pre = SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(config))
    spec = SpeculatorsConfig.extract_vllm_speculative_config(copy.deepcopy(config))
    args = {"model": path, "dtype": "float32", "max_model_len": 256, "enforce_eager": True}
    error = None
    try:
        EngineArgs(**args).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        error = f"{type(exc).__name__}: {exc}"
    VllmConfig._validate_v1_model_runner = lambda self: None  # build the module tree only
    vllm_config = EngineArgs(**args).create_engine_config()
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{_free_port()}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
        from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

        torch.set_default_dtype(torch.float32)
        model = Qwen3DSparkForCausalLM(vllm_config=vllm_config, prefix="")
        model.load_weights(load_file(f"{path}/model.safetensors").items())
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, f"{out}/loaded.safetensors")
    reply = {"vllm_version": vllm.__version__, "pre_trained_config": pre, "speculative_config": spec,
             "has_triton": bool(HAS_TRITON), "engine_config_error": error,
             "speculative_method": vllm_config.speculative_config.method,
             "num_speculative_tokens": vllm_config.speculative_config.num_speculative_tokens,
             "parameters": [n for n, _ in model.named_parameters()]}  # fmt: skip
    with open(f"{out}/reply.json", "w") as fh:
        json.dump(reply, fh, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
