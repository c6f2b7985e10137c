"""`servelab schema NAME`: the JSON Schema of a file servelab writes, generated from the model that describes it.

docs/schemas/NAME.json is the published copy (`servelab schema --write docs/schemas` regenerates every one; a test
fails when they differ from the models). Files other than a results directory's are named as their writer names them.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from servelab.cli import app
from servelab.errors import InputError

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.json_schema import JsonSchemaValue

SCHEMAS: dict[str, tuple[str, str]] = {
    "run": ("servelab.schemas.results:RunInfo", "run.json of a results directory"),
    "record": ("servelab.schemas.records:RequestRecord", "one line of records.jsonl"),
    "summary": ("servelab.schemas.results:Summary", "summary.json of a results directory"),
    "timeline": ("servelab.schemas.results:TimelineRow", "one line of timeline.jsonl"),
    "sweep": ("servelab.schemas.results:SweepIndex", "sweep.json of a --sweep"),
    "diagnosis": ("servelab.schemas.diagnosis:Diagnosis", "diagnosis.json, and diagnose --json"),
    "tune": ("servelab.schemas.tune:TuneDocument", "tune.json of a tune study, and tune --json"),
    "trial": ("servelab.schemas.tune:Trial", "stage1/trial-NNNN/trial.json of a tune study"),
    "stage2": (
        "servelab.schemas.tune:Stage2File",
        "stage2/<label>/stage2.json of a tune study (one configuration measured on a real server)",
    ),
    "validation": ("servelab.schemas.validation:ValidationReport", "the report `servelab validate` writes (--out)"),
    "profile": (
        "servelab.schemas.profile:CalibrationProfile",
        "the calibration profile `servelab calibrate` writes (--out)",
    ),
    "compare": (
        "servelab.schemas.compare:EngineComparison",
        "the comparison `servelab compare` writes (--out, --json)",
    ),
}
"""Each file: the model that describes it (module:class, imported only when its schema is asked for, so `schema
NAME` pays for one model and `schema --help` for none) and what the file is."""


PUBLISHED_AS = {"RunDeployment": "DeploymentInfo"}
"""Models whose schema is another model's, published under that model's name: run.json's deployment is a
DeploymentInfo written back key for key as given (servelab.schemas.results.RunDeployment)."""


def schema_model(name: str) -> type[BaseModel] | type:
    """The model of file NAME: a pydantic model, or a dataclass pydantic reads (records.jsonl's `RequestRecord`)."""
    module, _, model = SCHEMAS[name][0].partition(":")
    found: type[BaseModel] | type = getattr(importlib.import_module(module), model)
    return found


def json_schema(name: str) -> JsonSchemaValue:
    """The JSON Schema (draft 2020-12) of the file NAME, saying which file it describes and which model it comes
    from."""
    model, what = schema_model(name), SCHEMAS[name][1]
    from pydantic import TypeAdapter  # not for --help
    from pydantic.json_schema import GenerateJsonSchema

    class PublishedNames(GenerateJsonSchema):
        def normalize_name(self, name: str) -> str:
            return PUBLISHED_AS.get(name, super().normalize_name(name))

    schema = TypeAdapter(model).json_schema(schema_generator=PublishedNames)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"{what}; generated from {model.__module__}.{model.__qualname__}",
        **schema,
    }


def schema_text(name: str) -> str:
    return json.dumps(json_schema(name), indent=2, sort_keys=False) + "\n"


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMAS:
        path = directory / f"{name}.json"
        path.write_text(schema_text(name), encoding="utf-8")
        written.append(path)
    return written


@app.command()
def schema(
    name: Annotated[Optional[str], typer.Argument(help=f"One of {', '.join(SCHEMAS)}.")] = None,
    write: Annotated[
        Optional[Path], typer.Option(help="Write every schema as NAME.json into this directory (docs/schemas).")
    ] = None,
) -> None:
    """Print the JSON Schema of a file servelab writes (run, record, summary, timeline, sweep, diagnosis, tune, trial,
    stage2, validation, profile, compare), to validate results in your own scripts."""
    if write is not None:
        if name is not None:
            raise InputError("give NAME (print one schema) or --write DIR (write all), not both")
        for path in write_schemas(write):
            typer.echo(str(path))
        return
    if name is None:
        raise InputError(f"give NAME, one of {', '.join(SCHEMAS)} (or --write DIR for all)")
    if name not in SCHEMAS:
        raise InputError(f"schema {name!r}: choose one of {', '.join(SCHEMAS)}")
    typer.echo(schema_text(name), nl=False)
