"""Keep secrets out of everything mtp2draft writes: provenance, configs, model cards, logs, uploads.

A Hub token can reach the process three ways: `--token`, the `HF_TOKEN` / `HUGGING_FACE_HUB_TOKEN` variables, or the
token file `hf auth login` writes. `known_secrets()` collects all three (plus any a caller registered), and
`redact` / `scrub` replace them in text and JSON-like data. Command lines are recorded through `command_line()`,
which also blanks the value of every secret-bearing option by name, and anything shaped like a Hugging Face token,
whether or not this process knows it.

`RedactedStream` / `redacted_output` put the same redactor in front of stdout and stderr: the CLI runs every command
inside `redacted_output`, so progress lines, tables and error lines are redacted by value like every file.

What this module does not do: decide what is written (the stages do) or refuse uploads (`hub/upload.py` uses `find_secret`
for that). It never logs what it finds.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

MASK = "***"
# Options whose value is a secret, in every command that takes them.
SECRET_OPTIONS = ("--token",)
# Hugging Face user access tokens: "hf_" then 30+ random letters and digits, upper and lower case mixed (34 in
# today's tokens; older "api_" org tokens alike). A name a person chose (`hf_models_cache`, `hf_` + 20 lowercase
# letters in a path) is not that shape and is recorded as named; the token this process holds is redacted by value.
TOKEN_PATTERN = re.compile(r"\b(?:hf|api)_(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[a-z])[A-Za-z0-9]{30,}\b")
# Shortest string treated as a secret: a one-character "token" would turn every write into asterisks.
MIN_SECRET_LENGTH = 8

_registered: set[str] = set()
_command: list[str] | None = None


def set_command(argv: Sequence[str]) -> None:
    """The command line being run (the CLI sets it; `sys.argv` is the fallback for library calls)."""
    global _command
    _command = list(argv)


def register_secret(value: str | bool | None) -> None:
    """Remember a secret this process was handed (e.g. `--token`) so that no later write can contain it."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH:
        _registered.add(value)


def known_secrets() -> set[str]:
    """Every token this process could use: registered ones, the environment's, and the stored login token."""
    found = set(_registered)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = os.environ.get(var)
        if value:
            found.add(value.strip())
    try:
        from huggingface_hub import get_token

        stored = get_token()
    except Exception:  # no huggingface_hub login state at all: nothing to hide
        stored = None
    if stored:
        found.add(stored)
    return {s for s in found if len(s) >= MIN_SECRET_LENGTH}


def redact(text: str, secrets: set[str] | None = None) -> str:
    """`text` with every known secret and anything shaped like a Hub token replaced by ***."""
    for secret in sorted(secrets if secrets is not None else known_secrets(), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return TOKEN_PATTERN.sub(MASK, text)


def scrub(data: Any, secrets: set[str] | None = None) -> Any:
    """A copy of JSON-like `data` (dicts, lists, strings, numbers) with every string redacted."""
    secrets = known_secrets() if secrets is None else secrets
    if isinstance(data, str):
        return redact(data, secrets)
    if isinstance(data, dict):
        return {scrub(k, secrets) if isinstance(k, str) else k: scrub(v, secrets) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [scrub(v, secrets) for v in data]
    return data


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that is running, for provenance: secret options' values blanked, then `redact`ed."""
    args = list(argv if argv is not None else _command if _command is not None else sys.argv)
    if args:
        args[0] = os.path.basename(args[0])  # the program, not where it is installed
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_OPTIONS:
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return redact(" ".join(out))


class RedactedStream:
    """A text stream (stdout, stderr) whose every write passes `redact`, with the secrets known when it was made: what
    mtp2draft prints (progress lines, tables, JSON, errors) goes through the same redactor as what it writes."""

    def __init__(self, stream: Any, secrets: set[str] | None = None) -> None:
        self._stream = stream
        self._secrets = known_secrets() if secrets is None else secrets

    def write(self, text: str) -> int:
        return self._stream.write(redact(text, self._secrets))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """sys.stdout and sys.stderr as `RedactedStream`s for the duration (restored after)."""
    secrets = known_secrets()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactedStream(saved[0], secrets), RedactedStream(saved[1], secrets)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def find_secret(data: bytes, secrets: set[str] | None = None) -> bool:
    """Whether `data` contains a known secret or a Hub-token-shaped string."""
    secrets = known_secrets() if secrets is None else secrets
    if any(s.encode() in data for s in secrets):
        return True
    return TOKEN_PATTERN.search(data.decode("utf-8", errors="replace")) is not None
