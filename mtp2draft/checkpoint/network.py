"""Bounded waits and one-line failures for every request mtp2draft makes to a Hub endpoint.

huggingface_hub's shared HTTP client waits forever by default (`timeout=None`, and some calls pass `None`
explicitly), so an endpoint that accepts a connection and never answers would hang `convert` or `push` for good.
`configure()` adds a request hook to that shared client which gives every request without its own timeout a
connect/read/write timeout of `MTP2DRAFT_HUB_TIMEOUT` seconds (default 30). Retries with backoff stay
huggingface_hub's (`http_backoff`); `retries()` is how many mtp2draft asks for (`MTP2DRAFT_HUB_RETRIES`, default 5).
`describe()` turns a network exception into one line that names the endpoint and what to try.

Answers are checked, not trusted: a proxy or captive portal can answer 200 with an HTML page, `{}` or JSON cut
short, which huggingface_hub parses into a `KeyError`, `JSONDecodeError` or `TypeError`. `configure()` also adds a
response hook that keeps the first bytes of the last API answer (`/api/...`: small JSON, read whole anyway), and
`checked_answer(call, error)` turns such a parse failure inside a Hub call into one line naming the call, the
request and those bytes.

What this module does not do: make requests itself, or decide which errors are the user's (callers wrap them in
their stage's error type).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

TIMEOUT_ENV = "MTP2DRAFT_HUB_TIMEOUT"
RETRIES_ENV = "MTP2DRAFT_HUB_RETRIES"
DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 5


def _env_number(name: str, default: float, cast: type) -> float:
    from mtp2draft.errors import SourceError

    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise SourceError(f"{name}={raw!r} is not a number") from None
    if value < 0 or (cast is float and value == 0):
        raise SourceError(f"{name}={raw!r} must be positive")
    return value


def timeout() -> float:
    """Seconds to wait for a connection, and for each read or write on it."""
    return float(_env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT, float))


def retries() -> int:
    """Retries (with huggingface_hub's exponential backoff) of a failed range request."""
    return int(_env_number(RETRIES_ENV, DEFAULT_RETRIES, int))


def _apply_timeout(request) -> None:
    # A request carries its timeout in extensions (httpx); None values there mean "wait forever".
    current = request.extensions.get("timeout") or {}
    if not any(v is not None for v in current.values()):
        seconds = timeout()
        request.extensions["timeout"] = {"connect": seconds, "read": seconds, "write": seconds, "pool": seconds}


# Bytes of an answer shown when it is not what the Hub sends.
FIRST_BYTES = 60
_last = threading.local()  # .answer: (method, url, first bytes) of the last API answer this thread received


def _record_answer(response) -> None:
    if "/api/" in response.request.url.path:  # API answers are small JSON; downloads (/resolve/) are never read here
        response.read()
        _last.answer = (response.request.method, str(response.request.url), bytes(response.content[:FIRST_BYTES]))


def configure() -> None:
    """Make huggingface_hub's shared client time out and keep the start of API answers (idempotent; call before any
    Hub request)."""
    from huggingface_hub import get_session

    hooks = get_session().event_hooks
    if _apply_timeout not in hooks["request"]:
        hooks["request"] = [*hooks["request"], _apply_timeout]
    if _record_answer not in hooks["response"]:
        hooks["response"] = [*hooks["response"], _record_answer]


@contextlib.contextmanager
def checked_answer(call: str, error: type[Exception]) -> Iterator[None]:
    """Run Hub call `call` (e.g. "model_info"); an answer huggingface_hub cannot parse (HTML, `{}`, JSON cut short:
    `KeyError`, `ValueError`, `TypeError`, ...) becomes `error` with one line naming the call, the request and the
    first bytes that came back. huggingface_hub's own errors (HTTP status, repo id) and mtp2draft's pass through."""
    from huggingface_hub.errors import HFValidationError

    from mtp2draft.errors import Mtp2DraftError

    _last.answer = None
    try:
        yield
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        if isinstance(exc, HFValidationError | Mtp2DraftError):
            raise
        raise error(describe_answer(call, exc)) from exc


def describe_answer(call: str, exc: BaseException) -> str:
    """One line for an answer that is not the Hub's: which call, which request, what was wrong, the first bytes."""
    from huggingface_hub import constants

    answer = getattr(_last, "answer", None)
    what = f"no field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    if answer is None:
        return f"the Hub at {constants.ENDPOINT} answered {call} with something that is not the Hub's answer ({what})"
    method, url, first = answer
    return (
        f"the Hub at {constants.ENDPOINT} answered {call} ({method} {url}) with something that is not the Hub's "
        f"answer ({what}); it began {first!r}: check HF_ENDPOINT and proxies"
    )


def not_the_hubs_download(exc: BaseException) -> str | None:
    """One line when a download failed because the answer was not a Hub's (no `X-Repo-Commit` / ETag / size headers,
    or a body of another size than the Hub announced: an HTML page or `{}` served for a file), else None."""
    from huggingface_hub import constants
    from huggingface_hub.errors import FileMetadataError

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc).strip()
        if isinstance(exc, FileMetadataError) or text.startswith("Consistency check failed"):
            first = text.splitlines()[0] if text else type(exc).__name__
            return (
                f"the Hub at {constants.ENDPOINT} answered a file download with something that is not the Hub's "
                f"answer ({first[:300]}): check HF_ENDPOINT and proxies"
            )
        exc = exc.__cause__ or exc.__context__
    return None


