"""Dump a target's hidden states and top-k log-probs with vLLM's own extraction; runs under vLLM's Python.

    python dump_driver.py REQUEST.json REPLY.json

Request: {"model": dir, "dtype": str, "max_model_len": L, "tensor_parallel_size": N, "layer_ids": [vLLM ids],
          "top_k": k, "sequences": [[token ids]], "out": dir, "connector": "cpu" | "stock", "chunk": n}
Writes, per sequence n (0-based, request order): `{out}/{n}.hidden.safetensors` (vLLM's connector file:
"hidden_states" [T, len(layer_ids), H] in ascending layer-id order, "token_ids" [T]) and `{out}/{n}.logprobs
.safetensors` ("topk_logprobs" [T, k] fp32, "topk_ids" [T, k] int64: row p is the target's distribution of the
token after p). Reply: {"vllm_version": str, "sequences": n}.

Facts from vLLM 0.32.0 this relies on (besides those in mtp2draft_cpu_hidden_states.py):
- `SamplingParams(prompt_logprobs=k)` gives, for prompt positions 1..T-1, the top-k log-probs of the distribution
  that predicted that token, plus the prompt token itself when it is not among them (entry 0 is None); the
  sampled token's `logprobs=k` give position T-1's row. They are log-softmax of the raw logits (`logprobs_mode`
  default "raw_logprobs"); `LLM(max_logprobs=k)` must allow k;
- the connector saves a finished request's states on the engine's NEXT step (the scheduler hands the pending save
  to the worker with the next step's metadata), so after the last `generate` the driver runs a one-token request
  until every file is there; `kv_transfer_params["hidden_states_path"]` of each output names its file, and the
  file's `.lock` is held exclusively until it is complete.

What it does not do: decide which layers to read or apply any norm (`mtp2draft.engines.vllm_dump` does), or sample.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time

try:  # run by vLLM's Python: beside this file (vllm_side/, on PYTHONPATH)
    from cpu_fixes import apply as apply_cpu_fixes
    from cpu_fixes import engine_options
    from stream_capture import apply as apply_stream_capture
except ImportError:  # imported as part of mtp2draft (its unit tests)
    from mtp2draft.engines.vllm_side.cpu_fixes import apply as apply_cpu_fixes
    from mtp2draft.engines.vllm_side.cpu_fixes import engine_options
    from mtp2draft.engines.vllm_side.stream_capture import apply as apply_stream_capture

# at import, so vLLM's spawned workers, which re-import this file, apply them too (what mtp2draft's side asked for)
CPU_FIXES = apply_cpu_fixes() + apply_stream_capture()

PUMP_TRIES = 20


def topk_rows(rows: list, k: int):
    """[{token id: Logprob}] * T -> (values [T, k] fp32, ids [T, k] int64), each row sorted by log-prob, highest
    first (vLLM adds the prompt token to a row when it is not among the top k: the k largest are kept)."""
    import torch

    values = torch.empty(len(rows), k, dtype=torch.float32)
    ids = torch.empty(len(rows), k, dtype=torch.int64)
    for p, row in enumerate(rows):
        best = sorted(row.items(), key=lambda item: -item[1].logprob)[:k]
        if len(best) < k:
            raise RuntimeError(f"vLLM returned {len(best)} log-probs for a position, {k} were asked for")
        ids[p] = torch.tensor([t for t, _ in best])
        values[p] = torch.tensor([lp.logprob for _, lp in best])
    return values, ids


def wait_complete(path: str) -> None:
    """Until the connector's writer releases the file's lock (it holds it exclusively while writing)."""
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)


def start_engine(req: dict):
    """vLLM's LLM with hidden-state extraction and the connector that writes the states under `req["out"]`."""
    from vllm import LLM

    store = os.path.join(req["out"], "connector")
    kv = {"kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": store}}
    if req["connector"] == "cpu":
        kv.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="mtp2draft_cpu_hidden_states")
    else:
        kv.update(kv_connector="ExampleHiddenStatesConnector")
    return LLM(
        model=req["model"],
        dtype=req["dtype"],
        seed=0,
        max_model_len=int(req["max_model_len"]),
        tensor_parallel_size=int(req["tensor_parallel_size"]),
        enforce_eager=True,
        generation_config="vllm",
        trust_remote_code=False,
        max_logprobs=int(req["top_k"]),
        # the speculative config, and the reference MLA backend on CPU for an MLA target (cpu_fixes)
        **engine_options(
            {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,  # the method asserts 1 (ExtractHiddenStatesProposer.__init__)
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(req["layer_ids"])}},
            }
        ),
        kv_transfer_config=kv,
    )


def main(argv: list[str]) -> int:
    request_path, reply_path = argv  # engines.vllm_dump.VllmTarget passes exactly these two
    with open(request_path) as f:
        req = json.load(f)
    import vllm
    from safetensors.torch import save_file
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out, k = req["out"], int(req["top_k"])
    llm = start_engine(req)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k, logprobs=k)
    sequences, chunk = req["sequences"], int(req.get("chunk", 256))
    files: dict[int, str] = {}
    for start in range(0, len(sequences), chunk):
        prompts = [TokensPrompt(prompt_token_ids=list(s)) for s in sequences[start : start + chunk]]
        for n, o in enumerate(llm.generate(prompts, params, use_tqdm=False), start):
            files[n] = o.kv_transfer_params["hidden_states_path"]
            rows = list(o.prompt_logprobs[1:]) + [o.outputs[0].logprobs[0]]
            values, ids = topk_rows(rows, k)
            save_file({"topk_logprobs": values, "topk_ids": ids}, os.path.join(out, f"{n}.logprobs.safetensors"))
        print(f"[dump_driver] {min(start + chunk, len(sequences))}/{len(sequences)} sequences", file=sys.stderr)
    pump = [TokensPrompt(prompt_token_ids=[int(sequences[0][0])])]
    for _ in range(PUMP_TRIES):
        if all(os.path.exists(p) for p in files.values()):
            break
        llm.generate(pump, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        time.sleep(0.1)
    for n, path in files.items():
        if not os.path.exists(path):
            raise RuntimeError(f"vLLM's connector wrote no hidden states for sequence {n} ({path})")
        wait_complete(path)
        os.replace(path, os.path.join(out, f"{n}.hidden.safetensors"))
    with open(reply_path, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "cpu_fixes": CPU_FIXES, "sequences": len(files)}, f)
    with contextlib.suppress(Exception):  # best effort, as in the serving driver: the engine core exits with us too
        llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":  # vLLM spawns workers that re-import this file
    from driver_exit import leave  # beside this file; engines/vllm_dump.py puts this directory on PYTHONPATH

    leave(main(sys.argv[1:]))
