"""What `servelab calibrate` is asked: a live server to probe or benchmark results already made, and where the
profile goes.

One request for both ways, checked once on construction (before any probe is sent or any file read), so the command
line and the Python API refuse the same input with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.errors import InputError
from servelab.metrics.imports import WorkloadFlags

MIN_BUDGET_S = 20.0
"""Below this not even one pass of the probe plan fits."""


@dataclass(frozen=True)
class CalibrateRequest:
    """`base_url`: probe that live server for `budget_s` seconds. `sources`: fit to these results (servelab results
    directories, `vllm bench serve --save-result` JSONs, GuideLLM or AIPerf exports); `workload` describes a result
    that holds only aggregates, `vllm_version` the release that served them. Exactly one of the two.

    `gpu`, `model` and `engine_args` are the deployment (for a live server, the flags it runs with); the profile goes
    to `out` (a live calibration's raw probe runs beside it, in `<out>.probes/`), replacing a file there only with
    `overwrite`.
    """

    gpu: str
    model: str
    out: Path = Path("profile.json")
    base_url: str | None = None
    sources: tuple[Path, ...] = ()
    engine_args: str = ""
    vllm_version: str | None = None
    budget_s: float = 300.0
    served_model: str | None = None
    api_key: str | None = None
    workload: WorkloadFlags = WorkloadFlags()
    overwrite: bool = False
    max_evaluations: int = 40
    """`sources` only: least-squares iterations, each simulating every run."""

    def __post_init__(self) -> None:
        if (self.base_url is None) == (not self.sources):
            raise InputError(
                "give --base-url (probe a live server) or --from RESULT (benchmarks you already ran), one of them"
            )
        if self.out.exists() and not self.overwrite:
            raise InputError(f"{self.out} exists: give --overwrite to replace it, or another --out")
        if self.live and self.vllm_version is not None:
            raise InputError("--vllm-version describes the runs of calibrate --from; a live server is probed as it is")
        if self.live and self.budget_s < MIN_BUDGET_S:
            raise InputError(
                f"--budget {self.budget_s:g} s is too small: one pass of probes needs about {MIN_BUDGET_S:g} s"
            )

    @property
    def live(self) -> bool:
        return self.base_url is not None

    @property
    def probe_dir(self) -> Path:
        """Where a live calibration's raw probe runs live: `profile.json` -> `profile.probes/`."""
        return self.out.with_name(self.out.stem + ".probes")
