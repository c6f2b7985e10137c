"""The one place a command's failure becomes a printed message and an exit code.

Every command runs inside `ServelabCommands.invoke`, so the layers and the
commands only raise (`servelab.errors`); none of them prints an error or
picks an exit code. The codes (also in the README):

    0    done
    1    a bug in servelab: an exception nobody raised on purpose; the traceback is printed with a hint to report it
    2    bad input or configuration, or a server that cannot be used (failed pre-flight, would not start); nothing run;
         also a file servelab cannot read or write (an OSError naming it: missing directory, permissions, disk full),
         and a flag typer refuses (wrong type, out of its declared range): one line
         `error: Invalid value for '--x': ...`; and a run in which every request failed without a process going away
         (the server refused them all): its records are written and the server's first error message is printed (see
         run_and_show)
    3    disturbed: the run ended and wrote everything, but a process went away during it (see run_and_show)
    130  interrupted (Ctrl-C, SIGTERM); what completed is written
"""

from __future__ import annotations

import traceback
from typing import Any, NoReturn

import typer
from rich.markup import escape
from typer.core import TyperGroup
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer vendors click and exports neither

from servelab.errors import EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED, ServelabError
from servelab.report.console import make_console

BUG_HINT = (
    "servelab failed unexpectedly, not because of your input: please report it with the traceback above "
    "and the command line you ran"
)


def print_error(label: str, message: str) -> None:
    """One line on stderr: `label: message`, never wrapped or highlighted (scripts and tests read it); a message
    that quotes a multi-line one (a YAML parser's, with its caret) is joined onto that line."""
    line = " ".join(message.split())
    make_console(stderr=True).print(f"[bold red]{label}[/]: {escape(line)}", highlight=False, soft_wrap=True)


class ServelabCommands(TyperGroup):
    """The `servelab` group: runs the chosen command and turns whatever it raises into a message and exit code."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer's vendored click Context
        try:
            return super().invoke(ctx)
        except UsageError as exc:  # a flag typer or its callback refused: one line naming it, like every other error
            if isinstance(exc, NoArgsIsHelpError):
                raise
            command = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            print_error("error", exc.format_message() + command)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # typer's own: --help, an explicit exit
        except ServelabError as exc:
            print_error(exc.label, str(exc))
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:
            if exc.filename is None:  # not about a file the user named: treat as the bug it most likely is
                raise_bug()
            print_error("error", f"{exc.filename}: {exc.strerror or exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            print_error("interrupted", "stopped by Ctrl-C")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception:
            raise_bug()


def raise_bug() -> NoReturn:
    """The exception being handled is a bug in servelab: its traceback, the request to report it, exit 1."""
    make_console(stderr=True).print(traceback.format_exc(), highlight=False, soft_wrap=True, markup=False)
    print_error("bug", BUG_HINT)
    raise typer.Exit(EXIT_BUG) from None
