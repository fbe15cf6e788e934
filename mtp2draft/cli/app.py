"""The `mtp2draft` command line: parse, call the library, format. Nothing else lives here.

Data goes to stdout (tables, JSON); progress and logs go to stderr. Known errors (`Mtp2DraftError`) become one line
and a non-zero exit; tracebacks appear only with MTP2DRAFT_DEBUG=1. Typer is imported here and in `cli_options` (the
shared option types) only; what each command prints is written by `cli_output`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import (
    AsJson,
    BatchSize,
    Checkpointing,
    Data,
    Device,
    DeviceMap,
    DistillEngine,
    DraftDir,
    DraftVocab,
    EvalDtype,
    EvalEngine,
    Handover,
    HiddenStates,
    MaxLength,
    MaxNewTokens,
    Out,
    Overwrite,
    Plan,
    Precision,
    Regenerate,
    Revision,
    SkipBad,
    Source,
    StepWeights,
    Target,
    TargetDtype,
    TensorParallel,
    Token,
    TrainSubset,
    Verifier,
    WorldSize,
    choices,
)
from mtp2draft.cli.progress import Reporter
from mtp2draft.errors import Mtp2DraftError
from mtp2draft.kinds import DraftKind

app = typer.Typer(
    name="mtp2draft",
    help="Turn the MTP layer shipped in LLM checkpoints into a speculative-decoding draft model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


log = Reporter()  # progress and logs: stderr (bars on a terminal), so stdout stays data


def number_list(text: str | None, option: str, cast: type = float) -> list | None:
    """'1,0.8,0.64' -> [1.0, 0.8, 0.64] (cast: float or int); a malformed list is a usage error naming the option."""
    if not text:
        return None
    try:
        return [cast(x) for x in text.split(",")]
    except ValueError:
        what = "whole numbers" if cast is int else "numbers"
        raise typer.BadParameter(f"expected {what} separated by commas, got {text!r}", param_hint=option) from None


# ---- specs ---------------------------------------------------------------------------------------------------------
@app.command()
def specs(as_json: AsJson = False) -> None:
    """List the checkpoint families mtp2draft can convert (from the spec registry).

    Example: `mtp2draft specs --json`
    """
    from mtp2draft.family.spec import registry

    rows = [s.summary() for s in registry().values()]
    print(output.to_json(rows) if as_json else output.specs_text(rows))


# ---- inspect -------------------------------------------------------------------------------------------------------
@app.command()
def inspect(source: Source, revision: Revision = None, token: Token = None, as_json: AsJson = False) -> None:
    """Show a checkpoint's family, its MTP layers and their tensors, and what a conversion would fetch.

    Reads only config.json, the index and safetensors headers.

    Examples: `mtp2draft inspect deepseek-ai/DeepSeek-V3` · `mtp2draft inspect ./my-checkpoint --json`
    """
    from mtp2draft.conversion import inspect_checkpoint

    info = inspect_checkpoint(source, revision, token)
    print(output.to_json(info) if as_json else output.inspect_text(info))


# ---- convert -------------------------------------------------------------------------------------------------------
@app.command()
def convert(
    source: Source,
    out: Out,
    to: Annotated[str, typer.Option("--to", help=f"Draft kind: {choices('kinds')}.")] = DraftKind.MTP.value,
    layer: Annotated[int | None, typer.Option("--layer", help="MTP layer index (default 0).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help=f"Weights dtype: {choices('dtypes')}.")] = "bfloat16",
    aux_layers: Annotated[
        str | None, typer.Option("--aux-layers", help="eagle3: three target layer ids 'low,mid,high' (output of).")
    ] = None,
    revision: Revision = None,
    token: Token = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
) -> None:
    """Convert the MTP layer of a checkpoint into a draft: native MTP (`--to mtp`) or EAGLE-3 (`--to eagle3`).

    Fetches only the MTP layer's bytes (byte ranges from the Hub, cached) and dequantises FP8.
    The output directory appears complete or not at all.

    Examples:

    * `mtp2draft convert deepseek-ai/DeepSeek-V3 --out ds3-mtp`
    * `mtp2draft convert zai-org/GLM-4.5-Air --to eagle3 --out glm-eagle3 --dtype bfloat16`
    """
    from mtp2draft.conversion import convert as run

    aux = number_list(aux_layers, "--aux-layers", int)
    result = run(source, out, to, layer, dtype, revision, token, overwrite, aux, progress=log)
    print(output.to_json(output.convert_summary(result)) if as_json else output.convert_text(result))


# ---- distill / evaluate / dump-hidden (pipeline stages 2 and 3) ----------------------------------------------------
def distill_config(ctx: typer.Context) -> Any:
    """The DistillConfig of a command's parsed options: every option named like one of its fields, with
    `--step-weights` parsed to numbers; what a command lacks keeps the config's default."""
    from mtp2draft.train.recipe import DistillConfig

    params = dict(ctx.params)
    if "step_weights" in params:
        params["step_weights"] = number_list(params["step_weights"], "--step-weights")
    return DistillConfig.from_options(params)


