"""The `servelab` command line: thin wrappers that parse flags and call the layers below."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="servelab",
    help="Why is my LLM deployment slow, and which configuration should I run?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()
