"""The exception `tune` raises for input the user must fix, before any trial runs."""

from __future__ import annotations

from servelab.errors import InputError


class TuneError(InputError):
    """A search space, objective, workload or server command that cannot be used as given.

    The message names the value at fault and what to change; the CLI prints it as-is.
    """
