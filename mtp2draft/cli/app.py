"""The `mtp2draft` command line: parse, call the library, format. Nothing else lives in `cli/`.

Data goes to stdout (tables, JSON); progress and logs go to stderr. Known errors (`Mtp2DraftError`) become one line
and a non-zero exit; tracebacks appear only with MTP2DRAFT_DEBUG=1. This module is the entry point (`main`): it
registers the command modules on the root group (`root.app`) and formats what they raise; the commands live in one
thin module per group, their shared option types in `options` and what they print in `output`.
"""

from __future__ import annotations

import os
import sys

import typer

# the command modules register on `root.app` when imported, in the order `mtp2draft --help` lists them (typer keeps
# the order of registration): the pipeline's stages
# isort: off
from mtp2draft.cli import conversion, train, evaluation, target, publish, pipeline, engines  # noqa: F401

# isort: on
from mtp2draft.cli.root import app
from mtp2draft.errors import Mtp2DraftError


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(ClickException, Exit, Abort) classes of the click that typer runs on: recent typer bundles its own copy
    (`typer._click`, with Exit/Abort in `typer.exceptions`), whose exceptions are not click's. Both are caught, so a
    usage error is always the short usage message."""
    import click

    errors, exits, aborts = [click.ClickException], [click.exceptions.Exit], [click.exceptions.Abort]
    bundled = getattr(getattr(typer, "_click", None), "exceptions", None)
    if bundled is not None:
        errors.append(bundled.ClickException)
    for name, bucket in (("Exit", exits), ("Abort", aborts)):
        for module in (getattr(typer, "exceptions", None), bundled):
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                bucket.append(cls)
    return tuple(errors), tuple(exits), tuple(aborts)


def _register_secrets(argv: list[str]) -> None:
    """Remember `--token` values before anything runs, so no file written later can contain them."""
    from mtp2draft.redact import SECRET_OPTIONS, register_secret

    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in SECRET_OPTIONS:
            register_secret(value if eq else (argv[i + 1] if i + 1 < len(argv) else None))


def _os_error_line(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}" if exc.strerror else str(exc)


def _one_line(text: str) -> str:
    """An error message as the one line it must be: a newline inside it (a path or repo id the user typed) is
    shown escaped, never as a second line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: one formatter for known errors, tracebacks only under MTP2DRAFT_DEBUG=1."""
    from mtp2draft.redact import redacted_output, set_command

    args = list(sys.argv[1:] if argv is None else argv)
    _register_secrets(args)
    set_command(["mtp2draft", *args])
    try:
        with redacted_output():  # every line printed passes the one redactor, as every file written does
            return _main(args)
    except KeyboardInterrupt:  # Ctrl-C before a command ran (while the CLI was being set up) or after its line
        print(INTERRUPTED, file=sys.stderr)
        return 130


# Ctrl-C, as the one line every stop gets (typer turns it into Exit(130), which would otherwise exit silently).
INTERRUPTED = "error: interrupted (Ctrl-C); an output not finished was not put in place"


def _main(args: list[str]) -> int:
    from mtp2draft.redact import redact

    debug = os.environ.get("MTP2DRAFT_DEBUG") == "1"
    click_error, click_exit, click_abort = _click_exceptions()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="mtp2draft", standalone_mode=False)
    except click_exit as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            print(INTERRUPTED, file=sys.stderr)
        return exc.exit_code
    except click_error as exc:
        exc.show()
        return exc.exit_code
    except click_abort:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    except Mtp2DraftError as exc:
        if debug:
            raise
        print(f"error: {_one_line(redact(str(exc)))}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # the environment: disk full, read-only or missing paths, permissions
        if debug:
            raise
        print(f"error: {_one_line(redact(_os_error_line(exc)))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    if code == 130:  # typer's answer to Ctrl-C inside a command (`Exit(130)`, returned here): no command returns it
        print(INTERRUPTED, file=sys.stderr)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
