"""The whole pipeline in one call: convert -> distill -> evaluate (beside the raw MTP head) -> export -> push.

`run` chains the stage functions with the defaults a first user wants; every stage's options stay available as
keyword arguments. A work directory keeps each stage's output (`raw/`, `distilled/`, `export/`), so a failed push can
be retried with `mtp2draft push` and nothing already computed is lost.

`demo` is the quick start: the same chain on the small DeepSeek-V3-layout target bundled with the repository (its
MTP head trained jointly with the trunk), printing the acceptance table.

What this module does not do: implement any stage itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp2draft.conversion import convert, refuse_eagle3
from mtp2draft.errors import Mtp2DraftError, SourceError, read_json_object
from mtp2draft.evaluation.decode import evaluate, save_evaluation
from mtp2draft.evaluation.settings import EvaluateConfig
from mtp2draft.family.spec import ENGINES, Spec
from mtp2draft.formats import REGISTRY, ExportConfig, formats_of, get_format
from mtp2draft.formats.export import export
from mtp2draft.io import Progress, check_output_dir, claim_output, mark
from mtp2draft.kinds import DraftKind
from mtp2draft.target.device import resolve_device
from mtp2draft.train.recipe import distill
from mtp2draft.train.settings import DistillConfig

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
    target_figures: dict[str, Any] | None = None
    """The demo's bundled target: how good it is (`target_figures`), from its training.json."""


def default_kind_and_format(spec: Spec, to: str | None = None, fmt: str | None = None) -> tuple[str, str]:
    """The draft kind and export format `run` picks when not told, from the family's engine support table: native
    MTP where an engine serves it, EAGLE-3 otherwise (docs/eagle3-from-mtp.md: distilled for the same steps, the
    native draft accepts more than an EAGLE-3 draft converted from the same layer, which loses the chain after
    position 1); then the first format of that kind in `formats.REGISTRY` whose module says an engine serves it for
    the family (nextn, else the stitched overlay; sglang, else speculators)."""
    if to is None:
        to = DraftKind.MTP if any(spec.serves(e, DraftKind.MTP) for e in ENGINES) else DraftKind.EAGLE3
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
    heldout: str | Path | None = None,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 64,
    max_prompts: int | None = 20,
    layer: int | None = None,
    revision: str | None = None,
    token: str | None = None,
    target_revision: str | None = None,
    all_layers: bool = False,
    private: bool = False,
    regenerate: bool = False,
    overwrite: bool = False,
    progress: Progress = lambda _: None,
    device: str | None = None,
    dtype: str = "float32",
    device_map: str | dict | None = None,
) -> RunResult:
    """Convert SOURCE's MTP layer, distill it against the target (SOURCE itself unless `target` is given), evaluate
    it beside the untouched MTP head, export it for the engines and, with `push_repo`, publish it.

    `revision` pins SOURCE; `target_revision` pins a `target` given apart from SOURCE (a revision names a commit of
    one repo, so SOURCE's never travels to another). The token is the user's credential and serves both. The target
    runs in `dtype` on `device` (default: cuda when available) or spread by `device_map`, in distill and evaluate
    alike; the draft trains and decodes on `device` (a device map's first device). `heldout`: distill's held-out
    guard (`train/heldout.py`): the distilled draft is the best-scoring weights on it, never worse than the raw head
    there."""
    work = Path(work)
    config = distill_config or DistillConfig()
    limits = {"num_draft_tokens": num_draft_tokens, "max_new_tokens": max_new_tokens, "max_prompts": max_prompts}
    check = {"to": to, "fmt": fmt, "target": target, "eval_data": eval_data, "push_repo": push_repo, "layer": layer}
    check |= {"all_layers": all_layers, "heldout": heldout}
    spec, to, fmt = preflight(source, work, data, config, limits, revision, token, overwrite, **check)
    if target is None or target == source:
        target, target_revision = source, revision
    with claim_output(work):  # held for the whole run; the output rules again, now that no other run can write here
        check_output_dir(work, overwrite, inputs=[source, target, data, eval_data, heldout])
        progress(f"{spec.name}: drafting {to}, exporting --format {fmt} (the engines' support table: mtp2draft specs)")
        return _run(
            source=source, work=work, data=data, to=to, target=target, eval_data=eval_data, fmt=fmt,
            push_repo=push_repo, config=config, limits=limits, layer=layer, all_layers=all_layers, revision=revision,
            token=token,
            target_revision=target_revision, private=private, regenerate=regenerate, progress=progress,
            device=device, dtype=dtype, device_map=device_map, heldout=heldout,
        )  # fmt: skip


