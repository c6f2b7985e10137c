"""A results directory read back: what was run and its summary as typed models, records and timeline as tables."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.metrics.results import RunResult, load_run
from servelab.schemas.results import RunInfo, Summary, SweepIndex

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Results:
    """A results directory, read back: what was run and its summary as typed models, records and timeline as tables."""

    directory: Path
    summary: Summary | None
    """None for a partial run (the client was killed before the end)."""
    result: RunResult

    @property
    def run_info(self) -> RunInfo:
        """What was run (run.json), as the run read back holds it."""
        return self.result.run_info

    def records(self) -> pd.DataFrame:
        """One row per request, the columns of records.jsonl plus ttft_s and e2el_s (seconds; NaN without a token)."""
        import pandas as pd

        rows = [
            {**asdict(r), "ttft_s": r.ttft if r.ttft is not None else math.nan, "e2el_s": r.e2el}
            for r in self.result.records
        ]
        return pd.DataFrame(rows)

    def timeline(self) -> pd.DataFrame:
        """One row per server sample: `t` (seconds from the start) and one column per metric (vLLM's names)."""
        import pandas as pd

        return pd.DataFrame([{"t": s.t, **s.values} for s in self.result.timeline])


def load_results(directory: str | Path) -> Results:
    """Any results directory `bench` or `simulate` wrote (a sweep's points are directories of their own)."""
    result = load_run(Path(directory))
    summary = Summary.model_validate(result.summary) if result.summary is not None else None
    return Results(Path(directory), summary, result)


@dataclass(frozen=True)
class SweepResults:
    """A `--sweep`'s directory and its sweep.json; each point is a results directory of its own (`point`)."""

    directory: Path
    index: SweepIndex

    def point(self, directory: str) -> Results:
        return load_results(self.directory / directory)
