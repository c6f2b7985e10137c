"""Check files servelab wrote against the JSON Schemas published in docs/schemas (with a JSON Schema validator,
not the models they come from: what a user's script would do)."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import jsonschema

from servelab import SCHEMA_VERSION
from servelab.schemas.profile import PROFILE_SCHEMA_VERSION
from servelab.renames import upgraded

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"
BY_FILE_NAME = {
    "run.json": "run",
    "summary.json": "summary",
    "sweep.json": "sweep",
    "diagnosis.json": "diagnosis",
    "tune.json": "tune",
    "trial.json": "trial",
    "stage2.json": "stage2",
    "records.jsonl": "record",
    "timeline.jsonl": "timeline",
}
"""Files whose name says what they are; a validate report and a profile are named by the user and given explicitly."""


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def assert_matches(path: Path, name: str) -> int:
    """Every document in `path` (one JSON file, or each line of a JSONL file) is valid; returns how many. A file of
    the previous schema version is checked as servelab reads it (its statistics renamed, servelab.renames)."""
    text = path.read_text(encoding="utf-8")
    documents = (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else [json.loads(text)]
    )
    current = PROFILE_SCHEMA_VERSION if name == "profile" else SCHEMA_VERSION
    for document in map(lambda d: upgraded(d, current), documents):
        errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.path))
        assert not errors, f"{path} against docs/schemas/{name}.json: " + "; ".join(
            f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message[:200]}" for e in errors[:5]
        )
    return len(documents)


def assert_files_match_schemas(root: Path, extra: dict[Path, str] | None = None) -> Counter[str]:
    """Every file under `root` that servelab names (run.json, records.jsonl, ...) and every `extra` file, checked
    against its schema; returns the count of files checked per schema, so a test can say what it expects to have
    seen."""
    seen: Counter[str] = Counter()
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        name = BY_FILE_NAME.get(path.name)
        if name and path.is_file():
            assert_matches(path, name)
            seen[name] += 1
    for path, name in (extra or {}).items():
        assert_matches(path, name)
        seen[name] += 1
    return seen