@app.command()
def distill(
    ctx: typer.Context,
    draft: DraftDir,
    out: Out,
    target: Annotated[str | None, typer.Option("--target", help="Target: hub repo id or local directory.")] = None,
    data: Annotated[Path | None, typer.Option("--data", help="Training JSONL (text or chat records).")] = None,
    hidden_states: HiddenStates = None,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 300,
    ttt_steps: Annotated[int, typer.Option("--ttt-steps", help="Draft steps unrolled per position (K).")] = 3,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, warm-up + cosine).")] = 1e-4,
    batch_size: BatchSize = 8,
    max_length: MaxLength = 256,
    draft_vocab_size: DraftVocab = None,
    step_weights: StepWeights = None,
    engine: DistillEngine = None,
    hidden_handover: Handover = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the data order.")] = 0,
    save_every: Annotated[int, typer.Option("--save-every", help="Checkpoint every N steps.")] = 50,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint of --out.")] = False,
    regenerate: Regenerate = False,
    sample: Annotated[bool, typer.Option("--sample", help="With --regenerate: sample instead of greedy.")] = False,
    skip_bad: SkipBad = False,
    revision: Revision = None,
    token: Token = None,
    overwrite: Overwrite = False,
    device: Device = None,
    dtype: TargetDtype = "float32",
    device_map: DeviceMap = None,
    precision: Precision = None,
    train_subset: TrainSubset = "all",
    activation_checkpointing: Checkpointing = False,
    compile_: Annotated[bool, typer.Option("--compile", help="torch.compile the draft's block (GPU runs).")] = False,
    plan: Plan = False,
    world_size: WorldSize = None,
    as_json: AsJson = False,
) -> None:
    """Fine-tune a draft against the frozen target with training-time test (K unrolled draft steps).

    Checkpoints are written atomically every --save-every steps; `--resume` continues a killed run to the same
    final weights.

    Examples:

    * `mtp2draft distill glm-mtp --target zai-org/GLM-4.5-Air --data chats.jsonl --device-map auto --dtype bfloat16 --out glm-mtp-ft` (the target spread over the local GPUs in bf16)
    * `mtp2draft distill glm-eagle3 --target zai-org/GLM-4.5-Air --data chats.jsonl --regenerate --draft-vocab-size 32000 --ttt-steps 5 --device-map auto --dtype bfloat16 --out glm-eagle3-ft`
    * `mtp2draft distill ds3-mtp --hidden-states dumped/ --out ds3-mtp-ft` (offline, no target loaded)
    * `torchrun --nproc-per-node 8 -m mtp2draft distill ds3-mtp --hidden-states dumped/ --out ds3-mtp-ft` (FSDP2;
      --batch-size stays the global batch)
    * `mtp2draft distill ds3-mtp --out x --plan --world-size 8 --max-length 2048` (memory per rank, then exit)
    """
    from mtp2draft.target.device import resolve_device
    from mtp2draft.train.recipe import distill as run

    cfg = distill_config(ctx)
    device = resolve_device(device)
    if plan:
        _print_plan(draft, cfg, world_size, device, offline=hidden_states is not None, as_json=as_json)
        return
    inputs = {"data": data, "target": target, "hidden_states": hidden_states, "skip_bad": skip_bad}
    flags = {"resume": resume, "overwrite": overwrite, "regenerate_data": regenerate, "sample": sample}
    hub = {"revision": revision, "token": token}
    where = {"device": device, "target_dtype": dtype, "device_map": device_map}
    result = run(draft, out, config=cfg, **inputs, **flags, **hub, **where, progress=log)
    if result.is_main:  # other torchrun ranks: rank 0 reports
        print(output.to_json(output.distill_summary(result)) if as_json else output.distill_text(result))


