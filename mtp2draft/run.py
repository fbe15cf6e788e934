"""The whole pipeline in one call: convert -> distill -> evaluate (beside the raw MTP head) -> export -> push.

`run` chains the stage functions with the defaults a first user wants; every stage's options stay available as
keyword arguments. A work directory keeps each stage's output (`raw/`, `distilled/`, `export/`), so a failed push can
be retried with `mtp2draft push` and nothing already computed is lost.

`demo` is the quick start: the same chain on the small DeepSeek-V3-layout target bundled with the repository (its
MTP head trained jointly with the trunk), printing the acceptance table.

What this module does not do: implement any stage itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .convert import convert
from .distill import DistillConfig, distill
from .errors import SourceError
from .evaluate import evaluate, save_evaluation
from .export import export
from .formats import REGISTRY, formats_of, get_format
from .io import Progress, check_output_dir, mark
from .kinds import DraftKind
from .spec import ENGINES, Spec

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED_TARGET = REPO_ROOT / "examples" / "targets" / "tiny-deepseek-v3"
BUNDLED_DATA = REPO_ROOT / "examples" / "data"


@dataclass
class RunResult:
    work: Path
    raw: Path
    distilled: Path
    exported: Path
    report: dict[str, Any]
    push: Any = None
    stages: dict[str, float] = field(default_factory=dict)


def default_kind_and_format(spec: Spec, to: str | None = None, fmt: str | None = None) -> tuple[str, str]:
    """The draft kind and export format `run` picks when not told, from the family's engine support table: EAGLE-3
    where an engine serves it, native MTP otherwise; then the first format of that kind in `formats.REGISTRY` whose
    module says an engine serves it for the family (sglang, else speculators; nextn, else the stitched overlay)."""
    if to is None:
        to = DraftKind.EAGLE3 if any(spec.serves(e, DraftKind.EAGLE3) for e in ENGINES) else DraftKind.MTP
    if fmt is None:  # the first format of that kind (registry order) an engine serves for the family
        candidates = formats_of(DraftKind(to))
        fmt = next((f for f in candidates if get_format(f).usable(spec)), candidates[0])
    return to, fmt


def run(
    source: str,
    work: str | Path,
    data: str | Path,
    to: str | None = None,
    target: str | None = None,
    eval_data: str | Path | None = None,
    fmt: str | None = None,
    push_repo: str | None = None,
    distill_config: DistillConfig | None = None,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 64,
    max_prompts: int | None = 20,
    layer: int | None = None,
    revision: str | None = None,
    token: str | None = None,
    private: bool = False,
    regenerate: bool = False,
    overwrite: bool = False,
    progress: Progress = lambda _: None,
) -> RunResult:
    """Convert SOURCE's MTP layer, distill it against the target (SOURCE itself unless `target` is given), evaluate
    it beside the untouched MTP head, export it for the engines and, with `push_repo`, publish it."""
    import time

    work = Path(work)
    check_output_dir(work, overwrite, inputs=[source, target, data, eval_data])
    target = target or source
    if to is None or fmt is None:
        from .checkpoint import open_checkpoint
        from .spec import find_spec

        spec = find_spec(open_checkpoint(source, revision, token).config)
        to, fmt = default_kind_and_format(spec, to, fmt)
        progress(f"{spec.name}: drafting {to}, exporting --format {fmt} (the engines' support table: mtp2draft specs)")
    if eval_data is None:
        progress("no --eval-data: evaluating on the training data (acceptance will be optimistic)")
        eval_data = data
    stages: dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    mark(work)  # a later `run --overwrite` may replace it

    t = time.perf_counter()
    progress(f"[1/5] convert {source} -> raw MTP head and {to} draft")
    raw = work / "raw-mtp"
    convert(
        source, raw, to=DraftKind.MTP, layer=layer, revision=revision, token=token, overwrite=True, progress=progress
    )
    start = raw
    if to == DraftKind.EAGLE3:
        start = work / "raw-eagle3"
        convert(
            source,
            start,
            to=DraftKind.EAGLE3,
            layer=layer,
            revision=revision,
            token=token,
            overwrite=True,
            progress=progress,
        )
    stages["convert"] = time.perf_counter() - t

    t = time.perf_counter()
    progress(f"[2/5] distill against {target}")
    distilled = work / "distilled"
    distill(
        start,
        distilled,
        data,
        target,
        config=distill_config or DistillConfig(),
        revision=revision,
        token=token,
        overwrite=True,
        regenerate_data=regenerate,
        progress=progress,
    )
    stages["distill"] = time.perf_counter() - t

    t = time.perf_counter()
    progress(f"[3/5] evaluate (k = {num_draft_tokens}) beside the raw MTP head")
    report = evaluate(
        [("distilled " + to, str(distilled)), ("raw MTP head (baseline)", str(raw))],
        target,
        eval_data,
        num_draft_tokens,
        max_new_tokens,
        max_prompts,
        revision=revision,
        token=token,
        progress=progress,
    )
    save_evaluation(distilled, report)
    stages["evaluate"] = time.perf_counter() - t

    t = time.perf_counter()
    progress(f"[4/5] export --format {fmt}")
    exported = work / f"export-{fmt}"
    export(
        distilled,
        fmt,
        exported,
        target=target if REGISTRY[fmt].reads_target else None,
        overwrite=True,
        speculative_tokens=num_draft_tokens,
        revision=revision,
        token=token,
        progress=progress,
    )
    stages["export"] = time.perf_counter() - t

    pushed = None
    if push_repo:
        from .hub import push

        t = time.perf_counter()
        progress(f"[5/5] push to {push_repo}")
        pushed = push(exported, push_repo, private=private, token=token, progress=progress)
        stages["push"] = time.perf_counter() - t
    else:
        progress("[5/5] push skipped (no --push)")
    return RunResult(work, raw, distilled, exported, report, pushed, stages)


def demo(work: str | Path, steps: int = 150, overwrite: bool = True, progress: Progress = lambda _: None) -> RunResult:
    """The quick start: the full path on the bundled target (native MTP draft: the clearest view of what a short
    training-time-test fine-tune adds to the raw head), evaluated beside the raw head on held-out prompts."""
    if not (BUNDLED_TARGET / "config.json").is_file():
        raise SourceError(f"the bundled target is missing ({BUNDLED_TARGET}): run the demo from a repository checkout")
    cfg = DistillConfig(steps=steps, ttt_steps=4, lr=1e-3, batch_size=8, max_length=256, save_every=max(steps, 1))
    return run(
        str(BUNDLED_TARGET),
        work,
        BUNDLED_DATA / "train.jsonl",
        to=DraftKind.MTP,
        eval_data=BUNDLED_DATA / "heldout.jsonl",
        distill_config=cfg,
        num_draft_tokens=4,
        max_new_tokens=48,
        max_prompts=16,
        overwrite=overwrite,
        progress=progress,
    )
