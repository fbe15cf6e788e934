"""vLLM serving a target, with or without a draft, in its own venv: the harness `evaluate --engine vllm`
(`vllm_evaluate`), `dump-hidden --engine vllm --regenerate`, the engine tests and `benchmarks/bench_engine.py` share.

vLLM lives in its own venv (`mtp2draft engine install vllm`, at `$MTP2DRAFT_VLLM_VENV`: its transformers pin is not
mtp2draft's), so it is never imported here: `run_vllm` writes a JSON request, runs `vllm_side/serve_driver.py` with
that venv's Python in a subprocess, and reads the JSON reply. One call runs several configurations of the same
prompts in one driver process, one engine after the other. What it serves is a view of the target
(`served_view`): its files linked, config.json rewritten where the family's `[engines.vllm] config_view` says vLLM
parses the released config under another type, and a `stitched` export laid over it.

What this module does not do: install vLLM (`environments.py`), choose what to serve for a draft or read acceptance
(`vllm_evaluate.py`), or check a sampled output's distribution (vLLM's sampler is its own).
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
from typing import TYPE_CHECKING, Any

from mtp2draft.engines.vllm_launch import VLLM_SIDE, uses_mla, vllm_environment, vllm_python
from mtp2draft.errors import Mtp2DraftError
from mtp2draft.formats.serving import vllm_config_view
from mtp2draft.settings import HubAccess, Placement

if TYPE_CHECKING:  # io and data import torch, which this module does not
    from mtp2draft.data import Example, Regeneration
    from mtp2draft.progress import Progress

DRIVER = VLLM_SIDE / "serve_driver.py"


class EngineRunError(Mtp2DraftError):
    """vLLM started but could not serve a configuration (its error is in the message, its log on stderr)."""


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
    timing: dict[str, Any] | None = None  # the counted generate, engine clock (serve_driver.timing)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # timed rounds at fixed concurrency

    def check(self) -> EngineResult:
        """Self, or AssertionError with vLLM's error when the run failed."""
        if self.error is not None:
            causes = "\n".join(self.log_errors[-6:])
            raise AssertionError(f"vLLM run {self.name!r} failed: {self.error}\n{causes}")
        return self


def served_view(target: str | Path, out: str | Path, overlay: str | Path | None = None) -> Path:
    """A directory vLLM can serve: every file of `target` symlinked, config.json rewritten as `config_view` says,
    and every file of `overlay` (a `stitched` export: shards holding the MTP layer plus the
    index) symlinked over the target's. Returns `out` (created; an existing view is replaced)."""
    target, out = Path(target).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    files = {p.name: p for p in target.iterdir() if p.is_file()}
    if overlay is not None:
        files.update({p.name: p for p in Path(overlay).resolve().iterdir() if p.is_file() and p.suffix != ".md"})
    config = json.loads(files.pop("config.json").read_text())
    config.update(config_view(config))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name, path in files.items():
        (out / name).symlink_to(path)
    return out


