"""The two kinds of pydantic model servelab's result files are described by (see docs/schemas/).

Imports nothing from servelab, so every layer's file models derive from these.
An open model allows keys it does not name: files with open-ended parts
(a summary's percentile columns, a timeline's metric names, the flags of
run.json) and files other layers add to stay valid as they grow; the named
keys are still required and typed. A closed model is exactly its fields.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)

Number = Annotated[int | float, WithJsonSchema({"type": "number"})]
"""A number written as its producer gave it: a whole count stays an integer (`1`, not `1.0`), as files always had it."""


class OpenModel(BaseModel):
    """A file part whose named keys are checked; other keys are allowed and kept."""

    model_config = ConfigDict(extra="allow")


class ClosedModel(BaseModel):
    """A file part that is exactly its fields: an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")


class InGivenOrder(OpenModel):
    """An open file part written with its keys in the order its producer gave them, not the order the model declares.

    Parts that several producers build key by key (run.json: each verb sets its own keys, the run adds its end) had
    that order in every file written before they were typed; keys added later (`model_copy`) follow, in the model's
    order.
    """

    _given_order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _note_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._given_order = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        given = {key: data.pop(key) for key in self._given_order if key in data}
        return {**given, **data}


class AsGiven(OpenModel):
    """A description another layer wrote (Deployment.describe(), a load plan's description): typed for reading,
    written back exactly as given, in the order given. The shared DeploymentInfo types some integers as floats
    (`api_server_count`), so a dump of the parsed model would turn the file's `1` into `1.0`."""

    _given: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._given = data
        return model

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return dict(self._given) if self._given is not None else handler(self)
