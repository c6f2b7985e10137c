"""The `servelab validate` report (validation.json) as a typed model; its JSON Schema is
docs/schemas/validation.json."""

from __future__ import annotations


from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from servelab import SCHEMA_VERSION
from servelab.schemas.results import Json
from servelab.schemas.base import OpenModel


class PointResult(OpenModel):
    """One held-out point: each metric's best repeat, measured and simulated, and the error between them."""

    point: str
    shape: Json
    measured: dict[str, float | None]
    simulated: dict[str, float | None]
    error_pct: dict[str, float | None]
    stalled_repeats: int = Field(0, description="Absent in reports of before validate set stalled repeats aside.")
    disturbed_repeats: int = Field(0, description="Absent in reports of before validate checked the server's speed.")
    repeats: list[Json]


class ServerRef(OpenModel):
    """The live server validated against (calibrate and validate record more of it as they found it)."""

    model: str | None = None
    base_url: str | None = None

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """As validate writes it: the URL first, then the model, then anything else; what is unknown left out."""
        data: dict[str, object] = handler(self)
        return {k: data[k] for k in dict.fromkeys(("base_url", "model", *data)) if data[k] is not None}


class ProfileRef(OpenModel):
    """Which calibration profile was validated."""

    created_at: float | None = None
    engine_args: str | None = None
    gpu: str | None = None


class ValidationReport(OpenModel):
    """validation.json: the simulator with a calibration profile against the live server on unseen points."""

    schema_version: int = SCHEMA_VERSION
    kind: str = Field(description="Always 'servelab.validation'.")
    created_at: float
    server: ServerRef
    profile: ProfileRef = Field(description="Which profile: its created_at, engine_args and gpu.")
    engine_args: str
    engine_config: Json
    host: Json = Field(
        default_factory=dict, description="The host's conditions; absent in reports of before they were recorded."
    )
    reference: Json = Field(
        default_factory=dict, description="The reference step timings; absent in reports of before them."
    )
    warnings: list[str] = Field(default_factory=list)
    points: list[PointResult]
    median_abs_error_pct: dict[str, float | None]
    bounds_pct: dict[str, float]
    goals_pct: dict[str, float]
    within_bounds: bool
