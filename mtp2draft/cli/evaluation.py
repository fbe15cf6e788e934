"""`evaluate` and `speedup`: measured acceptance against the target, and the speed it predicts on an accelerator
(library: `evaluation.decode`, `evaluation.dspark` for DSpark drafts, `speed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import AsJson, Data, EvalEngine, Target, choices, parse_list, settings
from mtp2draft.cli.root import app, log
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.settings import HubAccess, Placement, ints


@app.command()
@settings(config=EvaluateConfig, where=Placement, hub=HubAccess)
def evaluate(
    draft: Annotated[Path, typer.Argument(help="Draft directory to evaluate.", show_default=False)],
    target: Target,
    data: Data,
    config: Any,
    where: Any,
    hub: Any,
    baseline: Annotated[
        list[Path] | None,
        typer.Option("--baseline", help="Other draft(s) to run on the same prompts, e.g. the raw MTP head."),
    ] = None,
    save: Annotated[bool, typer.Option("--save", help="Write evaluation.json into the draft directory.")] = False,
    engine: EvalEngine = "transformers",
    as_json: AsJson = False,
) -> None:
    """Measure acceptance by real speculative decoding (chain of k drafts) against the target: greedy verification,
    or speculative sampling with --temperature.

    Reports mean acceptance length (target tokens per target forward, bonus included), acceptance per draft
    position both conditional (given the earlier ones accepted) and per draft (vLLM's counters), and `lossless`: the
    output equals the target's own greedy output on every prompt; at a temperature, a KS test of the emitted tokens'
    randomised PIT under the target's distribution instead (`distribution_check`). Greedy ties of the top two
    logits within the rounding of --dtype are reported, not raised. The draft runs on the target's device, in its dtype.
    `--engine vllm` serves the target with the draft in vLLM instead (its own venv: mtp2draft engine install vllm) and reads
    the same figures from vLLM's counters, the plain target's run giving the lossless check and the clock.
    A DSpark draft directory drafts blocks of its own size (greedy, transformers only), reported twice: whole blocks
    and cut by its confidence head (--confidence-threshold), with the target forwards against plain greedy decoding.

    Examples:

    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --baseline glm-mtp -k 4 --device-map auto --dtype bfloat16`
    * `mtp2draft evaluate glm-eagle3-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --device-map auto --dtype bfloat16 --json --save`
    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --device-map auto --dtype bfloat16 --temperature 1 --seed 0 --draft-sampling sample`
    * `mtp2draft evaluate tiny-ft --target ./tiny-target --data prompts.jsonl --device cpu` (fp32, the default dtype)
    * `mtp2draft evaluate mimo3-chain-ft --target ./tiny-mimo-3mtp --data prompts.jsonl --step-layers first` (a chain draft as vLLM 0.32 runs it: layer 0 at every step)
    * `mtp2draft evaluate glm-mtp-ft --target zai-org/GLM-4.5-Air --data prompts.jsonl --engine vllm --tensor-parallel-size 4`
    * `mtp2draft evaluate qwen-dspark-ft --target ./qwen3-target --data prompts.jsonl --baseline qwen-dspark` (DSpark drafters)
    """
    from mtp2draft.engines.choice import evaluate_with
    from mtp2draft.evaluation.saved import save_evaluation, saving_into
    from mtp2draft.formats import charts

    drafts = [("draft", str(draft))] + [(f"baseline: {b}", str(b)) for b in (baseline or [])]
    measured = saving_into(draft) if save else None  # the draft's identity, before it is read
    report = evaluate_with(engine, drafts, target, data=data, config=config, where=where, hub=hub, progress=log)
    if save:
        saved, chart = save_evaluation(draft, report, measured, progress=log)
        why = charts.unavailable()
        log(f"saved {saved}" + (f" and {chart}" if chart else f" (no acceptance chart: {why})" if why else ""))
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
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            help="Context length (tokens of history) per request (default 4096, or the target's own when shorter).",
        ),
    ] = None,
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
    from mtp2draft.speed.api import speedup
    from mtp2draft.speed.text import speedup_text

    batches = parse_list(batch, "--batch", ints)
    sizes = {"tp": tp, "draft_tp": draft_tp, "context": context, "batches": batches}
    report = speedup(evaluation, target, gpu, draft=draft, **sizes)
    print(output.to_json(report.as_dict()) if as_json else speedup_text(report))
