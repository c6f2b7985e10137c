"""The one exception the performance model raises for input the user must fix."""

from __future__ import annotations

from servelab.errors import InputError


class PerfConfigError(InputError):
    """A GPU, model, quantization or engine flag that cannot be modelled as given.

    Raised before any simulation starts; the message names the value at fault,
    the numbers behind the refusal and what to change, and is meant to be
    printed as-is by the CLI.
    """
