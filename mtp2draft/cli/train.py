"""`distill` and its `--plan`: fine-tune a draft against the frozen target (library: `train.recipe`,
`train.memory`; a DSpark drafter, or `--new-dspark`: `train.dspark_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtp2draft.cli import output
from mtp2draft.cli.options import (
    AsJson,
    Group,
    OptionalDraftDir,
    OptionalTarget,
    Out,
    Overwrite,
    Plan,
    Resume,
    SkipBad,
    WorldSize,
    settings,
)
from mtp2draft.cli.root import app, log
from mtp2draft.errors import OptionError
from mtp2draft.settings import HubAccess, Placement
from mtp2draft.train.settings import DistillConfig, DistillJob, DSparkObjective, NewDSpark, TrainingData


@app.command()
@settings(
    cfg=DistillConfig,
    data=TrainingData,
    where=Group(Placement, skip=("tensor_parallel_size",)),
    hub=HubAccess,
    dspark=DSparkObjective,
    new=NewDSpark,
)
def distill(
    *,
    draft: OptionalDraftDir = None,
    out: Out,
    cfg: Any,
    data: Any,
    where: Any,
    hub: Any,
    dspark: Any,
    new: Any,
    target: OptionalTarget = None,
    resume: Resume = False,
    skip_bad: SkipBad = False,
    overwrite: Overwrite = False,
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
    * `mtp2draft distill qwen-dspark --target Qwen/Qwen3-8B --data chats.jsonl --heldout heldout.jsonl --out qwen-dspark-ft`
      (a speculators dspark drafter: DeepSpec's objective, written in the same format)
    * `mtp2draft distill --new-dspark 2,5 --block-size 4 --target my-target --data chats.jsonl --out my-dspark` (a new
      DSpark drafter for a target that ships none)
    """
    from mtp2draft.kinds import is_dspark_draft
    from mtp2draft.target.device import resolve_device
    from mtp2draft.train.checks import NEEDS_DRAFT
    from mtp2draft.train.recipe import distill

    if plan:
        if new.new_dspark or (draft is not None and is_dspark_draft(draft)):
            raise OptionError("--plan plans MTP and EAGLE-3 runs; a DSpark drafter has no plan yet")
        if draft is None:
            raise OptionError(NEEDS_DRAFT)
        device = resolve_device(where.device)
        _print_plan(draft, cfg, world_size, device, offline=data.hidden_states is not None, as_json=as_json)
        return
    job = DistillJob(
        draft_dir=draft, out=out, target=target, data=data, config=cfg, where=where, hub=hub, dspark=dspark,
        new=new, resume=resume, overwrite=overwrite, skip_bad=skip_bad, progress=log,
    )  # fmt: skip
    result = distill(job)
    if result.is_main:  # other torchrun ranks: rank 0 reports
        print(output.to_json(output.distill_summary(result)) if as_json else output.distill_text(result))


def _print_plan(draft: Path, cfg: Any, world_size: int | None, device: str, offline: bool, as_json: bool) -> None:
    """`distill --plan`: the per-rank memory plan of every --train-subset, without training."""
    from mtp2draft.train.memory import plan_memory, render

    plans = plan_memory(draft, cfg, world_size, device, offline=offline)
    print(output.to_json([p.as_dict() for p in plans]) if as_json else render(plans))
