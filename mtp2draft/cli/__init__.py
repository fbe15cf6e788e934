"""The `mtp2draft` command line: the entry point and its one error formatter (`app`), the root command group (`root`),
one thin module per command group, shared option types (`options`), progress (`progress`) and what commands print
(`output`). Imports typer only; torch loads when a command runs."""
