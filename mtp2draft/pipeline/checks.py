"""What `run --push` asks the Hub before any work: that it takes the token, lets it write, and lets its user create
the repo. (`hub.upload.check_push_access` checks the repo id and finds the token; `hub.upload.push` uploads.)

What this module does not do: create, upload or change anything on the Hub.
"""

from __future__ import annotations

from mtp2draft.errors import HubError


def check_repo_creatable(repo_id: str, token: str) -> None:
    """The token is valid, may write, and names a user who may create (or already owns) `repo_id`: its namespace is
    the user's or one of the user's organisations. Asked of the Hub's whoami, before any work (`run --push`)."""
    from huggingface_hub import HfApi

    try:
        who = HfApi().whoami(token=token)
    except Exception as exc:  # noqa: BLE001 - the client raises HTTP, connection and validation errors alike
        status = getattr(getattr(exc, "response", None), "status_code", None)
        why = (
            "the Hub rejects the token"
            if status == 401
            else f"the Hub cannot be asked ({(str(exc).splitlines() or [type(exc).__name__])[0]})"
        )
        raise HubError(f"--push {repo_id}: {why}; log in with `hf auth login`, set HF_TOKEN, or pass --token") from None
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError(f"--push {repo_id}: the token is read-only; use a token with write access")
    user = str(who.get("name", ""))
    namespaces = {user, *(str(o.get("name", "")) for o in who.get("orgs") or [] if isinstance(o, dict))}
    namespace = repo_id.split("/", 1)[0]
    if namespace not in namespaces:
        raise HubError(
            f"--push {repo_id}: the token's user {user} may create repos under {', '.join(sorted(namespaces))}, "
            f"not {namespace}"
        )