def config_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json fields vLLM reads instead of `config`'s: the `[engines.vllm] config_view` of the family whose
    `model_types` name the released type (the type vLLM's transformers cannot parse); empty for any other config."""
    from mtp2draft.family.spec import registry

    released = config.get("model_type")
    for spec in registry().values():
        if released in spec.model_types and (view := vllm_config_view(spec)):
            return view
    return {}


def speculative_config(method: str, k: int, draft: str | Path | None = None, **extra: Any) -> dict[str, Any]:
    """vLLM's speculative_config: `mtp` (the MTP layer inside the served target) or `eagle3` (a draft directory in
    SGLang's layout); `extra` are further fields (e.g. draft_sample_method)."""
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": int(k), **extra}
    if draft is not None:
        out["model"] = str(draft)
    return out


@dataclass(frozen=True, kw_only=True)
class Generation:
    """What every run generates from each prompt (serve_driver's request): at most `max_new_tokens` tokens, greedy at
    temperature 0 or sampled at `temperature` / `top_p` from `seed`, to the end token unless `ignore_eos`. `rounds`:
    after the counted generate, one timed generate per size with that many prompts in flight."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    rounds: Sequence[int] = ()


@dataclass(frozen=True, kw_only=True)
class EngineSetup:
    """How vLLM is started for every run: the dtype it serves in, the longest sequence, the KV cache of its CPU
    build, the GPUs the target is split across, and how long the driver may take."""

    dtype: str = "float32"
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    tensor_parallel_size: int = 1
    timeout_s: float = 3600


def run_vllm(
    runs: Sequence[EngineRun],
    prompts: Sequence[Sequence[int]],
    generation: Generation,
    setup: EngineSetup = EngineSetup(),
    log: Any = None,
) -> tuple[str, dict[str, EngineResult]]:
    """Run each configuration on the same token-id prompts: (vLLM version, {run name: result}).

    A run that vLLM refused carries its `error`; a crash of the driver itself raises EngineRunError."""
    gen = generation
    python = vllm_python()
    # the drivers' shared exit (vllm_side/driver_exit); an MLA target among the runs asks for the CPU rotary fix
    mla = next((run.model for run in runs if uses_mla(Path(run.model))), None)
    env = vllm_environment(setup.kv_cache_gib, pythonpath=VLLM_SIDE, model=mla)
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # into per-run log files; the weight-loading lines are INFO
    request = {
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": int(gen.max_new_tokens),
        "dtype": setup.dtype,
        "max_model_len": int(setup.max_model_len),
        "tensor_parallel_size": int(setup.tensor_parallel_size),
        "temperature": float(gen.temperature),
        "top_p": float(gen.top_p),
        "seed": int(gen.seed),
        "ignore_eos": bool(gen.ignore_eos),
        "rounds": [{"name": f"c{n}#{i}", "size": int(n)} for i, n in enumerate(gen.rounds)],
        "runs": [
            {"name": r.name, "model": _absolute(r.model), "speculative_config": _spec_paths(r.speculative_config)}
            for r in runs
        ],
    }
    with tempfile.TemporaryDirectory(prefix="mtp2draft-vllm-") as tmp:
        req, rep = Path(tmp) / "request.json", Path(tmp) / "reply.json"
        req.write_text(json.dumps(request))
        started = time.perf_counter()
        # vLLM's own log goes to our stderr: a start takes minutes, silence misleads
        proc = subprocess.run(
            [str(python), str(DRIVER), str(req), str(rep)], env=env, cwd=tmp, stdout=sys.stderr, timeout=setup.timeout_s
        )
        if log is not None:
            log(f"vLLM driver: {len(runs)} run(s) in {time.perf_counter() - started:.0f}s")
        reply = json.loads(rep.read_text()) if rep.is_file() else None
        if proc.returncode != 0 or reply is None or len(reply["runs"]) != len(runs):
            raise EngineRunError(f"vLLM's driver failed (exit {proc.returncode}); its log is on stderr above")
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
            timing=r.get("timing"),
            rounds=r.get("rounds") or [],
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


# ---- the target's own responses (`dump-hidden --engine vllm --regenerate`) -----------------------------------------
def regenerate_in_vllm(
    examples: Sequence[Example],
    target: str,
    how: Regeneration,
    *,
    eos: int | None,
    where: Placement = Placement(),
    hub: HubAccess = HubAccess(),
    progress: Progress | None = None,
) -> list[Example]:
    """`examples` with their responses replaced by the target's own (`data.regeneration_prompts`: the prompt, and
    the budget each gets), from vLLM serving the target: its plain generation in fp32, greedy or sampled at `how`'s
    temperature and seed, for a target that only an engine can run (`data.regenerate` is the same in transformers).
    Responses end after the tokenizer's `eos`, which is kept."""
    from mtp2draft.data import regeneration_prompts, with_response
    from mtp2draft.target.hidden import local_path

    say = progress or (lambda _: None)
    jobs = regeneration_prompts(examples, how.max_new_tokens)
    path = local_path(target, hub.revision, hub.token)
    say(f"regenerating {len(jobs)} responses in vLLM ({'sampled' if how.sample else 'greedy'})")
    with tempfile.TemporaryDirectory(prefix="mtp2draft-regenerate-") as tmp:
        run = EngineRun("target", served_view(path, Path(tmp) / "view"))
        generation = Generation(
            max_new_tokens=max(budget for _, budget in jobs),
            temperature=how.temperature if how.sample else 0.0,
            seed=how.seed,
        )
        setup = EngineSetup(
            dtype="float32",  # as the extraction that follows computes the teacher's log-probs
            max_model_len=max(len(prompt) + budget for prompt, budget in jobs) + 1,
            tensor_parallel_size=where.tensor_parallel_size or 1,
        )
        _, results = run_vllm([run], [prompt for prompt, _ in jobs], generation, setup, log=say)
    result = results["target"]
    if result.error is not None or result.outputs is None:
        raise EngineRunError(f"vLLM could not generate the responses: {result.error} (its log is on stderr above)")
    return [with_response(ex, job, out, eos) for ex, job, out in zip(examples, jobs, result.outputs, strict=True)]
