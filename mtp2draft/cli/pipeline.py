"""`run` and `demo`: every stage in one command (library: `pipeline`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.bundled import DEMO_STEPS, has_bundled_target
from mtp2draft.cli import output
from mtp2draft.cli.options import Group, Source, settings
from mtp2draft.cli.root import app, log
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.settings import ConvertConfig, HubAccess, Placement, RunConfig
from mtp2draft.train.settings import DistillConfig, TrainingData


@app.command("run")
@settings(
    config=RunConfig,
    training=Group(TrainingData, only=("data", "heldout", "regenerate", "sample")),
    convert=Group(ConvertConfig, only=("to", "layer", "all_layers")),
    distill=DistillConfig,
    evaluate=Group(EvaluateConfig, skip=("seed",)),  # --seed is distill's here; the evaluation seeds with 0
    where=Group(Placement, skip=("tensor_parallel_size",)),
    hub=HubAccess,
)
def run_all(
    source: Source, config: Any, training: Any, convert: Any, distill: Any, evaluate: Any, where: Any, hub: Any
) -> None:
    """Convert, distill, evaluate (beside the raw MTP head), export and optionally push, in one command.

    Examples:

    * `mtp2draft run zai-org/GLM-4.5-Air --data chats.jsonl --eval-data prompts.jsonl --to eagle3 --regenerate --device-map auto --dtype bfloat16 --work glm-run --push me/GLM-4.5-Air-eagle3`

    * `mtp2draft run XiaomiMiMo/MiMo-7B-RL --data chats.jsonl --heldout pick.jsonl --patience 3 --eval-data prompts.jsonl --work mimo-run` (distillation keeps the weights that score best on pick.jsonl, never worse than the raw head there; keep it apart from --eval-data, which reports)
    """
    from mtp2draft.pipeline import PushFailed, Stages, run

    stages = Stages(convert=convert, distill=distill, evaluate=evaluate)
    config = replace(config, training=training)
    try:
        result = run(source, config=config, stages=stages, where=where, hub=hub, progress=log)
    except PushFailed as failed:  # every other stage finished: the table and the export are the user's
        print(output.run_text(failed.result))
        raise
    print(output.run_text(result))


@app.command(hidden=not has_bundled_target())  # the wheel ships no bundled target: it does not offer the demo
def demo(
    work: Annotated[Path, typer.Option("--work", help="Where to keep the demo's drafts.")] = Path("demo-run"),
    steps: Annotated[int, typer.Option("--steps", help="Distillation steps.")] = DEMO_STEPS,
) -> None:
    """The quick start: convert -> distill -> evaluate -> export on the small target bundled with the repository
    (an 11M-parameter, 8-layer DeepSeek-V3-layout model whose MTP head was trained jointly with it), then print the
    table.

    Example: `mtp2draft demo --work demo-run`
    """
    from mtp2draft.pipeline import demo

    print(output.demo_text(demo(work, steps, progress=log)))
