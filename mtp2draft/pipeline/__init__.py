"""The whole pipeline in one call: convert -> distill -> evaluate (beside the raw MTP head) -> export -> push.

`run` chains the stage functions with the defaults a first user wants; every stage's settings stay available, each
stage's record handed whole (`Stages`). A work directory keeps each stage's output (`raw-mtp/`, `distilled/`, `export-FORMAT/`) and the
run's record (`record`: its inputs, settings and finished stages), so the same command run again continues after the
last finished stage, and a failed push can be retried with `mtp2draft push`. What `run` checks before stage 1 beyond
the stages' own checks is in `checks`.

`demo` is the quick start: the same chain on the small DeepSeek-V3-layout target bundled with the repository (its
MTP head trained jointly with the trunk), printing the acceptance table.

What this module does not do: implement any stage itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mtp2draft.bundled import BUNDLED_DATA, BUNDLED_TARGET, DEMO_STEPS
from mtp2draft.conversion import convert
from mtp2draft.errors import (
    HubError,
    Mtp2DraftError,
    OptionError,
    OutputExistsError,
    SourceError,
    read_json_object,
)
from mtp2draft.evaluation.decode import evaluate
from mtp2draft.evaluation.saved import save_evaluation
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.family.schema import Spec
from mtp2draft.formats import REGISTRY, ExportConfig, formats_of, get_format
from mtp2draft.formats.export import export
from mtp2draft.hub.card import serve_text
from mtp2draft.kinds import DraftKind
from mtp2draft.manifest import mark
from mtp2draft.outputs.claims import claim_output
from mtp2draft.outputs.directories import check_output_dir
from mtp2draft.pipeline import record as run_record
from mtp2draft.progress import Progress
from mtp2draft.settings import ConvertConfig, HubAccess, Placement, RunConfig
from mtp2draft.target.device import resolve_device
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig, DistillJob, TrainingData


@dataclass
class RunResult:
    work: Path
    raw: Path
    distilled: Path
    exported: Path
    report: dict[str, Any]
    push: Any = None
    stages: dict[str, float] = field(default_factory=dict)
    target_figures: dict[str, Any] | None = None
    """The demo's bundled target: how good it is (`target_figures`), from its training.json."""
    serving: list[str] = field(default_factory=list)
    """How to serve the export where it lies: the launch lines its card gives (`hub.serve_text`)."""


def default_format(spec: Spec, kind: str) -> str:
    """The export format `run` picks when not told: the first format of the draft's kind in `formats.REGISTRY` whose
    module says an engine serves it for the family (nextn, else the stitched overlay; sglang, else speculators)."""
    candidates = formats_of(DraftKind(kind))
    return next((f for f in candidates if get_format(f).usable(spec)), candidates[0])


def run(
    source: str,
    *,
    config: RunConfig,
    stages: Stages | None = None,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
) -> RunResult:
    """Convert SOURCE's MTP layer, distill it against the target (SOURCE itself unless `config.target`), evaluate it
    beside the untouched MTP head, export it for the engines and, with `config.push`, publish it.

    Each stage takes its own settings whole (`stages`, each stage's defaults when None); `where` is where the target runs, in distill and evaluate alike (the
    draft trains and decodes on its device). `hub.revision` pins SOURCE and `config.target_revision` a target given
    apart from it (a revision names a commit of one repo, so SOURCE's never travels to another); the token serves
    both. `export` defaults to speculators' k = the evaluation's k. Everything checkable from configs is checked
    before the first tensor byte is fetched (`preflight`)."""
    stages = stages or Stages()
    where, hub = where or Placement(), hub or HubAccess()
    config = replace(config, training=config.training or TrainingData())
    given = {"convert": stages.convert, "distill": stages.distill, "evaluate": stages.evaluate, "export": stages.export}
    now = run_record.identity(source, config, given, where, hub.revision)
    check_work(source, config, now)
    check_extras(where, progress)
    spec, stages = preflight(source, config, stages, hub)
    work = Path(config.work)
    with claim_output(work):  # held for the whole run; the output rules again, now that no other run can write here
        finished = check_work(source, config, now)
        kind, fmt = stages.convert.to, stages.format
        progress(
            f"{spec.name}: drafting {kind}, exporting --format {fmt} (the engines' support table: mtp2draft specs)"
        )
        if finished:
            progress(f"continuing the run in --work {work}: finished earlier, kept: {', '.join(finished)}")
        return _run(source, config, stages, where, hub, progress, Record(work, now, finished or {}))