def preflight(
    source: str,
    work: Path,
    data: str | Path,
    config: DistillConfig,
    limits: dict[str, Any],
    revision: str | None,
    token: str | None,
    overwrite: bool,
    to: str | None,
    fmt: str | None,
    target: str | None,
    eval_data: str | Path | None,
    push_repo: str | None,
    layer: int | None,
    all_layers: bool = False,
    heldout: str | Path | None = None,
) -> tuple[Spec, str, str]:
    """Everything `run` can check before the first byte of a tensor is fetched, in one place: option values and
    clashes (the format takes the draft kind), the output rules, the data files, the source's family and MTP layer,
    engine support for --serving-engine, the target's identity with the source, and for --push a repo id and a token.
    Returns (spec, kind, format) with the defaults filled in. Reads configs only."""
    from mtp2draft.checkpoint.reader import open_checkpoint
    from mtp2draft.conversion import default_aux_layers
    from mtp2draft.draft.layout import resolve_layer
    from mtp2draft.errors import OptionError
    from mtp2draft.family.spec import find_spec
    from mtp2draft.formats import exportable
    from mtp2draft.kinds import DRAFT_KINDS
    from mtp2draft.target.identity import config_differences
    from mtp2draft.train.calibrate import check_draft_vocab_size
    from mtp2draft.train.recipe import check_training_settings

    for option, value in (
        ("--num-draft-tokens", limits["num_draft_tokens"]),
        ("--max-new-tokens", limits["max_new_tokens"]),
        ("--max-prompts", 1 if limits["max_prompts"] is None else limits["max_prompts"]),
    ):
        if value < 1:
            raise OptionError(f"{option} must be at least 1, got {value}")
    if to is not None and to not in DRAFT_KINDS:
        raise OptionError(f"--to must be one of {', '.join(DRAFT_KINDS)}, got {to!r}")
    formats = exportable()
    if fmt is not None and fmt not in formats:
        raise OptionError(f"--format must be one of {', '.join(formats)}, got {fmt!r}")
    if to is not None and fmt is not None and formats[fmt] != to:
        raise OptionError(
            f"--format {fmt} takes {formats[fmt].a_draft} draft, --to {to} makes {DraftKind(to).a_draft} one "
            f"(use --format {' or '.join(formats_of(DraftKind(to)))})"
        )
    check_output_dir(work, overwrite, inputs=[source, target, data, eval_data, heldout])
    _check_data_files(config, data, eval_data, heldout)
    ckpt = open_checkpoint(source, revision, token)
    spec = find_spec(ckpt.config)
    resolve_layer(ckpt, spec, layer)
    kind = to or (formats[fmt] if fmt else None)  # --format alone implies its kind
    kind, fmt = default_kind_and_format(spec, kind, fmt)
    if all_layers:
        _check_all_layers(layer, kind, fmt)
    if kind == DraftKind.EAGLE3:
        refuse_eagle3(spec)  # a family without an EAGLE-3 conversion
        default_aux_layers(spec.num_layers(ckpt.config))  # a target too shallow for EAGLE-3
    check_training_settings(kind, spec, config)
    if config.steps == 0 and kind == DraftKind.MTP:  # what distill refuses after loading the target
        raise OptionError("--steps 0 would write an untrained draft: 0 steps only calibrate an EAGLE-3 draft")
    check_draft_vocab_size(kind, config.draft_vocab_size, int(spec.text_config(ckpt.config)["vocab_size"]))
    if target is not None and target != source:
        diffs = config_differences(spec.name, ckpt.config, open_checkpoint(target, revision, token).config)
        if diffs:
            more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise SourceError(
                f"--target {target} is not the checkpoint {source} (the draft's source): {'; '.join(diffs[:3])}{more}"
            )
    if push_repo:
        _check_push(push_repo, token)
    return spec, kind, fmt


def _check_data_files(
    config: DistillConfig, data: str | Path, eval_data: str | Path | None, heldout: str | Path | None
) -> None:
    """Every data file `run` was given exists and is a file; the held-out guard's options fit (distill's check)."""
    from mtp2draft.errors import DataError
    from mtp2draft.train.recipe import check_heldout_options

    check_heldout_options(config, heldout, None)
    for option, path in (("--data", data), ("--eval-data", eval_data), ("--heldout", heldout)):
        if path is not None and not Path(path).is_file():
            raise DataError(
                f"{option} {path} does not exist" if not Path(path).exists() else f"{option} {path} is not a file"
            )


def _check_all_layers(layer: int | None, kind: str, fmt: str) -> None:
    """`--all-layers` makes a chain draft (convert --all-layers): native, and only `stitched` holds every layer."""
    from mtp2draft.errors import OptionError

    if layer is not None:
        raise OptionError("--layer and --all-layers exclude each other (--all-layers takes every MTP layer)")
    if kind != DraftKind.MTP or fmt != "stitched":
        raise OptionError(
            f"--all-layers makes a native chain draft, which only --format stitched holds (this run: --to {kind}, "
            f"--format {fmt})"
        )


