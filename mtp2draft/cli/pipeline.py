"""`run` and `demo`: every stage in one command (library: `pipeline`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import (
    BatchSize,
    Data,
    Device,
    DeviceMap,
    EvalEvery,
    Heldout,
    HeldoutExamples,
    MaxLength,
    MaxNewTokens,
    Patience,
    Revision,
    Source,
    TargetDtype,
    Token,
    choices,
)
from mtp2draft.cli.root import app, distill_config, log


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
    heldout: Heldout = None,
    eval_every: EvalEvery = 50,
    patience: Patience = None,
    heldout_examples: HeldoutExamples = 64,
    num_draft_tokens: Annotated[int, typer.Option("--num-draft-tokens", "-k", help="Draft tokens per step.")] = 4,
    max_new_tokens: MaxNewTokens = 64,
    max_prompts: Annotated[int | None, typer.Option("--max-prompts", help="Evaluation prompts.")] = 20,
    layer: Annotated[int | None, typer.Option("--layer", help="MTP layer index.")] = None,
    all_layers: Annotated[
        bool, typer.Option("--all-layers", help="Every MTP layer, as one chain draft (native, --format stitched).")
    ] = False,
    serving_engine: Annotated[
        str | None,
        typer.Option("--serving-engine", help=f"Train for what this engine computes ({choices('engines')})."),
    ] = None,
    revision: Revision = None,
    token: Token = None,
    device: Device = None,
    dtype: TargetDtype = "float32",
    device_map: DeviceMap = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty --work.")] = False,
) -> None:
    """Convert, distill, evaluate (beside the raw MTP head), export and optionally push, in one command.

    Examples:

    * `mtp2draft run zai-org/GLM-4.5-Air --data chats.jsonl --eval-data prompts.jsonl --to eagle3 --regenerate --device-map auto --dtype bfloat16 --work glm-run --push me/GLM-4.5-Air-eagle3`

    * `mtp2draft run XiaomiMiMo/MiMo-7B-RL --data chats.jsonl --heldout pick.jsonl --patience 3 --eval-data prompts.jsonl --work mimo-run` (distillation keeps the weights that score best on pick.jsonl, never worse than the raw head there; keep it apart from --eval-data, which reports)
    """
    from mtp2draft.pipeline import run

    cfg = distill_config(ctx)
    stages = {
        "to": to,
        "target": target,
        "eval_data": eval_data,
        "fmt": fmt,
        "push_repo": push_repo,
        "heldout": heldout,
    }
    limits = {"num_draft_tokens": num_draft_tokens, "max_new_tokens": max_new_tokens, "max_prompts": max_prompts}
    hub = {"revision": revision, "token": token, "target_revision": target_revision, "private": private}
    flags = {"layer": layer, "all_layers": all_layers, "regenerate": regenerate, "overwrite": overwrite}
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
