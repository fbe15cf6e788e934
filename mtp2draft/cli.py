"""The `mtp2draft` command line: parse, call the library, format. Nothing else lives here.

Data goes to stdout (tables, JSON); progress and logs go to stderr. Known errors (`Mtp2DraftError`) become one line
and a non-zero exit; tracebacks appear only with MTP2DRAFT_DEBUG=1. Typer is imported here and nowhere else.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .errors import Mtp2DraftError

app = typer.Typer(
    name="mtp2draft",
    help="Turn the MTP layer shipped in LLM checkpoints into a speculative-decoding draft model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# ---- shared argument types (as the hf CLI shares repo id / revision / token) -------------------------------------------
Source = Annotated[
    str, typer.Argument(help="Hub repo id (org/name) or local checkpoint directory.", show_default=False)
]
Revision = Annotated[str | None, typer.Option("--revision", help="Hub branch, tag or commit.")]
Token = Annotated[str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN or `hf auth login`).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]


def log(message: str) -> None:
    """Progress and logs: stderr, so stdout stays data."""
    print(message, file=sys.stderr, flush=True)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _kinds() -> list[str]:
    from .convert import DRAFT_KINDS

    return list(DRAFT_KINDS)


# ---- specs ---------------------------------------------------------------------------------------------------------
@app.command()
def specs(as_json: AsJson = False) -> None:
    """List the checkpoint families mtp2draft can convert (from the spec registry).

    Example: `mtp2draft specs --json`
    """
    from .spec import registry

    rows = [s.summary() for s in registry().values()]
    if as_json:
        _print_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        flag = "" if r["verified"] else "  (layout unverified)"
        print(f"{r['name']:<{width}}  {', '.join(r['architectures'] or r['model_types'])}  [{r['block']}]{flag}")


# ---- inspect -------------------------------------------------------------------------------------------------------
@app.command()
def inspect(source: Source, revision: Revision = None, token: Token = None, as_json: AsJson = False) -> None:
    """Show a checkpoint's family, its MTP layers and their tensors, and what a conversion would fetch.

    Reads only config.json, the index and safetensors headers.

    Examples: `mtp2draft inspect deepseek-ai/DeepSeek-V3` · `mtp2draft inspect ./my-checkpoint --json`
    """
    from .convert import inspect_checkpoint

    info = inspect_checkpoint(source, revision, token)
    if as_json:
        _print_json(info)
        return
    print(f"source        {info['source']}" + (f"  (commit {info['commit'][:12]})" if info["commit"] else ""))
    print(f"family        {info['spec']}: {info['family']}")
    print(f"block         {info['block']}")
    print(f"MTP layers    {info['num_mtp_layers']}")
    for layer in info["layers"]:
        print(
            f"\nlayer {layer['layer']}: {layer['parameters']:,} parameters, {_human(layer['bytes'])}"
            + (f", {layer['fp8_weights']} FP8 weights" if layer["fp8_weights"] else "")
        )
        for t in layer["tensors"]:
            print(f"  {t['name']:<64} {str(t['shape']):<18} {t['dtype']:<8} {_human(t['bytes'])}")
    total = info["checkpoint_bytes"]
    share = f" ({100 * info['convert_bytes'] / total:.2f} % of the checkpoint)" if total else ""
    print(f"\nconvert fetches {_human(info['convert_bytes'])} of {_human(total)}{share}")


# ---- convert -------------------------------------------------------------------------------------------------------
@app.command()
def convert(
    source: Source,
    out: Annotated[Path, typer.Option("--out", help="Output draft directory.", show_default=False)],
    to: Annotated[str, typer.Option("--to", help=f"Draft kind: {' | '.join(_kinds())}.")] = "mtp",
    layer: Annotated[int | None, typer.Option("--layer", help="MTP layer index (default 0).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Weights dtype: bfloat16 | float32.")] = "bfloat16",
    aux_layers: Annotated[
        str | None, typer.Option("--aux-layers", help="eagle3: three target layer ids 'low,mid,high' (output of).")
    ] = None,
    revision: Revision = None,
    token: Token = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty --out.")] = False,
    as_json: AsJson = False,
) -> None:
    """Convert the MTP layer of a checkpoint into a draft: native MTP (`--to mtp`) or EAGLE-3 (`--to eagle3`).

    Fetches only the MTP layer's bytes (byte ranges from the Hub, cached) and dequantises FP8.
    The output directory appears complete or not at all.

    Examples:

    * `mtp2draft convert deepseek-ai/DeepSeek-V3 --out ds3-mtp`
    * `mtp2draft convert zai-org/GLM-4.5-Air --to eagle3 --out glm-eagle3 --dtype bfloat16`
    """
    from .convert import convert as run

    aux = [int(x) for x in aux_layers.split(",")] if aux_layers else None
    result = run(source, out, to, layer, dtype, revision, token, overwrite, aux, progress=log)
    summary = {
        "out": str(result.out),
        "draft_kind": result.kind,
        "spec": result.spec,
        "mtp_layer": result.layer,
        "bytes_fetched": result.bytes_fetched,
        "checkpoint_bytes": result.checkpoint_bytes,
        "seconds": round(result.seconds, 2),
    }
    if as_json:
        _print_json(summary)
    else:
        exact = sum(1 for t in result.provenance.get("tensors", {}).values() if t["exact"])
        total = len(result.provenance.get("tensors", {}))
        print(f"wrote {result.kind} draft to {result.out} ({result.spec}, MTP layer {result.layer})")
        print(
            f"fetched {_human(result.bytes_fetched)} of a {_human(result.checkpoint_bytes)} checkpoint "
            f"in {result.seconds:.1f} s; {exact}/{total} tensors transferred exactly (see provenance.json)"
        )


# ---- distill / evaluate / dump-hidden (pipeline stages 2 and 3) ----------------------------------------------------

# ---- export / validate / push / run (pipeline stage 4) -------------------------------------------------------------

# ---- entry point -----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Console-script entry: one formatter for known errors, tracebacks only under MTP2DRAFT_DEBUG=1."""
    import click

    debug = os.environ.get("MTP2DRAFT_DEBUG") == "1"
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="mtp2draft", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except Mtp2DraftError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
