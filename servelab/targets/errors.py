"""The one exception a target raises for a problem the user must fix before any load is sent."""

from __future__ import annotations


class TargetError(Exception):
    """A target that cannot be used as configured: unreachable URL, missing endpoint, unknown model.

    The message names the URL, endpoint or model at fault and is meant to be
    printed as-is by the CLI.
    """