def _print_plan(draft: Path, cfg: Any, world_size: int | None, device: str, offline: bool, as_json: bool) -> None:
    """`distill --plan`: the per-rank memory plan of every --train-subset, without training."""
    from mtp2draft.train.memory import render
    from mtp2draft.train.recipe import plan_memory

    plans = plan_memory(draft, cfg, world_size, device, offline=offline)
    print(output.to_json([p.as_dict() for p in plans]) if as_json else render(plans))


@app.command()
def evaluate(
    draft: Annotated[Path, typer.Argument(help="Draft directory to evaluate.", show_default=False)],
    target: Target,
    data: Data,
    baseline: Annotated[
        list[Path] | None,
        typer.Option("--baseline", help="Other draft(s) to run on the same prompts, e.g. the raw MTP head."),
    ] = None,
    num_draft_tokens: Annotated[int, typer.Option("--num-draft-tokens", "-k", help="Draft tokens per step (k).")] = 4,
    max_new_tokens: MaxNewTokens = 64,
    max_prompts: Annotated[int | None, typer.Option("--max-prompts", help="Use the first N prompts.")] = None,
    max_prompt_length: Annotated[int, typer.Option("--max-prompt-length", help="Keep the last N prompt tokens.")] = 256,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature of target and draft (0: greedy verification).")
    ] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (with --temperature).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampling (with --temperature).")] = 0,
    draft_sampling: Annotated[
        str,
        typer.Option("--draft-sampling", help=f"How the draft proposes at a temperature: {choices('draft_sampling')}."),
    ] = "greedy",
    save: Annotated[bool, typer.Option("--save", help="Write evaluation.json into the draft directory.")] = False,
    skip_bad: SkipBad = False,
    revision: Revision = None,
    token: Token = None,
    engine: EvalEngine = "transformers",
    tensor_parallel_size: TensorParallel = None,
    device: Device = None,
    dtype: EvalDtype = None,
    device_map: DeviceMap = None,
    as_json: AsJson = False,
) -> None:
    """Measure acceptance by real speculative decoding (chain of k drafts) against the target: greedy verification,
    or speculative sampling with --temperature.

    Reports mean acceptance length (target tokens per target forward, bonus included), acceptance per draft
    position both conditional (given the earlier ones accepted) and per draft (vLLM's counters), and `lossless`: the
    output equals the target's own greedy output on every prompt; at a temperature, a KS test of the emitted tokens'
    randomised PIT under the target's distribution instead (`distribution_check`). Greedy ties of the top two
    logits within the rounding of --dtype are reported, not raised. The draft runs on the target's device, in its dtype.
    `--engine vllm` serves the target with the draft in vLLM instead (its own venv: scripts/vllm_env.sh) and reads
    the same figures from vLLM's counters, the plain target's run giving the lossless check and the clock.

    Examples:

    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --baseline glm-mtp -k 4 --device-map auto --dtype bfloat16`
    * `mtp2draft evaluate glm-eagle3-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --device-map auto --dtype bfloat16 --json --save`
    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --device-map auto --dtype bfloat16 --temperature 1 --seed 0 --draft-sampling sample`
    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --engine vllm --tensor-parallel-size 4`
    * `mtp2draft evaluate tiny-ft --target ./tiny-target --data prompts.jsonl --device cpu` (fp32, the default dtype)
    """
    from mtp2draft.evaluation.decode import save_evaluation
    from mtp2draft.evaluation.engine import evaluate as run

    drafts = [("draft", str(draft))] + [(f"baseline: {b}", str(b)) for b in (baseline or [])]
    limits = (num_draft_tokens, max_new_tokens, max_prompts, max_prompt_length)
    sampling = {"temperature": temperature, "top_p": top_p, "seed": seed, "draft_sampling": draft_sampling}
    where = {"device": device, "dtype": dtype, "device_map": device_map, "tensor_parallel_size": tensor_parallel_size}
    report = run(engine, drafts, target, data, *limits, revision, token, skip_bad, progress=log, **sampling, **where)
    if save:
        log(f"saved {save_evaluation(draft, report)}")
    print(output.to_json(report) if as_json else output.evaluate_text(report))


