"""Serve configurations of one target in vLLM and write their outputs, spec-decode metrics and timings as JSON.

This file runs under vLLM's own Python (its venv, `mtp2draft engine install vllm`), never in mtp2draft's: it imports only the
standard library and vllm, and is started by path by `mtp2draft.engines.vllm_serve.run_vllm`, which writes the
request and reads the reply:

    python serve_driver.py REQUEST.json REPLY.json

Request: {"prompts": [[token ids]], "max_new_tokens": N, "dtype": "auto" | "float32" | ..., "max_model_len": L,
          "tensor_parallel_size": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0, "ignore_eos": false,
          "rounds": [{"name": str, "size": n}] | null,
          "runs": [{"name": str, "model": dir, "speculative_config": {...} | null}]}
Reply:   {"vllm_version": str, "runs": [{"name", "outputs": [[ids]], "metrics": {...} | null, "start_s", "generate_s",
          "timing": {...}, "rounds": [{"name", "size", "timing"}], "error": str | null}]}

The runs share one process and start one engine each, in order (an engine start costs a minute or two on a small
CPU; the interpreter, torch and vllm are imported once). A run that fails to start or generate is reported with its
error and the next run goes on. Each engine first decodes all prompts for 8 tokens (a warm-up, uncounted), then all prompts
in one `generate` (their outputs, metrics and timing), then each of `rounds`: the first `size` prompts (cycled)
submitted at once, so `size` requests are in flight, timed only.

Metrics are the differences of `LLM.get_metrics()` counters across the counted `generate` (process-wide Prometheus
counters). Timings are the engine core's own timestamps per request (`RequestOutput.metrics`: scheduled, first and
last token), not this process's clock: time per output token is (last - first) / (tokens - 1) per request, the
throughput is all output tokens over the span from the first scheduling to the last token. Temperature 0 is greedy;
otherwise request n is seeded with seed * 1000003 + n (on the CPU build, which refuses per-request seeds, the
engine is seeded with seed instead). Prompts are token ids; `generation_config="vllm"` keeps
vLLM's defaults rather than the checkpoint's generation_config.json (so the only stop token is the tokenizer's eos,
as in `mtp2draft evaluate`, unless `ignore_eos`).

What it does not do: any comparison (the caller compares) or a server (the offline `LLM` API is what it drives).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import sys
import time
import traceback

try:  # run by vLLM's Python: beside this file (vllm_side/, on PYTHONPATH)
    from cpu_fixes import apply as apply_cpu_fixes
    from cpu_fixes import engine_options
except ImportError:  # imported as part of mtp2draft (its unit tests)
    from mtp2draft.engines.vllm_side.cpu_fixes import apply as apply_cpu_fixes
    from mtp2draft.engines.vllm_side.cpu_fixes import engine_options

# at import, so vLLM's spawned workers, which re-import this file, apply them too (what mtp2draft's side asked for)
CPU_FIXES = apply_cpu_fixes()

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(llm) -> dict:
    """Spec-decode counters summed over labels: {'drafts': n, ..., 'per_position': [n_1, ..., n_k]}."""
    out: dict = {v: 0 for v in SPEC_COUNTERS.values()}
    per_pos: list[int] = []
    for metric in llm.get_metrics():
        name = metric.name.removesuffix("_total")
        if name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[name]] += int(metric.value)
        elif name == PER_POSITION:
            values = list(metric.values)
            n = max(len(per_pos), len(values))
            per_pos = [
                a + b for a, b in zip(per_pos + [0] * (n - len(per_pos)), values + [0] * (n - len(values)), strict=True)
            ]
    out["per_position"] = per_pos
    return out


def metrics_between(before: dict, after: dict) -> dict:
    """What one `generate` added; mean acceptance length = 1 + accepted / drafts (bonus token included)."""
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    pos_before = before["per_position"] + [0] * (len(after["per_position"]) - len(before["per_position"]))
    per_pos = [a - b for a, b in zip(after["per_position"], pos_before, strict=True)]
    drafts = d["drafts"]
    return {
        **d,
        "accepted_per_position": per_pos,
        "acceptance_per_position": [p / drafts if drafts else 0.0 for p in per_pos],
        "mean_acceptance_length": 1.0 + d["accepted_tokens"] / drafts if drafts else None,
    }


def timing(stamps: list[dict]) -> dict | None:
    """Throughput and time per output token of one `generate` from the engine core's per-request stamps
    ({'scheduled', 'first', 'last', 'tokens'}, seconds on the engine core's monotonic clock)."""
    stamps = [s for s in stamps if s["tokens"] > 0 and s["last"] > 0]
    if not stamps:
        return None
    tokens = sum(s["tokens"] for s in stamps)
    span = max(s["last"] for s in stamps) - min(s["scheduled"] for s in stamps)
    tpot = [(s["last"] - s["first"]) / (s["tokens"] - 1) for s in stamps if s["tokens"] > 1]
    return {
        "requests": len(stamps),
        "output_tokens": tokens,
        "engine_s": round(span, 4),
        "output_tokens_per_s": tokens / span if span > 0 else None,
        "tpot_ms": 1000 * statistics.mean(tpot) if tpot else None,
    }


def stamps_of(outputs) -> list[dict]:
    out = []
    for o in outputs:
        m = getattr(o, "metrics", None)
        if m is None or not hasattr(m, "first_token_ts"):
            continue
        out.append(
            {
                "scheduled": m.scheduled_ts,
                "first": m.first_token_ts,
                "last": m.last_token_ts,
                "tokens": len(o.outputs[0].token_ids),
            }
        )
    return out


def run_one(run: dict, request: dict, log_path: str) -> dict:
    """One engine: start, generate, read metrics, shut down. Its own output and its workers' (they inherit the file
    descriptors) go to `log_path`; the lines that name errors come back as `log_errors` (an engine-core failure's
    exception says only "see root cause above"), those that report loaded weights as `log_loaded`."""
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            result = _run_one(run, request)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    with open(log_path) as log:
        lines = log.read().splitlines()
    result["log_errors"] = [line[-400:] for line in lines if "Error" in line][-20:]
    result["log_loaded"] = [
        line[-400:] for line in lines if "Loading weights took" in line or "Model loading took" in line
    ]
    if result["error"] is not None:  # vLLM's own log of a failed run, for the caller's failure message
        print("\n".join(lines[-80:]), file=sys.stderr)
    return result


def _params(request: dict, n: int, max_tokens: int):
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    temperature = float(request.get("temperature", 0.0))
    sampled = {"top_p": float(request.get("top_p", 1.0)), "seed": (int(request.get("seed", 0)) * 1_000_003 + n) % 2**63}
    if current_platform.is_cpu():
        # vLLM 0.32's CPU sampler refuses a per-request seed ("CPU Generator does not use offset"); the engine is
        # seeded with the request's seed instead (LLM(seed=...))
        del sampled["seed"]
    return SamplingParams(
        temperature=temperature,
        max_tokens=max_tokens,
        ignore_eos=bool(request.get("ignore_eos", False)),
        **(sampled if temperature > 0 else {}),
    )


def _generate(llm, request: dict, prompts: list, max_tokens: int):
    from vllm.inputs import TokensPrompt

    batch = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    params = [_params(request, n, max_tokens) for n in range(1, len(prompts) + 1)]
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    return outs, time.perf_counter() - t0


def _run_one(run: dict, request: dict) -> dict:
    from vllm import LLM

    result: dict = {"name": run["name"], "outputs": None, "metrics": None, "error": None, "rounds": []}
    spec = run.get("speculative_config")
    t0 = time.perf_counter()
    llm = None
    try:
        llm = LLM(
            model=run["model"],
            dtype=request.get("dtype", "auto"),
            seed=int(request.get("seed", 0)),
            max_model_len=int(request.get("max_model_len", 1024)),
            tensor_parallel_size=int(request.get("tensor_parallel_size", 1)),
            enforce_eager=True,
            generation_config="vllm",
            trust_remote_code=False,
            **engine_options(spec),  # spec, and the reference MLA backend on CPU for an MLA target (cpu_fixes)
            disable_log_stats=False,  # get_metrics() asserts "Stat logging disabled" otherwise (vLLM 0.32)
            **({"per_request_spec_decode_metrics": "summary"} if spec else {}),
        )
        result["start_s"] = round(time.perf_counter() - t0, 1)
        prompts, new = request["prompts"], int(request["max_new_tokens"])
        _generate(llm, request, prompts, min(new, 8))  # warm-up at the counted batch's shape, uncounted
        before = read_counters(llm)
        outs, seconds = _generate(llm, request, prompts, new)
        result["generate_s"] = round(seconds, 2)
        result["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
        result["timing"] = timing(stamps_of(outs))
        if spec:
            result["metrics"] = metrics_between(before, read_counters(llm))
            per_request = [getattr(o.outputs[0], "spec_decode_metrics", None) for o in outs]
            result["metrics"]["mean_acceptance_length_by_prompt"] = [
                None if m is None else round(m.to_dict()["mean_acceptance_length"], 3) for m in per_request
            ]
        for r in request.get("rounds") or []:
            size = int(r["size"])
            batch = [prompts[i % len(prompts)] for i in range(size)]
            outs, seconds = _generate(llm, request, batch, new)
            result["rounds"].append(
                {"name": r["name"], "size": size, "wall_s": round(seconds, 3), "timing": timing(stamps_of(outs))}
            )
    except Exception as exc:  # reported to the caller, which fails the check with it
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    finally:
        if llm is not None:
            with contextlib.suppress(Exception):  # best effort: the engine core also exits with its parent
                llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: serve_driver.py REQUEST.json REPLY.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        request = json.load(f)
    import vllm

    reply = {"vllm_version": vllm.__version__, "cpu_fixes": CPU_FIXES, "runs": []}
    for run in request["runs"]:
        print(f"[serve_driver] {run['name']}: starting", file=sys.stderr, flush=True)
        reply["runs"].append(run_one(run, request, f"{argv[1]}.{len(reply['runs'])}.log"))
        with open(argv[1], "w") as f:  # after every run: a crash later keeps what finished
            json.dump(reply, f)
    return 0


if __name__ == "__main__":  # vLLM spawns workers that re-import this file
    from driver_exit import leave  # this directory, which run_vllm puts on PYTHONPATH

    leave(main(sys.argv[1:]))