def _check_push(repo_id: str, token: str | None) -> None:
    """A repo id the Hub accepts and a token to push with, before hours of work rather than after."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from mtp2draft.errors import HubError

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"--push {repo_id!r} is not a Hub repo id (org/name): {str(exc).splitlines()[0]}") from None
    if not (token or get_token()):
        raise HubError("--push needs a Hugging Face token: log in with `hf auth login`, set HF_TOKEN, or pass --token")


def _run(
    *,
    source: str,
    work: Path,
    data: str | Path,
    to: str,
    target: str,
    eval_data: str | Path | None,
    fmt: str,
    push_repo: str | None,
    config: DistillConfig,
    limits: dict[str, Any],
    layer: int | None,
    all_layers: bool,
    revision: str | None,
    token: str | None,
    private: bool,
    regenerate: bool,
    progress: Progress,
    target_revision: str | None,
    device: str | None,
    dtype: str,
    device_map: str | dict | None,
    heldout: str | Path | None = None,
) -> RunResult:
    num_draft_tokens = limits["num_draft_tokens"]
    if eval_data is None:
        progress("no --eval-data: evaluating on the training data (acceptance will be optimistic)")
        eval_data = data
    if heldout is not None and Path(heldout).resolve() == Path(eval_data).resolve():
        progress("note: --heldout is also the evaluation data: the weights are picked on the prompts that report them")
    stages: dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    mark(work)  # a later `run --overwrite` may replace it
    hub = {"revision": revision, "token": token}  # for SOURCE
    target_hub = {"revision": target_revision, "token": token}  # for the target (SOURCE's own unless --target)
    inside = {"overwrite": True, "progress": progress}  # the stages write inside `work`, checked above
    distilled, exported = work / "distilled", work / f"export-{fmt}"
    device = resolve_device(device)

    with _stage(stages, "convert", progress, f"[1/5] convert {source} -> raw MTP head and {to} draft"):
        raw, start = _convert(source, work, to, layer, {**hub, **inside, "all_layers": all_layers})
    with _stage(stages, "distill", progress, f"[2/5] distill against {target}"):
        where = {"device": device, "target_dtype": dtype, "device_map": device_map}
        distill(
            start, distilled, data, target, config=config, regenerate_data=regenerate, heldout=heldout,
            **target_hub, **inside, **where,
        )  # fmt: skip
    with _stage(stages, "evaluate", progress, f"[3/5] evaluate (k = {num_draft_tokens}) beside the raw MTP head"):
        drafts = [("distilled " + to, str(distilled)), ("raw MTP head (baseline)", str(raw))]
        where = {"device": device, "dtype": dtype, "device_map": device_map}
        settings = EvaluateConfig(**limits)
        report = evaluate(drafts, target, eval_data, settings, **target_hub, progress=progress, **where)
        save_evaluation(distilled, report)
    with _stage(stages, "export", progress, f"[4/5] export --format {fmt}"):
        reads = target if REGISTRY[fmt].reads_target else None
        config = ExportConfig(speculative_tokens=num_draft_tokens)
        export(distilled, fmt, exported, target=reads, config=config, **target_hub, **inside)
    pushed = None
    if push_repo:
        from mtp2draft.hub import push

        with _stage(stages, "push", progress, f"[5/5] push to {push_repo}"):
            pushed = push(exported, push_repo, private=private, token=token, progress=progress)
    else:
        progress("[5/5] push skipped (no --push)")
    return RunResult(work, raw, distilled, exported, report, pushed, stages)


@contextmanager
def _stage(stages: dict[str, float], name: str, progress: Progress, line: str) -> Iterator[None]:
    """Announce a stage and record its wall time in `stages[name]` (seconds), as the demo prints them."""
    started = time.perf_counter()
    progress(line)
    yield
    stages[name] = time.perf_counter() - started


def _convert(source: str, work: Path, to: str, layer: int | None, options: dict[str, Any]) -> tuple[Path, Path]:
    """The raw MTP head (`raw-mtp/`, the evaluation's baseline) and the draft to distill: that head itself, or for
    `--to eagle3` an EAGLE-3 draft converted beside it (`raw-eagle3/`)."""
    outs = {DraftKind.MTP: work / "raw-mtp"}
    if to == DraftKind.EAGLE3:
        outs[DraftKind.EAGLE3] = work / "raw-eagle3"
    for kind, out in outs.items():
        convert(source, out, to=kind, layer=layer, **options)
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


def demo(work: str | Path, steps: int = 150, overwrite: bool = True, progress: Progress = lambda _: None) -> RunResult:
    """The quick start: the full path on the bundled target (native MTP draft: the clearest view of what a short
    training-time-test fine-tune adds to the raw head), evaluated beside the raw head on held-out prompts."""
    if not (BUNDLED_TARGET / "config.json").is_file():
        raise SourceError(f"the bundled target is missing ({BUNDLED_TARGET}): run the demo from a repository checkout")
    cfg = DistillConfig(steps=steps, ttt_steps=4, lr=1e-3, batch_size=8, max_length=256, save_every=max(steps, 1))
    result = run(
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
        device="cpu",  # the figures the quick start documents are the CPU's
    )
    result.target_figures = target_figures(BUNDLED_TARGET)
    return result