@app.command()
def speedup(
    evaluation: Annotated[
        Path, typer.Argument(help="evaluation.json (`evaluate --save`) or the draft directory holding it.")
    ],
    target: Annotated[
        str,
        typer.Option(
            "--target", help="Target config.json, its directory, or a hub id whose config ships with mtp2draft."
        ),
    ],
    gpu: Annotated[str, typer.Option("--gpu", help=f"Accelerator: {choices('gpus')}.", show_default=False)],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel devices the target runs on.")] = 1,
    draft: Annotated[
        str | None,
        typer.Option(
            "--draft", help="Draft config.json or dir (default: EVALUATION's draft dir, else the target's MTP layer)."
        ),
    ] = None,
    draft_tp: Annotated[
        int | None, typer.Option("--draft-tp", help="Devices the draft runs on (default: --tp).")
    ] = None,
    context: Annotated[int, typer.Option("--context", help="Context length (tokens of history) per request.")] = 4096,
    batch: Annotated[
        str | None, typer.Option("--batch", help="Batch sizes, e.g. '1,8,64' (default 1,2,4,8,16,32,64).")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Predict tokens/s and time per output token with and without the draft, for k = 1..8 and each batch, and the
    k to use: measured acceptance per position + a cost model of target and draft on the accelerator.

    A prediction (a roofline plus one latency constant fit on published non-speculative figures), not a measurement;
    k beyond the positions the evaluation measured is not predicted.

    Examples:

    * `mtp2draft speedup ds3-mtp-ft --target deepseek-ai/DeepSeek-V3 --gpu h200 --tp 8`
    * `mtp2draft speedup glm-e3-ft/evaluation.json --target glm-air/config.json --draft glm-e3-ft --gpu h100 --tp 4`
    * `mtp2draft speedup ds3-mtp-ft --target ds3/config.json --gpu mi300x --tp 8 --context 32768 --json`
    """
    from mtp2draft.speed.api import speedup as run
    from mtp2draft.speed.text import speedup_text

    batches = number_list(batch, "--batch", int)
    report = run(evaluation, target, gpu, tp, draft, context, draft_tp, batches=batches)
    print(output.to_json(report.as_dict()) if as_json else speedup_text(report))


@app.command("dump-hidden")
def dump_hidden(
    target: Target,
    data: Data,
    out: Annotated[Path, typer.Option("--out", help="Output directory (sharded safetensors + manifest.json).")],
    draft: Annotated[
        Path | None, typer.Option("--draft", help="Draft whose inputs to dump (its aux layers, for eagle3).")
    ] = None,
    aux_layers: Annotated[str | None, typer.Option("--aux-layers", help="Aux layer ids 'low,mid,high'.")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Target log-probs kept per position.")] = 64,
    max_length: MaxLength = 256,
    shard_size: Annotated[int, typer.Option("--shard-size", help="Sequences per shard file.")] = 256,
    engine: Annotated[
        str, typer.Option("--engine", help=f"What runs the target: {choices('dump_engines')}.")
    ] = "transformers",
    tensor_parallel_size: Annotated[
        int, typer.Option("--tensor-parallel-size", help="--engine vllm: GPUs the target is split across.")
    ] = 1,
    skip_bad: SkipBad = False,
    revision: Revision = None,
    token: Token = None,
    overwrite: Overwrite = False,
) -> None:
    """Write the target's hidden states and top-k log-probs for offline distillation (`distill --hidden-states`).

    The schema is documented in docs/formats.md; an inference engine's dump can be mapped onto it.

    Example: `mtp2draft dump-hidden --target ./tiny-target --data train.jsonl --draft glm-eagle3 --out dumped/`
    """
    from mtp2draft.data import load_tokenizer, read_examples
    from mtp2draft.draft.modules import load_draft
    from mtp2draft.target.dump_checks import check_dump_request
    from mtp2draft.target.engine import dump_hidden as dump
    from mtp2draft.target.engine import resolve_target

    ids = number_list(aux_layers, "--aux-layers", int)
    final, loaded = None, None
    if draft is not None:
        loaded = load_draft(draft)
        final = getattr(loaded, "input_hidden", None)  # the final hidden a native draft reads
        if ids is None:
            ids = loaded.aux_layer_ids if loaded.kind == DraftKind.EAGLE3 else None
    target_dir = resolve_target(target, revision, token)
    inputs = [data, draft]  # never deleted by --overwrite, never written into
    check_dump_request(target, target_dir, out, overwrite, inputs, top_k, shard_size, max_length, ids, loaded)
    examples, skipped = read_examples(data, load_tokenizer(target_dir), max_length, skip_bad)
    if skipped:
        log(f"skipped {skipped} malformed line(s)")
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    path = dump(
        engine,
        target,
        seqs,
        out,
        revision,
        token,
        tensor_parallel_size,
        aux_layers=ids,
        top_k=top_k,
        shard_size=shard_size,
        overwrite=overwrite,
        progress=log,
        final=final,
        inputs=inputs,
    )
    print(f"wrote hidden states of {len(seqs)} sequences to {path}")


# ---- export / validate / push / run (pipeline stage 4) -------------------------------------------------------------
@app.command()
def export(
    draft: Annotated[Path, typer.Argument(help="Draft directory (written by convert or distill).", show_default=False)],
    format: Annotated[str, typer.Option("--format", help=f"Engine format: {choices('formats')}.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="Output directory.", show_default=False)],
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="Target checkpoint (hub id or local dir): needed by stitched, optional for nextn."
        ),
    ] = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help=f"sglang/speculators weights dtype: {choices('dtypes')}.")
    ] = "bfloat16",
    speculative_tokens: Annotated[
        int, typer.Option("--speculative-tokens", help="speculators: k written into the proposal method.")
    ] = 3,
    verifier: Verifier = None,
    revision: Revision = None,
    token: Token = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
) -> None:
    """Write a draft in the format a serving engine loads; the output is validated before it appears.

    sglang / speculators take EAGLE-3 drafts; nextn / stitched take native MTP drafts (stitched writes the layer back
    into --target's shards, in their dtype and FP8 quantization).

    Examples:

    * `mtp2draft export glm-eagle3-ft --format sglang --out glm-eagle3-sglang`
    * `mtp2draft export glm-eagle3-ft --format speculators --speculative-tokens 4 --out glm-eagle3-vllm`
    * `mtp2draft export ds3-mtp-ft --format stitched --target deepseek-ai/DeepSeek-V3 --out ds3-stitched`
    """
    from mtp2draft.formats.export import export as run

    hub = {"revision": revision, "token": token}
    result = run(
        draft, format, out, target, overwrite, dtype, speculative_tokens, **hub, verifier=verifier, progress=log
    )
    print(output.to_json(output.export_summary(result)) if as_json else output.export_text(result, draft))


@app.command()
def validate(
    path: Annotated[Path, typer.Argument(help="Directory to check.", show_default=False)],
    format: Annotated[
        str | None,
        typer.Option("--format", help=f"{choices('validate')} (default: from config.json).", show_default=False),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", help="Target (hub id or local dir; config only): check aux ids, sizes against it."),
    ] = None,
    revision: Revision = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Check a draft or export directory against its format's contract and list every violation (non-zero exit if
    any).

    Examples: `mtp2draft validate glm-eagle3-sglang` · `mtp2draft validate ds3-stitched --format stitched --json` ·
    `mtp2draft validate glm-eagle3-sglang --target zai-org/GLM-4.5-Air`
    """
    import json

    from mtp2draft.errors import ValidationError
    from mtp2draft.formats.export import detect_format
    from mtp2draft.formats.export import validate as run

    violations = run(path, format, target, revision, token)
    fmt = format or detect_format(json.loads((path / "config.json").read_text()))
    if as_json:
        print(output.to_json({"path": str(path), "format": fmt, "ok": not violations, "violations": violations}))
    else:
        print(output.validate_text(path, fmt, violations))
    if violations:  # the list went to stdout; the one-line error and the exit status come from main()
        raise ValidationError(f"{path}: {len(violations)} violation(s) of the {fmt} format", violations)


@app.command()
def push(
    path: Annotated[Path, typer.Argument(help="Draft or export directory to publish.", show_default=False)],
    repo_id: Annotated[
        str, typer.Option("--repo-id", help="Hub repo (org/name), created if needed.", show_default=False)
    ],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch to commit to (created from main if missing).")
    ] = None,
    commit_message: Annotated[str | None, typer.Option("--commit-message", help="Commit message.")] = None,
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model", help="The target's hub id, for the card's base_model (drafts converted from a local dir)."
        ),
    ] = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Publish a draft to the Hugging Face Hub with a model card (target, acceptance table, launch lines).

    The directory is validated first and never modified: the card is generated into the upload.

    Examples: `mtp2draft push glm-eagle3-sglang --repo-id me/GLM-4.5-Air-eagle3` ·
    `mtp2draft push ds3-stitched --repo-id me/ds3-mtp-ft --revision v2 --private` ·
    `mtp2draft push ./ds3-local-mtp --repo-id me/ds3-mtp --base-model deepseek-ai/DeepSeek-V3`
    """
    from mtp2draft.hub import push as run

    result = run(path, repo_id, private, revision, commit_message, token, base_model, progress=log)
    print(output.to_json(result.__dict__) if as_json else f"{result.url}\ncommit {result.commit}  {result.commit_url}")


@app.command("run")
def run_all(
    ctx: typer.Context,
    source: Source,
    data: Data,
    work: Annotated[Path, typer.Option("--work", help="Work directory: every stage's output is kept here.")],
    to: Annotated[
        str | None,
        typer.Option("--to", help=f"Draft kind: {choices('kinds')} (default: mtp where an engine serves it)."),
    ] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target to distill against (default: SOURCE).")] = None,
    target_revision: Annotated[
        str | None, typer.Option("--target-revision", help="Hub branch, tag or commit of --target (default: main).")
    ] = None,
    eval_data: Annotated[
        Path | None, typer.Option("--eval-data", help="Held-out prompts for evaluation (default: --data).")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="Export format (default: from the family's engine support table).")
    ] = None,
    push_repo: Annotated[str | None, typer.Option("--push", help="Hub repo id to publish the export to.")] = None,
    private: Annotated[bool, typer.Option("--private", help="With --push: create a private repo.")] = False,
    steps: Annotated[int, typer.Option("--steps", help="Distillation steps.")] = 300,
    ttt_steps: Annotated[int, typer.Option("--ttt-steps", help="Draft steps unrolled per position.")] = 3,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 1e-4,
    batch_size: BatchSize = 8,
    max_length: MaxLength = 256,
    draft_vocab_size: Annotated[int | None, typer.Option("--draft-vocab-size", help="eagle3 draft vocabulary.")] = None,
    regenerate: Annotated[bool, typer.Option("--regenerate", help="Train on the target's own responses.")] = False,
    num_draft_tokens: Annotated[int, typer.Option("--num-draft-tokens", "-k", help="Draft tokens per step.")] = 4,
    max_new_tokens: MaxNewTokens = 64,
    max_prompts: Annotated[int | None, typer.Option("--max-prompts", help="Evaluation prompts.")] = 20,
    layer: Annotated[int | None, typer.Option("--layer", help="MTP layer index.")] = None,
    engine: Annotated[
        str | None,
        typer.Option("--engine", help=f"Train for what this engine computes ({choices('engines')})."),
    ] = None,
    revision: Revision = None,
    token: Token = None,
    device: Device = None,
    dtype: TargetDtype = "float32",
    device_map: DeviceMap = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty --work.")] = False,
) -> None:
    """Convert, distill, evaluate (beside the raw MTP head), export and optionally push, in one command.

    Example: `mtp2draft run zai-org/GLM-4.5-Air --data chats.jsonl --eval-data prompts.jsonl --to eagle3 --regenerate --device-map auto --dtype bfloat16 --work glm-run --push me/GLM-4.5-Air-eagle3`
    """
    from mtp2draft.pipeline import run

    cfg = distill_config(ctx)
    stages = {"to": to, "target": target, "eval_data": eval_data, "fmt": fmt, "push_repo": push_repo}
    limits = {"num_draft_tokens": num_draft_tokens, "max_new_tokens": max_new_tokens, "max_prompts": max_prompts}
    hub = {"revision": revision, "token": token, "target_revision": target_revision, "private": private}
    flags = {"layer": layer, "regenerate": regenerate, "overwrite": overwrite}
    where = {"device": device, "dtype": dtype, "device_map": device_map}
    result = run(source, work, data, **stages, distill_config=cfg, **limits, **hub, **flags, **where, progress=log)
    print(output.run_text(result))


@app.command()
def demo(
    work: Annotated[Path, typer.Option("--work", help="Where to keep the demo's drafts.")] = Path("demo-run"),
    steps: Annotated[int, typer.Option("--steps", help="Distillation steps.")] = 150,
) -> None:
    """The quick start: convert -> distill -> evaluate -> export on the small target bundled with the repository
    (an 11M-parameter, 8-layer DeepSeek-V3-layout model whose MTP head was trained jointly with it), then print the
    table.

    Example: `mtp2draft demo --work demo-run`
    """
    from mtp2draft.pipeline import demo as run_demo

    print(output.demo_text(run_demo(work, steps, progress=log)))


# ---- entry point -----------------------------------------------------------------------------------------------------
def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(ClickException, Exit, Abort) classes of the click that typer runs on: recent typer bundles its own copy
    (`typer._click`, with Exit/Abort in `typer.exceptions`), whose exceptions are not click's. Both are caught, so a
    usage error is always the short usage message."""
    import click

    errors, exits, aborts = [click.ClickException], [click.exceptions.Exit], [click.exceptions.Abort]
    bundled = getattr(getattr(typer, "_click", None), "exceptions", None)
    if bundled is not None:
        errors.append(bundled.ClickException)
    for name, bucket in (("Exit", exits), ("Abort", aborts)):
        for module in (getattr(typer, "exceptions", None), bundled):
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                bucket.append(cls)
    return tuple(errors), tuple(exits), tuple(aborts)


def _register_secrets(argv: list[str]) -> None:
    """Remember `--token` values before anything runs, so no file written later can contain them."""
    from mtp2draft.redact import SECRET_OPTIONS, register_secret

    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in SECRET_OPTIONS:
            register_secret(value if eq else (argv[i + 1] if i + 1 < len(argv) else None))


def _os_error_line(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}" if exc.strerror else str(exc)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: one formatter for known errors, tracebacks only under MTP2DRAFT_DEBUG=1."""
    from mtp2draft.redact import redact, set_command

    debug = os.environ.get("MTP2DRAFT_DEBUG") == "1"
    args = list(sys.argv[1:] if argv is None else argv)
    _register_secrets(args)
    set_command(["mtp2draft", *args])
    click_error, click_exit, click_abort = _click_exceptions()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="mtp2draft", standalone_mode=False)
    except click_exit as exc:
        return exc.exit_code
    except click_error as exc:
        exc.show()
        return exc.exit_code
    except click_abort:
        print("aborted", file=sys.stderr)
        return 130
    except Mtp2DraftError as exc:
        if debug:
            raise
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # the environment: disk full, read-only or missing paths, permissions
        if debug:
            raise
        print(f"error: {redact(_os_error_line(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