def check_work(source: str, config: RunConfig, now: dict) -> dict | None:
    """The output rules for --work, and whether a rerun may continue the run it holds: the stages finished there
    (`run_record.check_resumable`), None for a fresh run. --overwrite starts afresh; a non-empty --work without a
    record of this run's inputs and settings is refused in one line naming --work."""
    work, inputs = Path(config.work), run_inputs(source, config)
    try:
        if config.overwrite or not work.is_dir() or not any(work.iterdir()) or run_record.read(work) is None:
            check_output_dir(work, config.overwrite, inputs=inputs)
            return None
        check_output_dir(work, True, inputs=inputs)  # inside no input, and a directory mtp2draft wrote
        return run_record.check_resumable(work, now)
    except OutputExistsError as exc:  # the output rules speak of --out: run's output option is --work
        raise OutputExistsError(str(exc).replace(f"--out {config.work}", f"--work {config.work}", 1)) from None


def check_extras(where: Placement, progress: Progress) -> None:
    """The optional packages the options need, checked before stage 1: accelerate for --device-map (refused without
    it); matplotlib for the charts (a note: the run draws none without it)."""
    import importlib.util

    if where.device_map is not None and importlib.util.find_spec("accelerate") is None:
        raise OptionError(
            f"--device-map {where.device_map} needs accelerate: pip install 'mtp2draft[device-map]' "
            "(or leave --device-map out to run the target on one device)"
        )
    if importlib.util.find_spec("matplotlib") is None:
        progress("note: matplotlib is not installed, so no charts are drawn (pip install 'mtp2draft[chart]')")


