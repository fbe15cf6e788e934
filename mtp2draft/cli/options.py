"""The command line's option types, declared once and shared by the commands in `cli` (as the hf CLI shares repo id,
revision and token). Choice lists in help texts come from the registries that own them, never a hand-written list.

What this module does not do: parse, call the library or print (`cli` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mtp2draft.kinds import DRAFT_KINDS, DRAFT_SAMPLING, DTYPE_NAMES


def choices(option: str, sep: str = " | ") -> str:
    """The values an option's help lists, from the registry that owns them (kinds, engines, formats, subsets, gpus)."""
    from mtp2draft.evaluation.backend import EVALUATE_ENGINES
    from mtp2draft.family.spec import ENGINES, STEP_LAYER_RULES
    from mtp2draft.formats import FORMATS, VALIDATE_FORMATS
    from mtp2draft.speed.accelerators import ACCELERATORS
    from mtp2draft.target.backend import DUMP_ENGINES
    from mtp2draft.train.subsets import TRAIN_SUBSETS

    registries = {"kinds": DRAFT_KINDS, "engines": ENGINES, "formats": FORMATS, "validate": VALIDATE_FORMATS}
    registries |= {"subsets": TRAIN_SUBSETS, "dump_engines": DUMP_ENGINES, "gpus": ACCELERATORS}
    registries |= {"draft_sampling": DRAFT_SAMPLING, "dtypes": DTYPE_NAMES, "evaluate_engines": EVALUATE_ENGINES}
    registries |= {"step_layers": STEP_LAYER_RULES}
    return sep.join(registries[option])


Source = Annotated[
    str, typer.Argument(help="Hub repo id (org/name) or local checkpoint directory.", show_default=False)
]
Revision = Annotated[str | None, typer.Option("--revision", help="Hub branch, tag or commit.")]
Token = Annotated[str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN or `hf auth login`).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]
Out = Annotated[Path, typer.Option("--out", help="Output draft directory.", show_default=False)]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty --out.")]
Data = Annotated[Path, typer.Option("--data", help="JSONL: {'text': ...} or {'messages': [...]} per line.")]
Target = Annotated[str, typer.Option("--target", help="Target model: hub repo id or local directory.")]
SkipBad = Annotated[bool, typer.Option("--skip-bad", help="Skip malformed data lines (counted) instead of failing.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Sequences per step.")]
MaxLength = Annotated[int, typer.Option("--max-length", help="Tokens per sequence.")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")]

# distill's options, one line each in its signature (help texts as `mtp2draft distill --help` shows them)
DraftDir = Annotated[Path, typer.Argument(help="Draft directory from `convert` (mtp or eagle3).", show_default=False)]
HiddenStates = Annotated[
    Path | None, typer.Option("--hidden-states", help="Train from a `dump-hidden` directory instead of a target.")
]
DraftVocab = Annotated[
    int | None, typer.Option("--draft-vocab-size", help="eagle3: keep the V most frequent target tokens.")
]
StepWeights = Annotated[
    str | None, typer.Option("--step-weights", help="Loss weight per TTT step, e.g. '1,0.8,0.64' (default 0.8^s).")
]
TeacherTemperature = Annotated[
    float,
    typer.Option(
        "--teacher-temperature",
        help="Learn the target's distribution sharpened to p^(1/T); below 1 favours its top token (greedy serving).",
    ),
]
ServingEngine = Annotated[
    str | None,
    typer.Option(
        "--serving-engine",
        help=f"Train for what this engine computes ({choices('engines')}; facts per family: `mtp2draft specs`).",
    ),
]
Handover = Annotated[
    str | None,
    typer.Option("--hidden-handover", help="mtp: post_norm | pre_norm, overriding --serving-engine's hand-over."),
]
Regenerate = Annotated[
    bool, typer.Option("--regenerate", help="Train on the target's own responses to the data's prompts.")
]
# what runs the target (one meaning of --engine; `distill --serving-engine` names the engine a draft is trained for)
TargetEngine = Annotated[str, typer.Option("--engine", help=f"What runs the target: {choices('dump_engines')}.")]
TensorParallelSize = Annotated[
    int, typer.Option("--tensor-parallel-size", help="--engine vllm: GPUs the target is split across.")
]
Device = Annotated[str | None, typer.Option("--device", help="cpu, cuda, cuda:N (default: cuda when available).")]
Precision = Annotated[
    str | None, typer.Option("--precision", help="fp32 or bf16 (default: bf16 on CUDA, fp32 elsewhere).")
]
# where the frozen target runs (evaluate, and distill's online target); the draft follows the target
TargetDtype = Annotated[
    str, typer.Option("--dtype", help=f"dtype the target is loaded and run in: {choices('dtypes')}.")
]
DeviceMap = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="Spread the target over the local GPUs as transformers' device_map does (e.g. auto); overrides --device.",
    ),
]
# evaluate: what runs the target (as dump-hidden's --engine), and vLLM's split of it
EvalEngine = Annotated[str, typer.Option("--engine", help=f"What runs the target: {choices('evaluate_engines')}.")]
EvalDtype = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help=f"dtype the target runs in: {choices('dtypes')} (default: float32; --engine vllm: the checkpoint's own).",
        show_default=False,
    ),
]
TensorParallel = Annotated[
    int | None,
    typer.Option(
        "--tensor-parallel-size", help="--engine vllm: GPUs the target is split across (default 1).", show_default=False
    ),
]
TrainSubset = Annotated[str, typer.Option("--train-subset", help=f"Parameters to train: {choices('subsets', ', ')}.")]
Checkpointing = Annotated[
    bool, typer.Option("--activation-checkpointing", help="Recompute the block's MLP in backward.")
]
Plan = Annotated[bool, typer.Option("--plan", help="Print the per-rank memory plan (every --train-subset) and exit.")]
WorldSize = Annotated[
    int | None, typer.Option("--world-size", help="With --plan: ranks to plan for (default: torchrun's, or 1).")
]

# export / push
Verifier = Annotated[
    str | None,
    typer.Option("--verifier", help="speculators(-mtp): the target's hub id (default: the source converted from)."),
]

# distill's held-out guard (train/heldout.py)
Heldout = Annotated[
    Path | None,
    typer.Option(
        "--heldout",
        help="Held-out JSONL (prompts the training never sees): evaluated every --eval-every steps and before the "
        "first; the best-scoring weights are written, never worse than the input draft on it.",
    ),
]
EvalEvery = Annotated[int, typer.Option("--eval-every", help="With --heldout: evaluate every N steps.")]
Patience = Annotated[
    int | None, typer.Option("--patience", help="With --heldout: stop after N evaluations without a gain.")
]
HeldoutExamples = Annotated[
    int, typer.Option("--heldout-examples", help="With --heldout: use at most N of its examples.")
]
