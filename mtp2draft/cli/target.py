"""`dump-hidden`: the frozen target's hidden states and log-probs written for offline distillation (library:
`engines.choice`, `target.dump_checks`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.cli.options import Data, Group, Overwrite, SkipBad, Target, TargetEngine, settings
from mtp2draft.cli.root import app, log
from mtp2draft.kinds import DraftKind
from mtp2draft.settings import DumpConfig, HubAccess, Placement
from mtp2draft.train.settings import DistillConfig, TrainingData


@app.command("dump-hidden")
@settings(
    where=Group(Placement, only=("tensor_parallel_size",)),
    hub=HubAccess,
    responses=Group(TrainingData, only=("regenerate", "sample")),
    length=Group(DistillConfig, only=("max_length",)),  # the length distill reads the dump at: one default
    dump=DumpConfig,
)
def dump_hidden(
    target: Target,
    data: Data,
    where: Any,
    hub: Any,
    responses: Any,
    length: Any,
    dump: Any,
    out: Annotated[Path, typer.Option("--out", help="Output directory (sharded safetensors + manifest.json).")],
    draft: Annotated[
        Path | None, typer.Option("--draft", help="Draft whose inputs to dump (its aux layers, for eagle3).")
    ] = None,
    engine: TargetEngine = "transformers",
    skip_bad: SkipBad = False,
    overwrite: Overwrite = False,
) -> None:
    """Write the target's hidden states and top-k log-probs for offline distillation (`distill --hidden-states`).

    The schema is documented in docs/formats.md; an inference engine's dump can be mapped onto it. With
    `--regenerate`, the target first writes its own responses to the data's prompts (chats: the conversation before
    the first assistant turn, through the chat template), in the chosen engine, and those are dumped: for a target
    only an engine can run, the training data comes from the engine too.

    Examples:

    * `mtp2draft dump-hidden --target ./tiny-target --data train.jsonl --draft glm-eagle3 --out dumped/`
    * `mtp2draft dump-hidden --target deepseek-ai/DeepSeek-V3 --data chats.jsonl --engine vllm --regenerate --tensor-parallel-size 8 --out dumped/`
    """
    from mtp2draft.data import load_tokenizer, read_examples
    from mtp2draft.draft.disk import load_draft
    from mtp2draft.engines.choice import dump_hidden_with
    from mtp2draft.target.dump_checks import check_dump_request
    from mtp2draft.target.hidden import local_path

    max_length = length.max_length
    loaded = None
    if draft is not None:  # the aux layers an EAGLE-3 draft reads unless given, the final hidden a native one reads
        loaded = load_draft(draft)
        ids = dump.aux_layers
        if ids is None:
            ids = loaded.aux_layer_ids if loaded.kind == DraftKind.EAGLE3 else None
        dump = replace(dump, aux_layers=ids, final=getattr(loaded, "input_hidden", None))
    target_dir = local_path(target, hub.revision, hub.token)
    inputs = [data, draft]  # never deleted by --overwrite, never written into
    check_dump_request(target, target_dir, out, dump, max_length, overwrite=overwrite, inputs=inputs, draft=loaded)
    examples, skipped = read_examples(data, load_tokenizer(target_dir), max_length, skip_bad)
    if skipped:
        log(f"skipped {skipped} malformed line(s)")
    if responses.regenerate:  # the target's own responses, from the engine that runs it
        from mtp2draft.data import Regeneration
        from mtp2draft.engines.choice import regenerate_with

        eos = load_tokenizer(target_dir).eos_token_id
        how = Regeneration(max_length // 2, responses.sample)
        examples = regenerate_with(engine, examples, target, how, eos=eos, where=where, hub=hub, progress=log)
    seqs = [{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in examples]
    write = {"overwrite": overwrite, "progress": log, "inputs": inputs}
    path = dump_hidden_with(engine, target, seqs, out, dump, where=where, hub=hub, **write)
    print(f"wrote hidden states of {len(seqs)} sequences to {path}")
