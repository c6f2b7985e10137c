"""The two kinds of pydantic model servelab's result files are described by (see docs/schemas/).

Imports nothing from servelab, so every layer's file models derive from these.
An open model allows keys it does not name: files with open-ended parts
(a summary's percentile columns, a timeline's metric names, the flags of
run.json) and files other layers add to stay valid as they grow; the named
keys are still required and typed. A closed model is exactly its fields.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OpenModel(BaseModel):
    """A file part whose named keys are checked; other keys are allowed and kept."""

    model_config = ConfigDict(extra="allow")


class ClosedModel(BaseModel):
    """A file part that is exactly its fields: an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")
