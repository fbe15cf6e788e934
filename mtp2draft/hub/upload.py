"""Stage 4b: publish a draft directory to the Hugging Face Hub, with its model card (`hub/card.py`).

`push` validates the directory first (a broken draft is refused before any request), finds a token (argument,
HF_TOKEN or `hf auth login`), creates the repo if needed, creates the branch when one is asked for, and uploads the
directory with huggingface_hub's `upload_folder` in one commit: weights go through LFS, and files whose content the
Hub already stores are not sent again. The card is staged beside links to the user's files, so the user's directory
is never written to; every file is checked first (no link leading outside it, no Hub token in it).

Failures become one line (`HubError`): no token, 401, 403 (someone else's repo or namespace, read-only token), 5xx,
and network errors. Retries are huggingface_hub's own: it retries LFS transfers (`http_backoff`) but not the
repo-creation and commit POSTs, and neither does this module (a commit is not idempotent).

What this module does not do: write the card (`hub/card.py`), export or validate formats (`formats/export.py`) or
measure acceptance (`evaluation/decode.py`).
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtp2draft._version import __version__
from mtp2draft.checkpoint import network
from mtp2draft.errors import HubError, Mtp2DraftError, ValidationError
from mtp2draft.formats.common import README_FILE
from mtp2draft.formats.export import DraftDirectory, read_draft_directory, validate
from mtp2draft.hub.card import model_card
from mtp2draft.outputs.identity import check_unchanged, draft_identity
from mtp2draft.progress import Progress, quiet
from mtp2draft.redact import find_secret, known_secrets, redact, register_secret
from mtp2draft.settings import HubAccess


@dataclass
class PushResult:
    repo_id: str
    url: str
    commit: str
    commit_url: str
    revision: str
    files: list[str] = field(default_factory=list)


# ---- push -------------------------------------------------------------------------------------------------------
def check_push_access(repo_id: str, token: str | None) -> str:
    """A repo id the Hub accepts and a token to push with (the given one, else HF_TOKEN or `hf auth login`'s), checked
    before anything is created (`run --push` checks it before hours of work). Returns the token."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    register_secret(token)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"{repo_id!r} is not a Hub repo id (org/name): {str(exc).splitlines()[0]}") from None
    token = token or get_token()
    if not token:
        raise HubError("no Hugging Face token: log in with `hf auth login`, set HF_TOKEN, or pass --token")
    return token


def _valid_draft(path: Path) -> DraftDirectory:
    found = read_draft_directory(path)  # DraftError when it is not a draft directory at all
    problems = validate(found)
    if problems:
        raise ValidationError(
            f"{path} is not a valid {found.format} draft ({len(problems)} problems; `mtp2draft validate` lists them): "
            + "; ".join(problems[:3]),
            problems,
        )
    return found


def card_text(path: str | Path, repo_id: str, base_model: str | None = None) -> str:
    """The model card `push` would upload for draft directory `path` to `repo_id` (`push --dry-run`): the draft is
    validated as for the push; nothing is uploaded and no token is needed."""
    return str(model_card(_valid_draft(Path(path)), repo_id, base_model))


def push(
    path: str | Path,
    repo_id: str,
    *,
    hub: HubAccess | None = None,
    private: bool = False,
    commit_message: str | None = None,
    base_model: str | None = None,
    progress: Progress = quiet,
) -> PushResult:
    """Upload draft directory `path` to hub repo `repo_id` (created if needed) with a generated model card.

    hub: the branch to push to (`hub.revision`, created from main when it does not exist) and the token.
    base_model: the target's repo id when the draft's provenance names a local path. Returns the repo URL and the
    commit."""
    from huggingface_hub import HfApi, constants

    hub = hub or HubAccess()
    revision, token = hub.revision, hub.token

    path = Path(path)
    read = draft_identity(path) if path.is_dir() else None  # what is validated and staged; checked before upload
    found = _valid_draft(path)
    token = check_push_access(repo_id, token)
    card = model_card(found, repo_id, base_model)
    network.configure()
    message = commit_message or f"Upload {found.format} draft with mtp2draft {__version__}"
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="mtp2draft-push-") as stage:
        files = _stage(path, Path(stage), str(card))  # every file checked (links out, tokens) before any request
        check_unchanged(path, read, "pushed")  # the staged files are those of the draft validated and carded
        try:
            progress(f"creating {repo_id} on {constants.ENDPOINT} (if needed)")
            with network.checked_answer("create_repo", HubError):
                repo = api.create_repo(repo_id, private=private, exist_ok=True)
                repo_id, repo_url = str(repo.repo_id), str(repo.url)
            if revision:
                with network.checked_answer("create_branch", HubError):
                    api.create_branch(repo_id, branch=revision, exist_ok=True)
            check_unchanged(path, read, "pushed")
            progress(f"uploading {len(files)} files to {repo_id}" + (f"@{revision}" if revision else ""))
            with network.checked_answer("upload_folder", HubError):
                info = api.upload_folder(
                    repo_id=repo_id, folder_path=stage, revision=revision, commit_message=message, token=token
                )
                commit, commit_url = str(info.oid), str(info.commit_url)
        except Mtp2DraftError:
            raise
        except Exception as exc:
            raise _hub_error(exc, repo_id, constants.ENDPOINT) from exc
    url = repo_url + (f"/tree/{revision}" if revision else "")
    return PushResult(repo_id, url, commit, commit_url, revision or "main", files)


