"""`distill` and its `--plan`: fine-tune a draft against the frozen target (library: `train.recipe`,
`train.memory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import (
    AsJson,
    BatchSize,
    Checkpointing,
    Device,
    DeviceMap,
    DraftDir,
    DraftVocab,
    EvalEvery,
    Handover,
    Heldout,
    HeldoutExamples,
    HiddenStates,
    MaxLength,
    Out,
    Overwrite,
    Patience,
    Plan,
    Precision,
    Regenerate,
    Revision,
    ServingEngine,
    SkipBad,
    StepWeights,
    TargetDtype,
    TeacherTemperature,
    Token,
    TrainSubset,
    WorldSize,
)
from mtp2draft.cli.root import app, distill_config, log


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
    teacher_temperature: TeacherTemperature = 1.0,
    serving_engine: ServingEngine = None,
    hidden_handover: Handover = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the data order.")] = 0,
    save_every: Annotated[int, typer.Option("--save-every", help="Checkpoint every N steps.")] = 50,
    heldout: Heldout = None,
    eval_every: EvalEvery = 50,
    patience: Patience = None,
    heldout_examples: HeldoutExamples = 64,
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
    * `mtp2draft distill ds3-mtp --target deepseek-ai/DeepSeek-V3 --data train.jsonl --heldout heldout.jsonl --patience 3 --out ds3-mtp-ft` (keeps the weights that score best on held-out prompts; stops after 3 evaluations without a gain)
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
    inputs = {"data": data, "target": target, "hidden_states": hidden_states, "skip_bad": skip_bad, "heldout": heldout}
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
