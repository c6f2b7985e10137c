"""The exceptions servelab raises on purpose, under one base, each with the exit code the CLI ends with.

This module imports nothing from servelab, so every layer (workload, perf and
sim at the bottom, the CLI at the top) may raise these. The CLI turns any of
them into one printed line and `exit_code` in one place (`servelab.cli`);
anything else that escapes a command is a bug in servelab, reported with its
traceback, never as bad input.

    ServelabError                 base; not raised itself
      InputError (ValueError)     2    input or configuration the user must fix; raised before any load
      ServerFault                 2    the server cannot be used or broke down: unreachable, not serving
                                       the model, would not start, answered outside HTTP/SSE
      RunDisturbed                3    the run ended, but a process went away during it
      RunInterrupted              130  Ctrl-C or SIGTERM; what completed is kept

The layers' own classes (WorkloadError, PerfConfigError, TargetError, ...)
derive from these; their names say where they come from, the base says what
the CLI does with them.
"""

from __future__ import annotations

from typing import ClassVar

EXIT_OK = 0
EXIT_BUG = 1
EXIT_BAD_INPUT = 2
EXIT_DISTURBED = 3
EXIT_INTERRUPTED = 130


class ServelabError(Exception):
    """Base of every exception servelab raises on purpose; the message is meant to be printed as-is."""

    exit_code: ClassVar[int] = EXIT_BUG
    label: ClassVar[str] = "error"
    """The word the CLI prints before the message."""


class InputError(ServelabError, ValueError):
    """A flag, file or setting that cannot be used as given; the message names it and what to change.

    Also a ValueError, as every input error in servelab was before this base
    existed, so callers that catch ValueError still do.
    """

    exit_code = EXIT_BAD_INPUT


class ServerFault(ServelabError):
    """The server cannot be used, or stopped being usable: not reachable, not serving the model, not starting,
    or answering with bytes that are not HTTP/SSE. Inside a run these become failed records; escaping a command
    they mean nothing (more) was measured."""

    exit_code = EXIT_BAD_INPUT


class RunDisturbed(ServelabError):
    """The run ended and wrote every file, but requests failed because a process went away (server killed,
    connections refused or dropped, a client worker died): its numbers do not describe the server."""

    exit_code = EXIT_DISTURBED
    label = "disturbed"


class RunInterrupted(ServelabError):
    """Ctrl-C or SIGTERM stopped the command; what completed is written, and the message says where."""

    exit_code = EXIT_INTERRUPTED
    label = "interrupted"
