"""What a report is drawn from: results directories of runs and sweeps, tune studies, validate reports and engine
comparisons, loaded once.

Every section reads the same `ReportInputs`, so adding a section never means
re-reading files, and every input carries a label that is unique across the
whole report (legends and tables must never show two identical names).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import JsonValue, ValidationError

from servelab import SCHEMA_VERSION
from servelab.schemas.diagnosis import Diagnosis
from servelab.errors import InputError
from servelab.schemas.compare import KIND as COMPARE_KIND
from servelab.schemas.compare import EngineComparison
from servelab.schemas.validation import ValidationReport
from servelab.metrics.results import RUN, SWEEP, ResultsDirError, RunResult, load_run
from servelab.schemas.results import RunInfo, Summary, SweepIndex
from servelab.metrics.summary import summarize
from servelab.renames import upgraded
from servelab.schemas.tune import TuneDocument

DIAGNOSIS = "diagnosis.json"
"""Written into a results directory by `servelab diagnose RESULTS`."""

TUNE = "tune.json"
"""Written into its --result-dir by `servelab tune` (schema in docs/tune.md)."""
TUNE_KIND = "tune"
STAGE2 = "stage2"
STAGE2_KIND = "tune-stage2"
"""tune's measured servers: bench results directories <result-dir>/stage2/<label>/, run.json kind tune-stage2."""
VALIDATION_KIND = "servelab.validation"
"""The `kind` of the JSON file `servelab validate --out FILE` writes."""
COMPARE = "compare.json"
"""The name a directory's engine comparison is looked up by (`servelab compare --out DIR/compare.json`)."""

SOURCE_NAMES = {"http": "measured", "sim": "simulated"}
"""How run.json's `source` reads in a legend."""


class ReportInputError(InputError):
    """A directory given to the report cannot be read; the message says which and why."""


@dataclass
class ReportRun:
    """One run as the report shows it: its results plus a label and its summary statistics."""

    label: str
    result: RunResult
    summary: Summary
    series: int
    """Index of the top-level input (run or sweep) it came from; runs of one sweep share it."""
    sweep_value: Any = None
    """The swept parameter's value for a sweep point; None for a standalone run."""
    diagnosis: Diagnosis | None = None
    """diagnosis.json from the run's directory, when diagnose has been run on it."""
    within: Path | None = None
    """The tune study whose stage 2 measured it, for runs loaded with their study rather than given by path."""

    @property
    def info(self) -> RunInfo:
        """run.json, typed: what the header and the tables read (the parameters table lists every key as stored)."""
        return self.result.run_info

    @property
    def source(self) -> str | None:
        """run.json's source; stage-2 runs of studies written before tune recorded it are measured too."""
        return self.info.source or ("http" if self.info.kind == STAGE2_KIND else None)

    @property
    def directory(self) -> Path:
        directory = self.result.directory
        assert directory is not None  # loaded from a results directory, never an in-memory run
        return directory


@dataclass
class ReportSweep:
    """A sweep: one parameter varied over points, each point a run."""

    label: str
    directory: Path
    parameter: str
    points: list[ReportRun]
    index: SweepIndex
    """sweep.json, typed."""
    series: int
    diagnosis: Diagnosis | None = None
    """diagnosis.json from the sweep's directory, else from its first diagnosed point."""


@dataclass
class ReportFile:
    """An input read from one JSON file of a verb that writes no request records (tune, validate, compare)."""

    label: str
    path: Path
    """What was given: the JSON file itself, or the directory holding it."""
    series: int

    @property
    def directory(self) -> Path:
        """The path, under the name runs and sweeps use for theirs (labels and the page header read it)."""
        return self.path


@dataclass
class ReportDocument(ReportFile):
    """tune.json: a study's own JSON, typed (validate's report is a ReportValidation)."""

    tune: TuneDocument


@dataclass
class ReportValidation(ReportFile):
    """A `servelab validate` report, typed (servelab.schemas.validation)."""

    report: ValidationReport


@dataclass
class ReportComparison(ReportFile):
    """A `servelab compare` result, typed (servelab.compare.compare): the same load on each engine."""

    comparison: EngineComparison


Document = ReportDocument | ReportValidation | ReportComparison
"""Every kind of ReportFile, one per verb, so a branch on the kind is checked to cover them all."""


