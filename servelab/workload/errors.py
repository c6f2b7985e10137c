"""The one exception the workload layer raises for input the user must fix."""

from __future__ import annotations

from servelab.errors import InputError


class WorkloadError(InputError):
    """A workload that cannot be built as asked: a bad length, a malformed dataset line, a flag clash.

    The message names the flag, file or line at fault and is meant to be
    printed as-is by the CLI, before any load is sent.
    """