def _hub_error(exc: Exception, repo_id: str, endpoint: str) -> Exception:
    """One line for each way a push fails; anything unexpected is re-raised as is (a bug keeps its traceback)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return HubError("HF_HUB_OFFLINE is set: unset it to push")
    if isinstance(exc, HFValidationError):
        return HubError(f"invalid repo id {repo_id!r}: {str(exc).splitlines()[0]}")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        detail = (exc.server_message or str(exc)).strip().splitlines()[0] if str(exc) else ""
        if status == 401:
            return HubError(
                "the Hub rejected the token (401 Unauthorized): log in again with `hf auth login`, set HF_TOKEN, "
                "or pass --token"
            )
        if status == 403:
            return HubError(
                f"no write access to {repo_id} (403 Forbidden): the repo or namespace belongs to another user or "
                f"organisation, or the token is read-only ({detail})"
            )
        if status is not None and status >= 500:
            return HubError(f"the Hub at {endpoint} failed with {status} for {repo_id}: {detail} (try again later)")
        return HubError(f"Hub request for {repo_id} failed ({status}): {detail}")
    if network.is_network_error(exc):
        return HubError(network.describe(exc, endpoint))
    if isinstance(exc, httpx2.HTTPError | OSError):
        return HubError(f"could not reach the Hub at {endpoint}: {exc} (check the network, HF_ENDPOINT, proxies)")
    return exc


# Files small and textual enough to be scanned whole for secrets (and uploaded as redacted copies).
TEXT_SUFFIXES = (".json", ".md", ".txt", ".jinja", ".yaml", ".yml", ".py", ".toml")


def _stage(src: Path, stage: Path, card: str) -> list[str]:
    """Every file of `src` under `stage` (hidden entries skipped, README.md replaced by the card): text files as
    copies with secrets redacted (an older mtp2draft may have recorded a token), others as links after a scan.

    Refused: a file that is a link leading outside `src` (nothing outside the directory the user named is read),
    and a binary file holding a secret (a token in a safetensors header, say): it cannot be redacted safely."""
    root = src.resolve()
    secrets = known_secrets()
    files = []
    for file in sorted(src.rglob("*")):
        rel = file.relative_to(src)
        if not file.is_file() or any(part.startswith(".") for part in rel.parts) or rel.as_posix() == README_FILE:
            continue
        real = file.resolve()
        if root not in real.parents:
            raise HubError(f"{file} leads outside {src} (to {real}): refusing to upload it")
        dest = stage / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if file.suffix in TEXT_SUFFIXES:
            dest.write_text(redact(file.read_text(errors="replace"), secrets))
        else:
            if find_secret(_scannable_bytes(file), secrets):
                raise HubError(f"{file} contains a Hub token: refusing to upload it")
            try:  # a link costs nothing and leaves the user's file untouched; copy where links are not allowed
                os.symlink(real, dest)
            except OSError:
                shutil.copyfile(file, dest)
        files.append(rel.as_posix())
    (stage / README_FILE).write_text(redact(card, secrets))
    return sorted([*files, README_FILE])


def _scannable_bytes(file: Path) -> bytes:
    """The part of a binary file that can carry text: a safetensors header, or the first MiB of anything else."""
    with open(file, "rb") as fh:
        head = fh.read(8)
        if file.suffix == ".safetensors" and len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            return fh.read(min(n, 100 << 20))
        return head + fh.read(1 << 20)