def range_answer_problem(response, start: int, end: int, size: int | None = None) -> str | None:
    """Why `response` to a request for bytes [start, end) of a file of `size` bytes (None: unknown) is not a Hub's
    answer to it, or None. A Hub answers 206 with a `Content-Range` starting at `start`, or 200 with the whole file
    (a server that ignores ranges): a 200 of another length is a page or a JSON body standing in for the file."""
    if response.status_code == 206:
        given = response.headers.get("Content-Range", "")
        return None if given.startswith(f"bytes {start}-") else f"206 with Content-Range {given!r}"
    length = response.headers.get("Content-Length")
    if response.status_code != 200 or length is None or not length.isdigit():
        return None
    if int(length) < end or (size is not None and int(length) != size):
        kind = response.headers.get("Content-Type", "no type")
        whole = f" of a {size}-byte file" if size is not None else ""
        return f"200 with {length} bytes of {kind} for bytes {start}-{end - 1}{whole}"
    return None


def describe_range_answer(url: str, problem: str, first: bytes) -> str:
    """One line for a range read answered by something that is not the Hub."""
    from huggingface_hub import constants

    return (
        f"the Hub at {constants.ENDPOINT} answered a range read (GET {url}) with something that is not the Hub's "
        f"answer ({problem}); it began {first[:FIRST_BYTES]!r}: check HF_ENDPOINT and proxies"
    )


def is_network_error(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is a connection failure or a timeout rather than an HTTP answer."""
    import httpx2

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, httpx2.TransportError | TimeoutError | ConnectionError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def describe(exc: BaseException, endpoint: str | None = None) -> str:
    """One line for a network failure: what happened, where, and what to try."""
    import httpx2
    from huggingface_hub import constants

    endpoint = endpoint or constants.ENDPOINT
    root = exc
    while root.__cause__ is not None and not isinstance(root, httpx2.TransportError):
        root = root.__cause__
    if isinstance(root, httpx2.TimeoutException | TimeoutError):
        what = f"no answer within {timeout():g} s"
        hint = f"set {TIMEOUT_ENV} to wait longer"
    else:
        what = f"cannot connect ({type(root).__name__})"
        hint = "check the network, HF_ENDPOINT and proxies"
    return f"the Hub at {endpoint} is unreachable: {what}; {hint}, or set HF_HUB_OFFLINE=1 to use what is cached"
