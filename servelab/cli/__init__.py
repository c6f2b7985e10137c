"""The `servelab` command line: thin wrappers that parse flags and call the layers below."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from servelab.cli.exits import ServelabCommands

app = typer.Typer(
    name="servelab",
    help="Why is my LLM deployment slow, and which configuration should I run?",
    cls=ServelabCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Measure, explain, predict and choose LLM serving configurations."""


def main(argv: Sequence[str] | None = None) -> None:
    from servelab.cli.options import spread_goodput_values

    app(args=spread_goodput_values(sys.argv[1:] if argv is None else argv))


from servelab.cli import diagnose  # noqa: E402,F401  (registers the command)
from servelab.cli import tune  # noqa: E402,F401  (registers the command)
from servelab.cli import bench  # noqa: E402,F401  (registers the command)
from servelab.cli import calibrate  # noqa: E402,F401  (registers calibrate and validate)
from servelab.cli import report  # noqa: E402,F401  (registers the command)
from servelab.cli import simulate  # noqa: E402,F401  (registers the command)
from servelab.cli import schema  # noqa: E402,F401  (registers the command)
from servelab.cli import compare  # noqa: E402,F401  (registers the command)