@dataclass(frozen=True)
class Stages:
    """Each stage's settings as `run` hands them on (each stage's defaults unless given; `export` None: speculators'
    k = the evaluation's), with the defaults `preflight` fills in (the draft kind, the export format)."""

    convert: ConvertConfig = field(default_factory=ConvertConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    export: ExportConfig | None = None
    format: str | None = None


def run_inputs(source: str, config: RunConfig) -> list:
    """What `run` reads and so never writes or deletes, `--overwrite` or not."""
    return [source, config.target, config.training.data, config.eval_data, config.training.heldout]


def check_chats_render(source: str, config: RunConfig, stages: Stages) -> None:
    """Every chat of --data, --heldout and --eval-data rendered by the target's template as distill and evaluate
    will render it, so a chat the template cannot render stops run before anything is converted. Done where the
    tokenizer is on disk (a local target); a Hub target's tokenizer comes with its download, in the stage."""
    from mtp2draft.data import encode, load_tokenizer, prompt_ids, rendered

    where = Path(str(config.target or source)).expanduser()
    data = [p for p in (config.training.data, config.training.heldout, config.eval_data) if p is not None]
    if not where.is_dir() or not any(_has_chats(p) for p in data):
        return
    tokenizer = load_tokenizer(where)
    length, prompt = stages.distill.max_length, stages.evaluate.max_prompt_length
    for path, skip_bad in ((config.training.data, stages.evaluate.skip_bad), (config.training.heldout, False)):
        if path is not None:
            rendered(path, lambda r: encode(r, tokenizer, length), skip_bad)
    if config.eval_data is not None:
        rendered(config.eval_data, lambda r: prompt_ids(r, tokenizer, prompt), stages.evaluate.skip_bad)


def _has_chats(path: str | Path) -> bool:
    from mtp2draft.data import read_records

    return any("messages" in r for r in read_records(path, skip_bad=True)[0])


def preflight(source: str, config: RunConfig, stages: Stages, hub: HubAccess) -> tuple[Spec, Stages]:
    """Everything `run` can check before the first byte of a tensor is fetched, each by the stage that owns the check
    (the output rules are `check_work`'s, before this): the data files, the source's family and MTP layer (convert's), the format against the draft kind
    (export's), the training settings for that kind and family (distill's), the target's identity with the source,
    and for --push a repo id, a valid token and a namespace it may create the repo in (push's). Returns the spec and the stages with the kind and format filled in.
    Reads configs only."""
    from mtp2draft.checkpoint.reader import open_checkpoint
    from mtp2draft.conversion import check_conversion
    from mtp2draft.data import check_data_file, read_records
    from mtp2draft.formats import check_format, get_format
    from mtp2draft.target.identity import check_same_checkpoint
    from mtp2draft.train.calibrate import check_draft_vocab_size
    from mtp2draft.train.checks import check_heldout_options, check_training_settings, refuse_untrained

    training = config.training
    if training.data is None:
        raise OptionError(
            'run needs --data: a JSONL file to distill on, one {"text": ...} or {"messages": [...]} per line'
        )
    if training.hidden_states is not None:
        raise OptionError("run distills on --data against the online target (dump-hidden data: run distill itself)")
    check_heldout_options(stages.distill, training.heldout, None)
    skip = stages.evaluate.skip_bad  # run's one --skip-bad: --data and --eval-data (held-out lines are never skipped)
    for option, path, skip_bad in (
        ("--data", training.data, skip),
        ("--eval-data", config.eval_data, skip),
        ("--heldout", training.heldout, False),
    ):
        if path is not None:  # every line read as the stage will read it: an empty or non-UTF-8 file stops run here
            read_records(check_data_file(path, option), skip_bad)
    check_chats_render(source, config, stages)
    ckpt = open_checkpoint(source, hub.revision, hub.token)
    convert = stages.convert
    if convert.to is None and config.format is not None:  # --format alone implies its kind
        convert = replace(convert, to=check_format(config.format))
    spec, convert, _, _ = check_conversion(ckpt, convert)
    kind = DraftKind(convert.to)
    fmt = config.format or default_format(spec, kind)
    check_format(fmt, kind, f"--to {kind}")
    if (check_family := get_format(fmt).check_family) is not None:  # a format no engine builds for this family
        check_family(spec)
    if convert.all_layers and fmt != "stitched":  # run's own rule: only the stitched overlay holds every layer
        raise OptionError(f"--all-layers makes a native chain draft, which only --format stitched holds, not {fmt}")
    layers = spec.num_mtp_layers(ckpt.config) if convert.all_layers else 1
    check_training_settings(kind, spec, stages.distill, layers)
    refuse_untrained(stages.distill, calibrates=kind == DraftKind.EAGLE3)
    check_draft_vocab_size(kind, stages.distill.draft_vocab_size, int(spec.text_config(ckpt.config)["vocab_size"]))
    if config.target is not None and config.target != source:
        target = open_checkpoint(config.target, config.target_revision, hub.token)
        check_same_checkpoint(
            spec.name, ckpt.config, target.config, f"--target {config.target}", f"the checkpoint {source} (the source)"
        )
    if config.push:
        from mtp2draft.hub.upload import check_push_access
        from mtp2draft.pipeline.checks import check_repo_creatable

        check_repo_creatable(config.push, check_push_access(config.push, hub.token))
    return spec, replace(stages, convert=convert, format=fmt)


class PushFailed(HubError):
    """`run --push` failed at the push, after every other stage finished: `result` holds the run (its acceptance
    table and the complete export), so the command line still prints it."""

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


@dataclass
class Record:
    """The run's record in its work directory (`run_record`): its identity and the stages finished so far."""

    work: Path
    identity: dict
    finished: dict

    def begin(self) -> None:
        self.finished = run_record.begin(self.work, self.identity, self.finished)

    def done(self, stage: str, result: dict | None = None) -> None:
        run_record.finish(self.work, self.identity, self.finished, stage, result)


def _run(
    source: str,
    config: RunConfig,
    stages: Stages,
    where: Placement,
    hub: HubAccess,
    progress: Progress,
    record: Record,
) -> RunResult:
    training = config.training
    work, data, fmt, kind = Path(config.work), training.data, stages.format, stages.convert.to
    evaluation = stages.evaluate
    eval_data = config.eval_data
    if eval_data is None:
        eval_data = data
        if evaluation.max_prompts is None:  # training data can hold thousands of records
            evaluation = replace(evaluation, max_prompts=20)
        progress(f"no --eval-data: evaluating on the first {evaluation.max_prompts} prompts of the training data "
                 "(acceptance will be optimistic)")  # fmt: skip
    if training.heldout is not None and Path(training.heldout).resolve() == Path(eval_data).resolve():
        progress("note: --heldout is also the evaluation data: the weights are picked on the prompts that report them")
    if config.target is None or config.target == source:
        target, target_hub = source, hub
    else:
        target, target_hub = config.target, HubAccess(revision=config.target_revision, token=hub.token)
    k = evaluation.num_draft_tokens
    export_config = stages.export or ExportConfig(speculative_tokens=k)
    times: dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    mark(work, files=(run_record.RECORD,))  # the stages mark their own directories; `run --overwrite` may replace it
    record.begin()
    inside = {"overwrite": True, "progress": progress}  # the stages write inside `work`, checked above
    distilled, exported = work / "distilled", work / f"export-{fmt}"
    raw = work / "raw-mtp"
    start = work / "raw-eagle3" if kind == DraftKind.EAGLE3 else raw
    resolve_device(where.device)  # a device this machine lacks stops run before stage 1, not after it
    report: dict[str, Any] = {}
    step = _Steps(record, times, progress)

    with step("convert", f"[1/5] convert {source} -> raw MTP head and {kind} draft") as todo:
        if todo:
            raw, start = _convert(source, work, stages.convert, hub, inside)
    with step("distill", f"[2/5] distill against {target}") as todo:
        if todo:
            resume = _resumable(distilled, stages.distill.steps)
            if resume:
                progress(f"continuing distillation from its last checkpoint in {_checkpoints(distilled)}")
            # run's one --skip-bad serves --data here and --eval-data below; the stage writes inside `work`
            distill(DistillJob(
                draft_dir=start, out=distilled, target=target, data=training, config=stages.distill,
                where=where, hub=target_hub, resume=resume, overwrite=True, skip_bad=evaluation.skip_bad,
                progress=progress,
            ))  # fmt: skip
    with step("evaluate", f"[3/5] evaluate (k = {k}) beside the raw MTP head") as todo:
        if todo:
            drafts = [("distilled " + kind, str(distilled)), ("raw MTP head (baseline)", str(raw))]
            report = evaluate(drafts, target, eval_data, evaluation, where=where, hub=target_hub, progress=progress)
            save_evaluation(distilled, report, progress=progress)
        else:
            report = read_json_object(distilled / "evaluation.json", SourceError)
    with step("export", f"[4/5] export --format {fmt}") as todo:
        if todo:
            reads = target if REGISTRY[fmt].reads_target else None
            export(distilled, fmt, exported, reads, config=export_config, hub=target_hub, **inside)
    result = RunResult(work, raw, distilled, exported, report, None, times)
    result.serving = serve_text(exported) if exported.is_dir() else []  # a stage stood in for by a caller
    if not config.push:
        progress("[5/5] push skipped (no --push)")
        return result
    return _push(config, hub, result, record, step)


def _push(config: RunConfig, hub: HubAccess, result: RunResult, record: Record, step: _Steps) -> RunResult:
    """Stage 5: publish the export. Pushed to the same repo by an earlier run: kept. A failure raises `PushFailed`,
    which carries the finished run and says how to publish the complete export."""
    from mtp2draft.hub.upload import PushResult, push

    earlier, exported = record.finished.get("push") or {}, result.exported
    if earlier.get("repo_id") == config.push:
        step.progress(f"[5/5] push to {config.push}: finished in an earlier run, kept")
        result.push = PushResult(**earlier)
        return result
    try:
        with step("push", f"[5/5] push to {config.push}", recorded=False):
            result.push = push(exported, config.push, hub=HubAccess(token=hub.token), private=config.private,
                               progress=step.progress)  # fmt: skip
    except Mtp2DraftError as exc:
        raise PushFailed(
            f"{exc} (the export {exported} is complete: publish it with "
            f"`mtp2draft push {exported} --repo-id {config.push}`, or rerun this command)",
            result,
        ) from exc
    record.done("push", dataclasses.asdict(result.push))
    return result


class _Steps:
    """Each stage as a `with` block that yields whether it must run: False when an earlier run finished it (the
    record says so); a stage that ends records itself finished, one that fails says what is kept and how to go on."""

    def __init__(self, record: Record, times: dict[str, float], progress: Progress) -> None:
        self.record, self.times, self.progress = record, times, progress

    @contextmanager
    def __call__(self, name: str, line: str, recorded: bool = True) -> Iterator[bool]:
        if recorded and name in self.record.finished:
            self.progress(f"{line}: finished in an earlier run, kept")
            yield False
            return
        started = time.perf_counter()
        self.progress(line)
        try:
            yield True
        except BaseException:
            kept = ", ".join(self.record.finished) or "none"
            self.progress(
                f"run stopped in {name}; finished stages kept in {self.record.work}: {kept}. Rerun the same command "
                f"to continue from {name}"
            )
            raise
        self.times[name] = time.perf_counter() - started
        if recorded:
            self.record.done(name)


def _checkpoints(distilled: Path) -> Path:
    return distilled.parent / f"{distilled.name}.checkpoints"


def _resumable(distilled: Path, steps: int) -> bool:
    """Whether a distill stage that stopped left a checkpoint to continue from, short of the last step."""
    from mtp2draft.train.state import latest_checkpoint

    folder = _checkpoints(distilled)
    latest = latest_checkpoint(folder) if folder.is_dir() else None
    try:
        done = int(latest.name.split("-")[-1]) if latest is not None else 0
    except ValueError:
        return False
    return 0 < done < steps


def _convert(
    source: str, work: Path, config: ConvertConfig, hub: HubAccess, options: dict[str, Any]
) -> tuple[Path, Path]:
    """The raw MTP head (`raw-mtp/`, the evaluation's baseline) and the draft to distill: that head itself, or for
    `--to eagle3` an EAGLE-3 draft converted beside it (`raw-eagle3/`)."""
    outs = {DraftKind.MTP: work / "raw-mtp"}
    if config.to == DraftKind.EAGLE3:
        outs[DraftKind.EAGLE3] = work / "raw-eagle3"
    for kind, out in outs.items():
        convert(source, out, replace(config, to=kind), hub=hub, **options)
    return outs[DraftKind.MTP], out


def target_figures(target: Path) -> dict[str, Any] | None:
    """What a trained target's `training.json` (scripts/train_target.py) says of it on held-out text: next-token top-1,
    how often its MTP head agrees with its own trunk (teacher-forced, and on the trunk's greedy t+2), and how much of
    its greedy continuations repeat 4-grams. None when the file is absent or lacks them."""
    try:
        report = read_json_object(target / "training.json", SourceError)
        return {
            "next_token_top1": float(report["next_token_top1"]),
            "mtp_vs_trunk_agreement": float(report["mtp_vs_trunk_agreement"]),
            "mtp_vs_trunk_greedy_t2": float(report["mtp_vs_trunk_greedy_t2"]),
            "greedy_repeat_rate": float(report["greedy_repeat_rate"]),
            "cpu_minutes": round(float(report["cpu_time_s"]) / 60, 1),
        }
    except (Mtp2DraftError, KeyError, TypeError, ValueError):  # no file, no JSON object, or not these figures
        return None


def demo(
    work: str | Path, steps: int = DEMO_STEPS, overwrite: bool = True, progress: Progress = lambda _: None
) -> RunResult:
    """The quick start: the full path on the bundled target (native MTP draft: the clearest view of what a short
    training-time-test fine-tune adds to the raw head), evaluated beside the raw head on held-out prompts."""
    if not (BUNDLED_TARGET / "config.json").is_file():
        raise SourceError(f"the bundled target is missing ({BUNDLED_TARGET}): run the demo from a repository checkout")
    result = run(
        str(BUNDLED_TARGET),
        config=RunConfig(
            work=Path(work),
            training=TrainingData(data=BUNDLED_DATA / "train.jsonl"),
            eval_data=BUNDLED_DATA / "heldout.jsonl",
            overwrite=overwrite,
        ),
        stages=Stages(
            convert=ConvertConfig(to=DraftKind.MTP),
            distill=DistillConfig(
                steps=steps, ttt_steps=4, lr=1e-3, batch_size=8, max_length=256, save_every=max(steps, 1)
            ),
            evaluate=EvaluateConfig(num_draft_tokens=4, max_new_tokens=48, max_prompts=16),
        ),
        where=Placement(device="cpu"),  # the figures the quick start documents are the CPU's
        progress=progress,
    )
    result.target_figures = target_figures(BUNDLED_TARGET)
    return result
