"""`evaluate --engine`: the backend that runs the target while a draft is measured: transformers here, or vLLM
serving it (`target/backend.py` is the same choice for dumping hidden states).

`transformers` is `decode.evaluate` (mtp2draft's own chain speculative decoding, the target loaded in this process).
`vllm` serves the target with the draft in vLLM, the way a user serves it (tensor parallel, the checkpoint's own
dtype and quantization, greedy or at a temperature), and reads acceptance from vLLM's own counters: per draft
position j, vLLM counts the drafts whose first j tokens were accepted (`..._accepted_tokens_per_pos`), so
per-draft acceptance is n_j / drafts and conditional acceptance n_j / n_{j-1} (n_0 = drafts), the two metrics
`decode.py` reports. The same prompts served without the draft give the baseline output (greedy: the lossless check
is "speculative output == plain output", vLLM against itself) and the clock (engine-core timestamps per request,
`vllm_side/serve_driver.py`). A native MTP draft is served as the target's own MTP layer (`export --format
stitched` laid over the target, `{"method": "mtp"}`), an EAGLE-3 draft as SGLang's layout (`{"method": "eagle3"}`);
which kinds vLLM serves for the target's family comes from the family's engine table (`[engines.vllm]`).

vLLM lives in its own venv (`mtp2draft engine install vllm`, at `$MTP2DRAFT_VLLM_VENV`: its transformers pin is not
mtp2draft's), so it is never imported here: `run_vllm` writes a JSON request, runs `target/vllm_side/serve_driver.py`
with that venv's Python in a subprocess, and reads the JSON reply. One call runs several configurations of the same
prompts in one driver process, one engine after the other. The engine tests and `benchmarks/bench_engine.py` use the
same harness. What vLLM's CPU build needs and cannot run is in docs/engines.md, with the vLLM version of each fact.

What this module does not do: install vLLM (`target/environments.py` does), decode speculatively itself (`decode.py` does, for
`transformers`), or check a sampled output's distribution (vLLM's sampler is its own; `lossless` is null there).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtp2draft.engines.vllm_dump import VLLM_SIDE, uses_mla, vllm_environment, vllm_python
from mtp2draft.errors import Mtp2DraftError, OptionError
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.formats.serving import (
    VLLM_CONFIG_VIEW,  # config.json fields a served view rewrites (the card says so too)
)
from mtp2draft.kinds import DTYPE_NAMES, DraftKind
from mtp2draft.settings import HubAccess, Placement

if TYPE_CHECKING:  # io and data import torch, which this module does not (the CLI's help reads EVALUATE_ENGINES)
    from mtp2draft.data import Example
    from mtp2draft.io import Progress

EVALUATE_ENGINES: dict[str, str] = {
    "transformers": "mtp2draft's speculative decoding, the target loaded by transformers here (--device, --device-map)",
    "vllm": "the target served with the draft by vLLM in its own venv (--tensor-parallel-size); vLLM's counters",
}
DRIVER = VLLM_SIDE / "serve_driver.py"
# how vLLM serves each draft kind: the export format it loads and the speculative method
SERVED_AS = {DraftKind.MTP: ("stitched", "mtp"), DraftKind.EAGLE3: ("sglang", "eagle3")}
DRAFT_SAMPLE_METHOD = {"greedy": "greedy", "sample": "probabilistic"}  # --draft-sampling -> vLLM's name


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


def speculative_config(method: str, k: int, draft: str | Path | None = None, **extra: Any) -> dict[str, Any]:
    """vLLM's speculative_config: `mtp` (the MTP layer inside the served target) or `eagle3` (a draft directory in
    SGLang's layout); `extra` are further fields (e.g. draft_sample_method)."""
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": int(k), **extra}
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
    tensor_parallel_size: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    rounds: Sequence[int] = (),
    ignore_eos: bool = False,
) -> tuple[str, dict[str, EngineResult]]:
    """Run each configuration on the same token-id prompts: (vLLM version, {run name: result}). `rounds`: after the
    counted generate, one timed generate per size with that many prompts in flight (serve_driver's doc).

    A run that vLLM refused carries its `error`; a crash of the driver itself raises EngineRunError."""
    python = vllm_python()
    # the drivers' shared exit (vllm_side/driver_exit); an MLA target among the runs asks for the CPU rotary fix
    mla = next((run.model for run in runs if uses_mla(Path(run.model))), None)
    env = vllm_environment(kv_cache_gib, pythonpath=VLLM_SIDE, model=mla)
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # into per-run log files; the weight-loading lines are INFO
    request = {
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": int(max_new_tokens),
        "dtype": dtype,
        "max_model_len": int(max_model_len),
        "tensor_parallel_size": int(tensor_parallel_size),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "seed": int(seed),
        "ignore_eos": bool(ignore_eos),
        "rounds": [{"name": f"c{n}#{i}", "size": int(n)} for i, n in enumerate(rounds)],
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
            [str(python), str(DRIVER), str(req), str(rep)], env=env, cwd=tmp, stdout=sys.stderr, timeout=timeout_s
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


# ---- the target's own responses (`dump-hidden --regenerate`) ------------------------------------------------------
def regenerate(
    engine: str,
    examples: Sequence[Example],
    target: str,
    *,
    eos: int | None,
    max_new_tokens: int,
    sample: bool,
    seed: int = 0,
    hub: HubAccess = HubAccess(),
    tensor_parallel_size: int = 1,
    progress: Progress | None = None,
) -> list[Example]:
    """`examples` with their responses replaced by the target's own (`data.regeneration_prompts`: the prompt, and
    the budget each gets), written by `engine`: transformers here (`data.regenerate`), or vLLM serving the target
    (its plain generation in fp32, greedy or sampled at `data.SAMPLE_TEMPERATURE`, seeded by `seed`), for a target
    that only an engine can run. Responses end after the tokenizer's `eos`, which is kept."""
    from mtp2draft.data import SAMPLE_TEMPERATURE, regeneration_prompts, with_response
    from mtp2draft.engines.vllm_dump import resolve_target

    say = progress or (lambda _: None)
    if engine not in EVALUATE_ENGINES:
        raise OptionError(f"--engine must be one of {', '.join(EVALUATE_ENGINES)}, not {engine!r}")
    if engine == "transformers":
        from mtp2draft.data import load_tokenizer
        from mtp2draft.data import regenerate as here
        from mtp2draft.target.hidden import TargetModel

        model = TargetModel(target, hub.revision, hub.token)
        return here(examples, model, load_tokenizer(model.path), max_new_tokens, sample, seed=seed, progress=say)
    jobs = regeneration_prompts(examples, max_new_tokens)
    path = resolve_target(target, hub.revision, hub.token)
    say(f"regenerating {len(jobs)} responses in vLLM ({'sampled' if sample else 'greedy'})")
    with tempfile.TemporaryDirectory(prefix="mtp2draft-regenerate-") as tmp:
        run = EngineRun("target", served_view(path, Path(tmp) / "view"))
        _, results = run_vllm(
            [run],
            [prompt for prompt, _ in jobs],
            max(budget for _, budget in jobs),
            dtype="float32",  # as the extraction that follows computes the teacher's log-probs
            max_model_len=max(len(prompt) + budget for prompt, budget in jobs) + 1,
            tensor_parallel_size=tensor_parallel_size,
            temperature=SAMPLE_TEMPERATURE if sample else 0.0,
            seed=seed,
            log=say,
        )
    result = results["target"]
    if result.error is not None or result.outputs is None:
        raise EngineRunError(f"vLLM could not generate the responses: {result.error} (its log is on stderr above)")
    return [with_response(ex, job, out, eos) for ex, job, out in zip(examples, jobs, result.outputs, strict=True)]


# ---- acceptance from vLLM's counters ---------------------------------------------------------------------------------
def acceptance(metrics: dict[str, Any], k: int) -> dict[str, Any]:
    """decode.summarise's figures from vLLM's counters: mean acceptance length (bonus included), conditional
    acceptance per position (n_j / n_{j-1}) and per draft (n_j / drafts)."""
    drafts, n = int(metrics["drafts"]), [int(x) for x in metrics["accepted_per_position"]]
    n = (n + [0] * k)[:k]
    reached = [drafts, *n[:-1]]
    return {
        "mean_acceptance_length": 1.0 + metrics["accepted_tokens"] / drafts if drafts else 1.0,
        "acceptance_per_position": [a / r if r else 0.0 for a, r in zip(n, reached, strict=True)],
        "per_draft_acceptance": [a / drafts if drafts else 0.0 for a in n],
        "tokens_drafted": int(metrics["draft_tokens"]),
        "tokens_accepted": int(metrics["accepted_tokens"]),
        "target_forwards": drafts,
    }


def _clock(result: EngineResult) -> dict[str, Any]:
    t = result.timing or {}
    return {
        "start_s": result.start_s,
        "seconds": result.generate_s,
        "output_tokens": t.get("output_tokens"),
        "output_tokens_per_s": t.get("output_tokens_per_s"),
        "tpot_ms": t.get("tpot_ms"),
    }


# ---- evaluate --------------------------------------------------------------------------------------------------------
def evaluate(
    engine: str,
    drafts: Sequence[tuple[str, str]],
    target: str,
    data: str | Path,
    config: EvaluateConfig | None = None,
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """`evaluate` with the chosen engine (`EVALUATE_ENGINES`): the same report either way, plus `engine` (name,
    version). `where`: where the target runs (dtype None: float32 for transformers, the checkpoint's own for vLLM);
    `hub`: the target's revision and the token."""
    if engine not in EVALUATE_ENGINES:
        raise OptionError(f"--engine must be one of {', '.join(EVALUATE_ENGINES)}, not {engine!r}")
    where, hub = where or Placement(), hub or HubAccess()
    common = {"config": config, "revision": hub.revision, "token": hub.token, "progress": progress}
    if engine == "transformers":
        if where.tensor_parallel_size is not None:
            raise OptionError("--tensor-parallel-size is for --engine vllm (transformers spreads with --device-map)")
        import transformers

        from mtp2draft.evaluation.decode import evaluate as run

        placed = {"device": where.device, "dtype": where.torch_dtype, "device_map": where.device_map}
        report = run(drafts, target, data, **common, **placed)
        return {**report, "engine": {"name": "transformers", "version": transformers.__version__}}
    for option, value in (("--device", where.device), ("--device-map", where.device_map)):
        if value is not None:
            raise OptionError(f"{option} is for --engine transformers (vLLM places the target itself; split it "
                              "with --tensor-parallel-size)")  # fmt: skip
    tp = where.tensor_parallel_size or 1
    return evaluate_in_vllm(drafts, target, data, **common, dtype=where.dtype, tensor_parallel_size=tp)


def check_served(drafts: Sequence[tuple[str, str]], spec: Any) -> dict[str, DraftKind]:
    """Each draft's kind, refused in one line when the family's engine table says vLLM does not serve it."""
    from mtp2draft.draft.config import load_draft_config

    kinds = {}
    for name, path in drafts:
        kind = load_draft_config(path).kind
        if not spec.serves("vllm", kind):
            facts = spec.engine("vllm")
            engine = f"vllm {facts.version}" if facts else "vllm"
            raise OptionError(
                f"{engine} serves no {kind} draft for {spec.name} targets ({path}; the family's engine table: "
                "`mtp2draft specs`); use --engine transformers"
            )
        kinds[name] = DraftKind(kind)
    return kinds


def evaluate_in_vllm(
    drafts: Sequence[tuple[str, str]],
    target: str,
    data: str | Path,
    config: EvaluateConfig | None = None,
    dtype: str | None = None,
    tensor_parallel_size: int = 1,
    revision: str | None = None,
    token: str | bool | None = None,
    progress: Progress = lambda _: None,
    keep_outputs: bool = False,
    work: str | Path | None = None,
) -> dict[str, Any]:
    """Serve `target` in vLLM with each draft and once without, on the prompts of `data` (as `decode.evaluate`
    reads them); the report `decode.evaluate` writes, from vLLM's counters and clock. `config`: what to decode and
    how (`EvaluateConfig`). dtype None: the checkpoint's own ("auto"). `keep_outputs` adds every run's token ids
    (`engine.outputs`); `work` holds the exports and views (default: a temporary directory)."""
    from mtp2draft.checkpoint.reader import read_config
    from mtp2draft.data import load_tokenizer
    from mtp2draft.engines.vllm_dump import resolve_target
    from mtp2draft.evaluation.decode import load_prompts, with_headline
    from mtp2draft.family.spec import find_spec
    from mtp2draft.target.identity import check_drafts_belong

    cfg = config or EvaluateConfig()
    if tensor_parallel_size < 1:
        raise OptionError(f"--tensor-parallel-size must be at least 1, got {tensor_parallel_size}")
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise OptionError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, not {dtype!r}")
    check_drafts_belong([path for _, path in drafts], target, revision, token)
    target_dir = resolve_target(target, revision, token)
    target_config = read_config(target_dir)
    kinds = check_served(drafts, find_spec(target_config))
    vllm_python()  # the venv, before any export is written
    prompts = load_prompts(data, load_tokenizer(target_dir), cfg.max_prompts, cfg.max_prompt_length, cfg.skip_bad)
    stored = str(target_config.get("torch_dtype") or target_config.get("dtype") or "bfloat16")
    k = cfg.num_draft_tokens
    extra = {"draft_sample_method": DRAFT_SAMPLE_METHOD[cfg.draft_sampling]} if not cfg.sampling.greedy else {}
    with tempfile.TemporaryDirectory(prefix=".mtp2draft-vllm-eval-", dir=work) as tmp:
        runs = serve_runs(drafts, kinds, target_dir, Path(tmp), k, dtype or stored, extra, progress)
        progress(f"vLLM: {len(drafts)} draft(s) and the plain target on {len(prompts)} prompts (one engine each)")
        version, results = run_vllm(
            runs,
            prompts,
            cfg.max_new_tokens,
            dtype=dtype or "auto",
            max_model_len=max(len(p) for p in prompts) + cfg.max_new_tokens + k + 8,
            log=progress,
            tensor_parallel_size=tensor_parallel_size,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=cfg.seed,
        )
    check_runs(version, results)
    out = engine_report(target, target_dir, data, cfg, len(prompts), version, results["plain"], tensor_parallel_size)
    out["dtype"] = stored if dtype is None else dtype
    out["engine"]["dtype"] = dtype or "auto"
    spec = find_spec(target_config)
    for name, path in drafts:
        row = draft_row(name, str(path), results[name], results["plain"], cfg, len(prompts), progress)
        row["chain"] = chain_rule(path, spec, progress, version)
        out["results"].append(row)
    if keep_outputs:
        out["engine"]["outputs"] = {name: r.outputs for name, r in results.items()}
    return with_headline(out)


def chain_rule(path: str | Path, spec: Any, progress: Progress, version: str) -> dict[str, Any] | None:
    """A chain draft's layer count and the rule vLLM runs it under (the family's `[engines.vllm] step_layers`, not
    the draft's: vLLM picks the layer itself), with a note naming the vLLM that ran (`version`) and the one the
    family's facts were read from when the draft was trained for another rule; None for a one-layer draft."""
    from mtp2draft.draft.chain import is_chain_config
    from mtp2draft.draft.config import load_draft_config

    cfg = load_draft_config(path).raw
    if not is_chain_config(cfg):
        return None
    facts = spec.engine("vllm")
    rule = facts.step_layers if facts is not None and facts.step_layers else None
    trained = cfg.get("step_layers", "cycle")
    if rule is not None and rule != trained:
        progress(
            f"note: {path} chains {len(cfg['mtp_layers'])} layers for step_layers {trained}, but vllm {version} runs "
            f"{spec.name} drafts under '{rule}' (the family's facts, read from vllm {facts.version}: `mtp2draft "
            "specs`): this measures that rule"
        )
    if facts is not None and facts.known_bug:  # e.g. a proposer that runs layer 0 at every step
        progress(f"note: known bug of vllm {facts.version} for {spec.name} chains: {facts.known_bug}")
    bug = {"known_bug": facts.known_bug} if facts is not None and facts.known_bug else {}
    return {"num_layers": len(cfg["mtp_layers"]), "step_layers": rule, "trained_for": trained, **bug}


def check_runs(version: str, results: dict[str, Any]) -> None:
    """A run vLLM could not serve is one line, its root cause first (the exception often says only "see above")."""
    for r in results.values():
        if r.error is not None:
            cause = next((line for line in r.log_errors if "Error:" in line and r.error not in line), "")
            raise EngineRunError(
                f"vLLM {version} could not serve {r.name!r}: {r.error}" + (f" ({cause.strip()})" if cause else "")
            )


def engine_report(
    target: str,
    target_dir: Path,
    data: str | Path,
    cfg: EvaluateConfig,
    prompts: int,
    version: str,
    plain: Any,
    tp: int,
) -> dict[str, Any]:
    """The report's head, as `decode.evaluate` writes it, plus `engine` (name, version, tp, the plain run's clock)."""
    from mtp2draft.checkpoint.reader import read_config
    from mtp2draft.family.spec import find_spec
    from mtp2draft.target.hidden import commit_of

    return {
        "target": target,
        "target_family": find_spec(read_config(target_dir)).name,
        "target_commit": commit_of(target_dir),
        "data": str(data),
        "device": f"vllm (tensor_parallel_size={tp})",
        "dtype": None,
        "tie_tolerance": None,
        "num_prompts": prompts,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "draft_sampling": "greedy" if cfg.sampling.greedy else cfg.draft_sampling,
        "results": [],
        "engine": {
            "name": "vllm",
            "version": version,
            "tensor_parallel_size": tp,
            "dtype": None,
            "plain": _clock(plain),
        },
    }


def draft_row(
    name: str, path: str, r: Any, plain: Any, cfg: EvaluateConfig, prompts: int, progress: Progress
) -> dict[str, Any]:
    """One draft's result, as `decode.evaluate` writes it, from vLLM's counters; greedy: its output against the
    plain run's (`mismatched_prompts`, `lossless`)."""
    k = cfg.num_draft_tokens
    figures = acceptance(r.metrics or {"drafts": 0, "accepted_per_position": [], "accepted_tokens": 0,
                                       "draft_tokens": 0}, k)  # fmt: skip
    mismatched = (
        [i for i, (a, b) in enumerate(zip(r.outputs, plain.outputs, strict=True)) if a != b]
        if cfg.sampling.greedy
        else None
    )
    if mismatched:
        progress(f"{name}: vLLM's speculative output differs from its plain output on prompts {mismatched}")
    return {
        "name": name,
        "draft": path,
        "num_draft_tokens": k,
        **figures,
        "lossless": None if mismatched is None else not mismatched,
        "ties": 0,
        "num_prompts": prompts,
        "seconds": r.generate_s,
        # vLLM's per-request figure (None where it kept none), prompt by prompt
        "tokens_per_forward_by_prompt": (r.metrics or {}).get("mean_acceptance_length_by_prompt") or [],
        # vLLM's counters keep no per-step counts, so no paired bootstrap against a baseline here
        "accepted_by_prompt": None,
        "distribution_check": None,
        "mismatched_prompts": mismatched,
        "clock": _clock(r),
    }


def serve_runs(
    drafts: Sequence[tuple[str, str]],
    kinds: dict[str, DraftKind],
    target_dir: Path,
    work: Path,
    k: int,
    dtype: str,
    extra: dict[str, Any] | None = None,
    progress: Progress = lambda _: None,
) -> list[EngineRun]:
    """The plain target ("plain") and each draft as vLLM serves it (`SERVED_AS`), exported into `work`: a native
    MTP draft as a `stitched` export laid over a view of the target, an EAGLE-3 draft in SGLang's layout beside it."""
    base = served_view(target_dir, work / "view")
    released = json.loads((Path(target_dir) / "config.json").read_text()).get("model_type")
    if released in VLLM_CONFIG_VIEW:  # said, as the card says it: a user serving the draft makes the same view
        fields = ", ".join(f"{k}: {v}" for k, v in VLLM_CONFIG_VIEW[released].items())
        progress(f"vLLM serves a view of the target whose config.json says {fields} (the release says model_type "
                 f"{released}, which transformers does not know; vLLM picks the same class from `architectures`): "
                 "the card's overlay lines make the same view")  # fmt: skip
    runs = [EngineRun("plain", base)]
    for n, (name, path) in enumerate(drafts):
        fmt, method = SERVED_AS[kinds[name]]
        out = work / f"draft-{n}-{fmt}"
        progress(f"{name}: export --format {fmt} for vLLM's {method} method")
        _export(path, fmt, out, target_dir, dtype, k)
        if fmt == "stitched":
            view = served_view(target_dir, work / f"view-{n}", out)
            runs.append(EngineRun(name, view, speculative_config(method, k, **(extra or {}))))
        else:
            runs.append(EngineRun(name, base, speculative_config(method, k, out, **(extra or {}))))
    return runs


def _export(draft: str, fmt: str, out: Path, target: Path, dtype: str, k: int) -> None:
    from mtp2draft.formats import ExportConfig
    from mtp2draft.formats.export import export

    if fmt == "stitched":  # the layer written back into the target's shards, in their dtype and quantization
        export(draft, fmt, out, target=str(target))
    else:
        export(draft, fmt, out, config=ExportConfig(dtype=dtype, speculative_tokens=k))