@dataclass
class ReportInputs:
    runs: list[ReportRun] = field(default_factory=list)
    """Standalone runs (not sweep points), in the order given."""
    sweeps: list[ReportSweep] = field(default_factory=list)
    tunes: list[ReportDocument] = field(default_factory=list)
    validations: list[ReportValidation] = field(default_factory=list)
    comparisons: list[ReportComparison] = field(default_factory=list)

    @property
    def tops(self) -> list[ReportRun | ReportSweep]:
        """The results directories as given (runs and sweeps), in command-line order."""
        return sorted([*self.runs, *self.sweeps], key=lambda item: item.series)

    @property
    def given(self) -> list[ReportRun | ReportSweep | Document]:
        """Everything as given: one entry per path on the command line."""
        return sorted(
            [*self.runs, *self.sweeps, *self.tunes, *self.validations, *self.comparisons], key=lambda item: item.series
        )

    @property
    def all_runs(self) -> list[ReportRun]:
        """Standalone runs and every sweep point, in input order."""
        by_series = [(r.series, [r]) for r in self.runs] + [(s.series, s.points) for s in self.sweeps]
        return [run for _, runs in sorted(by_series, key=lambda item: item[0]) for run in runs]


def planned_warmup(info: RunInfo) -> float:
    """The seconds at the start the run's statistics leave out (--warmup), as run.json's plan recorded them."""
    amount = info.workload.amount if info.workload else None
    return (amount.warmup if amount else None) or 0.0


def _summary_of(result: RunResult, given: JsonValue = None) -> Summary:
    """The stored summary when there is one; otherwise derived from the records, as summary.json would be
    (a partial run: its label says so), warm-up left out as the run would have. ReportInputError naming the run
    when the stored one is not a summary."""
    warmup = planned_warmup(result.run_info)
    try:
        return Summary.model_validate(given or result.summary or summarize(result.records, warmup=warmup))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ReportInputError(
            f"the summary of {result.directory} is not one this servelab reads: {first['loc']}: {first['msg']}"
        ) from exc


PARTIAL = " (partial)"
"""Appended to the label of a run that never wrote its summary: every legend and table says so."""


def _source_suffix(source: str | None) -> str:
    return f" ({SOURCE_NAMES.get(source, source)})" if source else ""


def _read_json(path: Path) -> Any:
    try:
        return upgraded(json.loads(path.read_text(encoding="utf-8")), SCHEMA_VERSION)
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"cannot read {path}: {exc}") from exc


def read_diagnosis(directory: Path) -> Diagnosis | None:
    path = directory / DIAGNOSIS
    if not path.is_file():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise ReportInputError(f"{path} is not a servelab diagnosis (no findings list)")
    try:
        return Diagnosis.model_validate(data)
    except ValidationError as exc:
        raise ReportInputError(
            f"{path} is not a diagnosis this servelab reads: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from exc


_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    TUNE_KIND: ("tune.json", ("trials", "pareto", "objective")),
    VALIDATION_KIND: ("validate report", ("points", "median_abs_error_pct")),
    COMPARE_KIND: ("compare JSON", ("engines",)),
}
"""Each document kind: what its errors call it, and the parts its section cannot be drawn without."""


def _document(file: Path, path: Path, series: int, label: str) -> Document:
    """A tune.json, a validate report or a compare JSON (`file`, given as `path`), checked for the parts its section
    draws and read typed; ReportInputError naming the file when it is none of these or not one this servelab reads."""
    data = _read_json(file)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _NEEDS:
        raise ReportInputError(
            f"{file} is neither a tune.json nor a `servelab validate` report nor a `servelab compare` "
            f"JSON (kind {kind!r})"
        )
    what, needs = _NEEDS[kind]
    missing = [key for key in needs if not data.get(key)]
    if missing:
        raise ReportInputError(f"{file} has no {', '.join(missing)}")
    try:
        if kind == TUNE_KIND:
            return ReportDocument(label=label, path=path, tune=TuneDocument.model_validate(data), series=series)
        if kind == VALIDATION_KIND:
            return ReportValidation(label=label, path=path, report=ValidationReport.model_validate(data), series=series)
        return ReportComparison(label=label, path=path, comparison=EngineComparison.model_validate(data), series=series)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ReportInputError(f"{file} is not a {what} this servelab reads: {first['loc']}: {first['msg']}") from exc


def _load_run_dir(directory: Path) -> RunResult:
    try:
        return load_run(directory)
    except ResultsDirError as exc:
        raise ReportInputError(str(exc)) from exc


