"""Code that runs inside vLLM's own venv, never imported by mtp2draft.

`engines/vllm_dump.py` starts `dump_driver.py` by path with that venv's Python and puts this directory on its
PYTHONPATH (`vllm_launch.VLLM_SIDE`), so vLLM's workers can import `mtp2draft_cpu_hidden_states` (a kv-connector
module, vLLM's `kv_connector_module_path`); `engines/vllm_serve.py` does the same for `serve_driver.py` (evaluate
--engine vllm, --regenerate, the engine tests, the benchmark). Both drivers end through `driver_exit.leave`.
These files import only the standard library, torch, safetensors and vllm.
"""
