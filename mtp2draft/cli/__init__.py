"""The `mtp2draft` command line: the typer app and its commands (`app`), shared option types (`options`) and what
commands print (`output`). Imports typer only; torch loads when a command runs."""
