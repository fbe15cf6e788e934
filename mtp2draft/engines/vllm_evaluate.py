"""`evaluate --engine vllm`: drafts measured while vLLM serves the target with them, the way a user serves it (tensor
parallel, the checkpoint's own dtype and quantization, greedy or at a temperature), acceptance read from vLLM's own
counters: per draft position j, vLLM counts the drafts whose first j tokens were accepted
(`..._accepted_tokens_per_pos`), so per-draft acceptance is n_j / drafts and conditional acceptance n_j / n_{j-1}
(n_0 = drafts), the two metrics `evaluation.decode` reports. The same prompts served without the draft give the
baseline output (greedy: the lossless check is "speculative output == plain output", vLLM against itself) and the
clock (engine-core timestamps per request, `vllm_side/serve_driver.py`). A native MTP draft is served as the
target's own MTP layer (`export --format stitched` laid over the target, `{"method": "mtp"}`), an EAGLE-3 draft as
SGLang's layout (`{"method": "eagle3"}`); which kinds vLLM serves for the target's family comes from the family's
engine table (`[engines.vllm]`). What vLLM's CPU build needs and cannot run is in docs/engines.md, with the vLLM
version of each fact.

What this module does not do: pick the engine (`choice.py`), start vLLM or serve (`vllm_serve.py`), decode
speculatively itself (`evaluation.decode` does, for `transformers`), or check a sampled output's distribution
(vLLM's sampler is its own; `lossless` is null there).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtp2draft.dtypes import DTYPE_NAMES
from mtp2draft.engines.vllm_launch import vllm_python
from mtp2draft.engines.vllm_serve import (
    EngineResult,
    EngineRun,
    EngineRunError,
    EngineSetup,
    Generation,
    config_view,
    run_vllm,
    served_view,
    speculative_config,
)
from mtp2draft.errors import OptionError
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.kinds import DraftKind
from mtp2draft.settings import HubAccess, Placement

if TYPE_CHECKING:  # io imports torch, which this module does not
    from mtp2draft.progress import Progress

# how vLLM serves each draft kind: the export format it loads and the speculative method
SERVED_AS = {DraftKind.MTP: ("stitched", "mtp"), DraftKind.EAGLE3: ("sglang", "eagle3")}
DRAFT_SAMPLE_METHOD = {"greedy": "greedy", "sample": "probabilistic"}  # --draft-sampling -> vLLM's name


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
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    """Serve `target` in vLLM with each draft and once without, on the prompts of `data` (as `decode.evaluate`
    reads them); the report `decode.evaluate` writes, from vLLM's counters and clock. `config`: what to decode and
    how (`EvaluateConfig`); `where`: its dtype (None: the checkpoint's own, "auto") and tensor parallel size (default
    1; vLLM places the target itself); `hub`: the target's revision and the token. `keep_outputs` adds every run's
    token ids (`engine.outputs`). The exports and views live in a temporary directory."""
    from mtp2draft.checkpoint.reader import read_config
    from mtp2draft.data import load_tokenizer
    from mtp2draft.evaluation.decode import load_prompts, with_headline
    from mtp2draft.family.spec import find_spec
    from mtp2draft.target.hidden import local_path
    from mtp2draft.target.identity import check_drafts_belong

    cfg = config or EvaluateConfig()
    where, hub = where or Placement(), hub or HubAccess()
    dtype, tensor_parallel_size, revision, token = where.dtype, where.tensor_parallel_size or 1, hub.revision, hub.token
    if tensor_parallel_size < 1:
        raise OptionError(f"--tensor-parallel-size must be at least 1, got {tensor_parallel_size}")
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise OptionError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, not {dtype!r}")
    check_drafts_belong([path for _, path in drafts], target, revision, token)
    target_dir = local_path(target, revision, token)
    target_config = read_config(target_dir)
    kinds = check_served(drafts, find_spec(target_config))
    vllm_python()  # the venv, before any export is written
    prompts = load_prompts(data, load_tokenizer(target_dir), cfg.max_prompts, cfg.max_prompt_length, cfg.skip_bad)
    stored = str(target_config.get("torch_dtype") or target_config.get("dtype") or "bfloat16")
    k = cfg.num_draft_tokens
    extra = {"draft_sample_method": DRAFT_SAMPLE_METHOD[cfg.draft_sampling]} if not cfg.sampling.greedy else {}
    with tempfile.TemporaryDirectory(prefix=".mtp2draft-vllm-eval-") as tmp:
        runs = serve_runs(drafts, kinds, target_dir, Path(tmp), k, dtype or stored, extra, progress)
        progress(f"vLLM: {len(drafts)} draft(s) and the plain target on {len(prompts)} prompts (one engine each)")
        generation = Generation(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed
        )
        setup = EngineSetup(
            dtype=dtype or "auto",
            max_model_len=max(len(p) for p in prompts) + cfg.max_new_tokens + k + 8,
            tensor_parallel_size=tensor_parallel_size,
        )
        version, results = run_vllm(runs, prompts, generation, setup, log=progress)
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
    config = json.loads((Path(target_dir) / "config.json").read_text())
    released, view = config.get("model_type"), config_view(config)
    if view:  # said, as the card says it: a user serving the draft makes the same view
        fields = ", ".join(f"{k}: {v}" for k, v in view.items())
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
