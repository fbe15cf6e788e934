"""`export`, `validate`, `push`: a draft in a serving engine's format, its check, and its Hub upload (library:
`formats.export`, `hub`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from mtp2draft.cli import output
from mtp2draft.cli.options import AsJson, Group, Overwrite, choices, settings
from mtp2draft.cli.root import app, log
from mtp2draft.formats import ExportConfig
from mtp2draft.settings import HubAccess


@app.command()
@settings(config=ExportConfig, hub=HubAccess)
def export(
    draft: Annotated[Path, typer.Argument(help="Draft directory (written by convert or distill).", show_default=False)],
    format: Annotated[str, typer.Option("--format", help=f"Engine format: {choices('formats')}.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="Output directory.", show_default=False)],
    config: Any,
    hub: Any,
    target: Annotated[
        str | None, typer.Option("--target", help="Target (hub id or dir): for stitched; nextn optional.")
    ] = None,
    overwrite: Overwrite = False,
    as_json: AsJson = False,
) -> None:
    """Write a draft in the format a serving engine loads; the output is validated before it appears.

    sglang / speculators take EAGLE-3 drafts; nextn / stitched / speculators-mtp take native MTP drafts (stitched
    writes the layer back into --target's shards, in their dtype and FP8 quantization; speculators-mtp is
    speculators' `mtp` speculator type, for Qwen3-Next / Qwen3.5 targets). DSpark drafters: speculators-dspark writes a
    Qwen3-style drafter as vLLM reads it; stitched writes a release's DSpark stages back into --target's shards.

    Examples:

    * `mtp2draft export glm-eagle3-ft --format sglang --out glm-eagle3-sglang`
    * `mtp2draft export glm-eagle3-ft --format speculators --speculative-tokens 4 --out glm-eagle3-vllm`
    * `mtp2draft export ds3-mtp-ft --format stitched --target deepseek-ai/DeepSeek-V3 --out ds3-stitched`
    """
    from mtp2draft.formats.export import export

    result = export(draft, format, out, target=target, overwrite=overwrite, config=config, hub=hub, progress=log)
    print(output.to_json(output.export_summary(result)) if as_json else output.export_text(result, draft))


@app.command()
@settings(hub=HubAccess)
def validate(
    path: Annotated[Path, typer.Argument(help="Directory to check.", show_default=False)],
    format: Annotated[
        str | None,
        typer.Option("--format", help=f"{choices('validate')} (default: from config.json).", show_default=False),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", help="Target (hub id or local dir; config only): check aux ids, sizes against it."),
    ] = None,
    hub: Any = None,
    as_json: AsJson = False,
) -> None:
    """Check a draft or export directory against its format's contract and list every violation (non-zero exit if
    any).

    Examples: `mtp2draft validate glm-eagle3-sglang` · `mtp2draft validate ds3-stitched --format stitched --json` ·
    `mtp2draft validate glm-eagle3-sglang --target zai-org/GLM-4.5-Air`
    """
    from mtp2draft.errors import ValidationError
    from mtp2draft.formats.export import read_draft_directory, validate

    found = read_draft_directory(path, format)
    violations = validate(found, target=target, hub=hub)
    fmt = found.format
    if as_json:
        print(output.to_json({"path": str(path), "format": fmt, "ok": not violations, "violations": violations}))
    else:
        print(output.validate_text(path, fmt, violations))
    if violations:  # the list went to stdout; the one-line error and the exit status come from main()
        raise ValidationError(f"{path}: {len(violations)} violation(s) of the {fmt} format", violations)


@app.command()
@settings(hub=Group(HubAccess, only=("token",)))
def push(
    path: Annotated[Path, typer.Argument(help="Draft or export directory to publish.", show_default=False)],
    repo_id: Annotated[
        str, typer.Option("--repo-id", help="Hub repo (org/name), created if needed.", show_default=False)
    ],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch to commit to (created from main if missing).")
    ] = None,
    commit_message: Annotated[str | None, typer.Option("--commit-message", help="Commit message.")] = None,
    base_model: Annotated[
        str | None,
        typer.Option(
            "--base-model", help="The target's hub id, for the card's base_model (drafts converted from a local dir)."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the model card that would be uploaded (README.md); upload nothing."),
    ] = False,
    hub: Any = None,
    as_json: AsJson = False,
) -> None:
    """Publish a draft to the Hugging Face Hub with a model card (target, acceptance table, launch lines).

    The directory is validated first and never modified: the card is generated into the upload.

    Examples: `mtp2draft push glm-eagle3-sglang --repo-id me/GLM-4.5-Air-eagle3` ·
    `mtp2draft push ds3-stitched --repo-id me/ds3-mtp-ft --revision v2 --private` ·
    `mtp2draft push ./ds3-local-mtp --repo-id me/ds3-mtp --base-model deepseek-ai/DeepSeek-V3` ·
    `mtp2draft push ds3-stitched --repo-id me/ds3-mtp-ft --dry-run > card.md` (the card, nothing uploaded)
    """
    from mtp2draft.hub.upload import card_text, push

    if dry_run:  # the card on stdout, as the upload's README.md would hold it: `> card.md` to read it first
        print(card_text(path, repo_id, base_model), end="")
        return
    branch = replace(hub, revision=revision)  # the repo pushed to is this command's own: --revision is its branch
    commit = {"commit_message": commit_message, "base_model": base_model}
    result = push(path, repo_id, hub=branch, private=private, **commit, progress=log)
    print(output.to_json(result.__dict__) if as_json else f"{result.url}\ncommit {result.commit}  {result.commit_url}")