def _load_sweep(directory: Path, series: int) -> ReportSweep:
    """Reads sweep.json as servelab.experiment.sweep writes it.

    {"sweep": {"key": "max-concurrency", "values": [...]}, "points": [{"max-concurrency": 4,
    "directory": "max-concurrency=4", "summary": {...}, ...}], "interrupted": false}
    """
    index = directory / SWEEP
    info = _read_json(index)
    parameter = (info.get("sweep") or {}).get("key")
    points = info.get("points")
    if not isinstance(parameter, str) or not parameter:
        raise ReportInputError(f"{index} names no swept parameter (sweep.key)")
    if not isinstance(points, list) or not points:
        raise ReportInputError(f"{index} lists no points")
    runs = []
    for position, point in enumerate(points):
        name = point.get("directory") if isinstance(point, dict) else None
        if not isinstance(name, str) or not name:
            raise ReportInputError(f"{index}: point {position} names no results directory ('directory')")
        result = _load_run_dir(directory / name)
        runs.append(
            ReportRun(
                label="",
                result=result,
                summary=_summary_of(result, point.get("summary")),
                series=series,
                sweep_value=point.get(parameter, name),
                diagnosis=read_diagnosis(directory / name),
            )
        )
    diagnosed = [p.diagnosis for p in runs if p.diagnosis is not None]
    try:
        typed = SweepIndex.model_validate(info)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ReportInputError(
            f"{index} is not a sweep.json this servelab reads: {first['loc']}: {first['msg']}"
        ) from exc
    return ReportSweep(
        label=str(info.get("label") or directory.resolve().name),
        directory=directory,
        parameter=parameter,
        points=runs,
        index=typed,
        series=series,
        diagnosis=read_diagnosis(directory) or (diagnosed[0] if diagnosed else None),
    )


def _disambiguate(labels: list[str], directories: list[Path]) -> list[str]:
    """Prefix repeated names with their parent directory's name, then with a number if still equal."""
    counts = Counter(labels)
    labels = [
        f"{d.resolve().parent.name}/{label}" if counts[label] > 1 else label for label, d in zip(labels, directories)
    ]
    counts = Counter(labels)
    seen: Counter[str] = Counter()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(f"{label} #{seen[label]}" if counts[label] > 1 else label)
    return out


def _load_run(directory: Path, series: int, label: str | None = None) -> ReportRun:
    result = _load_run_dir(directory)
    return ReportRun(
        label=label or result.run_info.label or directory.resolve().name,
        result=result,
        summary=_summary_of(result),
        series=series,
        diagnosis=read_diagnosis(directory),
    )


def _stage2_runs(study: ReportDocument, first_series: int) -> list[ReportRun]:
    """The bench runs of tune's stage 2 (<result-dir>/stage2/<label>/), so a study's report shows how the
    confirmed configurations measured, request by request, and not only their summary numbers."""
    results = study.tune.stage2.results if study.tune.stage2 else []
    root = (study.path if study.path.is_dir() else study.path.parent) / STAGE2
    found = [r.label for r in results if (root / r.label / RUN).is_file()]
    runs = [
        _load_run(root / label, first_series + i, f"{study.label} · stage 2 {label}") for i, label in enumerate(found)
    ]
    for run in runs:
        run.within = study.path
    return runs


def load_inputs(paths: list[Path]) -> ReportInputs:
    """Loads each path as a sweep (sweep.json), a run (run.json), a tune study (tune.json, with its stage-2
    runs), an engine comparison (compare.json), or a JSON file (tune.json, the report `servelab validate --out`
    writes, or the comparison `servelab compare --out` writes).

    Raises ReportInputError naming the first path that is none of these, before anything is drawn.
    """
    if not paths:
        raise ReportInputError("no results directories given")
    inputs = ReportInputs()
    series = 0
    for path in paths:
        document: Document | None = None
        if path.is_file():
            name = path.resolve().parent.name if path.name == TUNE else path.stem
            document = _document(path, path, series, name)
        elif not path.is_dir():
            raise ReportInputError(f"{path} is not a directory")
        elif (path / SWEEP).is_file():
            inputs.sweeps.append(_load_sweep(path, series))
        elif (path / RUN).is_file():
            inputs.runs.append(_load_run(path, series))
        elif (path / TUNE).is_file():
            document = _document(path / TUNE, path, series, path.resolve().name)
        elif (path / COMPARE).is_file():
            document = _document(path / COMPARE, path, series, path.resolve().name)
        else:
            raise ReportInputError(
                f"{path} is not a servelab results directory (no {RUN}, {SWEEP}, {TUNE} or {COMPARE})"
            )
        if isinstance(document, ReportValidation):
            inputs.validations.append(document)
        elif isinstance(document, ReportComparison):
            inputs.comparisons.append(document)
        elif document is not None:
            inputs.tunes.append(document)
        series += 1
        if isinstance(document, ReportDocument):
            stage2 = _stage2_runs(document, series)
            inputs.runs += stage2
            series += len(stage2)

    given = inputs.given
    names = _disambiguate([item.label for item in given], [item.directory for item in given])
    for item, name in zip(given, names):
        if isinstance(item, ReportRun):
            item.label = name + _source_suffix(item.source) + (PARTIAL if item.result.partial else "")
        elif isinstance(item, ReportSweep):
            item.label = name + _source_suffix(item.points[0].source)
            for point in item.points:
                point.label = f"{item.label} · {item.parameter}={point.sweep_value}" + (
                    PARTIAL if point.result.partial else ""
                )
        else:
            item.label = name
    return inputs
