"""The `servelab` command line: thin wrappers that parse flags and call the layers below.

Each verb's module is imported only when that verb runs (or its help is asked for): `servelab --help`,
`servelab schema` and `servelab VERB --help` do not pay for the simulator, the HTTP client, plotting or the
optimisers of the verbs they do not run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from dataclasses import dataclass
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperCommand
from typer.models import CommandInfo

from servelab import __version__
from servelab.cli.exits import ServelabCommands, print_error
from servelab.errors import EXIT_BAD_INPUT


@dataclass(frozen=True)
class Verb:
    module: str
    """The module of servelab.cli that registers the verb on `app`."""
    summary: str
    """Its line in `servelab --help`, which lists the verbs without importing them (each verb's own help is its
    docstring)."""


VERBS: dict[str, Verb] = {
    "bench": Verb("bench", "Measure a running server: latency, throughput and goodput under the load you describe."),
    "simulate": Verb(
        "simulate",
        "Predict latency, throughput and goodput of a deployment under the load you describe, without a GPU.",
    ),
    "diagnose": Verb(
        "diagnose", "Find what limits the deployment, the ceiling it implies, and the change that lifts it."
    ),
    "tune": Verb(
        "tune", "Search the launch flags on the simulator, confirm the best on real servers, print the line to run."
    ),
    "compare": Verb(
        "compare", "Would another engine serve this workload better? The same load simulated on each engine."
    ),
    "calibrate": Verb("calibrate", "Probe a live server, fit the cost model to it, check the fit, write a profile."),
    "validate": Verb(
        "calibrate", "Run held-out workloads on the server and in the simulator; print % error per metric."
    ),
    "report": Verb("report", "Write an HTML report (plots, works offline) of runs, sweeps, studies and comparisons."),
    "schema": Verb("schema", "Print the JSON Schema of a file servelab writes."),
}
"""Every verb, in the order `servelab --help` lists them."""


class LazyVerbs(ServelabCommands):
    """The `servelab` group, whose verbs are built from their module on first use instead of at start-up."""

    listing = False
    """True while `servelab --help` lists the verbs: their summaries are enough, their modules stay unimported."""

    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]  # typer's vendored click Context
        return list(VERBS)

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:  # type: ignore[override]
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer's vendored click Context
        """A verb's flag that does not parse (`--tp abc`, a missing required flag, an unknown verb) is one line
        naming the flag, like every other bad input, instead of click's boxed usage block."""
        try:
            return super().invoke(ctx)
        except typer.TyperException as exc:
            if getattr(exc, "exit_code", None) != EXIT_BAD_INPUT:
                raise
            failed = getattr(exc, "ctx", None) or ctx  # the verb's context when its own flags failed
            print_error("error", f"{exc.format_message()} (see {failed.command_path} --help)")  # type: ignore[attr-defined]
            raise typer.Exit(EXIT_BAD_INPUT) from None

    def get_command(self, ctx: typer.Context | None, cmd_name: str) -> Any:  # type: ignore[override]
        verb = VERBS.get(cmd_name)
        if cmd_name in self.commands or verb is None:
            return self.commands.get(cmd_name)
        if self.listing:
            return TyperCommand(cmd_name, short_help=verb.summary)
        importlib.import_module(f"servelab.cli.{verb.module}")
        info = next(c for c in app.registered_commands if _name(c) == cmd_name)
        self.add_command(
            typer.main.get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode
            ),
            cmd_name,
        )
        return self.commands[cmd_name]


def _name(command: CommandInfo) -> str:
    """A registered command's name as typer gives it: its own, or its function's with dashes."""
    return command.name or typer.main.get_command_name(command.callback.__name__)  # type: ignore[union-attr]


app = typer.Typer(
    name="servelab",
    help="Why is my LLM deployment slow, and which configuration should I run?",
    cls=LazyVerbs,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"servelab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print servelab's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Measure, explain, predict and choose LLM serving configurations."""


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--goodput" in args:  # only the verbs that take it pay for importing the load flags
        from servelab.flags.options import spread_goodput_values

        args = spread_goodput_values(args)
    app(args=args)
