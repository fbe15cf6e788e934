"""`specs`, `inspect`, `convert`: what families exist, what a checkpoint holds, and turning its MTP layer into
a draft (library: `family.spec`, `conversion`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import (
    AsJson,
    Out,
    Overwrite,
    Revision,
    Source,
    Token,
    choices,
)
from mtp2draft.cli.root import app, log, number_list
from mtp2draft.kinds import DraftKind


@app.command()
def specs(as_json: AsJson = False) -> None:
    """List the checkpoint families mtp2draft can convert (from the spec registry).

    Example: `mtp2draft specs --json`
    """
    from mtp2draft.family.spec import registry

    rows = [s.summary() for s in registry().values()]
    print(output.to_json(rows) if as_json else output.specs_text(rows))


@app.command()
def inspect(source: Source, revision: Revision = None, token: Token = None, as_json: AsJson = False) -> None:
    """Show a checkpoint's family, its MTP layers and their tensors, and what a conversion would fetch.

    Reads only config.json, the index and safetensors headers.

    Examples: `mtp2draft inspect deepseek-ai/DeepSeek-V3` · `mtp2draft inspect ./my-checkpoint --json`
    """
    from mtp2draft.conversion import inspect_checkpoint

    info = inspect_checkpoint(source, revision, token)
    print(output.to_json(info) if as_json else output.inspect_text(info))


@app.command()
def convert(
    source: Source,
    out: Out,
    to: Annotated[str, typer.Option("--to", help=f"Draft kind: {choices('kinds')}.")] = DraftKind.MTP.value,
    layer: Annotated[int | None, typer.Option("--layer", help="MTP layer index (default 0).")] = None,
    all_layers: Annotated[
        bool,
        typer.Option(
            "--all-layers",
            help="Every MTP layer the checkpoint ships, as one chain draft (layer i at step i; --to mtp).",
        ),
    ] = False,
    dtype: Annotated[str, typer.Option("--dtype", help=f"Weights dtype: {choices('dtypes')}.")] = "bfloat16",
    aux_layers: Annotated[
        str | None, typer.Option("--aux-layers", help="eagle3: three target layer ids 'low,mid,high' (output of).")
    ] = None,
    revision: Revision = None,
    token: Token = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
) -> None:
    """Convert the MTP layer of a checkpoint into a draft: native MTP (`--to mtp`) or EAGLE-3 (`--to eagle3`).

    Fetches only the MTP layer's bytes (byte ranges from the Hub, cached) and dequantises FP8.
    The output directory appears complete or not at all.

    Examples:

    * `mtp2draft convert deepseek-ai/DeepSeek-V3 --out ds3-mtp`
    * `mtp2draft convert zai-org/GLM-4.5-Air --to eagle3 --out glm-eagle3 --dtype bfloat16`
    * `mtp2draft convert examples/targets/tiny-mimo-3mtp --all-layers --out mimo3-chain` (its three MTP layers, chained)
    """
    from mtp2draft.conversion import convert as run

    aux = number_list(aux_layers, "--aux-layers", int)
    result = run(source, out, to, layer, dtype, revision, token, overwrite, aux, progress=log, all_layers=all_layers)
    print(output.to_json(output.convert_summary(result)) if as_json else output.convert_text(result))
