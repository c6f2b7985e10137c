"""Probes: small fixed workloads run on a live server into results directories, and whether the client saw them.

Shared by `calibrate` (its probe plan), `validate` (its held-out points) and
the reference step time (`reference`): how a probe's requests are made,
how one run is kept, and the test that tells a run whose client stalled
(it read tokens in bunches and so did not observe the server's timing).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from servelab.errors import RunInterrupted
from servelab.experiment.runner import run_point
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.results import TIMELINE
from servelab.metrics.timeline import TimelineSample, read_timeline
from servelab.perf.errors import PerfConfigError
from servelab.schemas.results import RunInfo, Summary
from servelab.targets.base import Target
from servelab.workload.spec import LoadPlan, RequestSpec

PREFILL, DECODE, IDLE, MIXED = "prefill", "decode", "idle", "mixed"
PROBE_EXTRA_BODY = {"return_token_ids": True}
"""vLLM sends the token ids of every chunk, so a chunk whose text is empty (half a UTF-8 character) still counts."""
BUNCHED_GAP_S = 50e-6
MAX_BUNCHED = 0.2
"""A run in which more than this share of a stream's tokens reached the client within BUNCHED_GAP_S of the previous one
did not observe token timing: the client stalled and then read many tokens at once (the vLLM server sends one token per
event, one engine step (>= 1 ms) apart; a plain threaded reader saw 0-9% such gaps where servelab's client, starved by a
server in a scheduler autogroup (session) of its own, saw 60-100%). Its TTFT is inflated and its TPOT deflated towards
0, so it is left out of the time figures."""


class CalibrationError(PerfConfigError):
    """Calibration could not produce a trustworthy profile (failed probes, too small a budget)."""


@dataclass(frozen=True)
class Probe:
    name: str
    kind: str
    prompt_len: int
    max_tokens: int
    concurrency: int
    num_requests: int
    spacing_s: float = 0.0
    """Open loop, one request every spacing_s seconds (idle probes); 0: closed loop at `concurrency`."""


def random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> list[int]:
    """Token ids clear of the low special ids; distinct per request so the prefix cache never hits."""
    return rng.integers(10, max(11, int(vocab_size * 0.9)), length, dtype=np.int32).tolist()


def probe_requests(probe: Probe, vocab_size: int, seed: int) -> list[RequestSpec]:
    rng = np.random.default_rng([seed, zlib.crc32(probe.name.encode())])
    return [
        RequestSpec(index=i, prompt_ids=random_prompt(rng, probe.prompt_len, vocab_size), max_tokens=probe.max_tokens)
        for i in range(probe.num_requests)
    ]


def probe_load(probe: Probe, vocab_size: int, seed: int) -> LoadPlan:
    specs = probe_requests(probe, vocab_size, seed)
    if probe.spacing_s:
        for spec in specs:
            spec.arrival_time = spec.index * probe.spacing_s
    return LoadPlan(
        specs,
        max_concurrency=None if probe.spacing_s else probe.concurrency,
        description={"probe": asdict(probe), "seed": seed},
    )


def run_into(
    target: Target, plan: LoadPlan, directory: Path, run_info: RunInfo
) -> tuple[list[RequestRecord], list[TimelineSample], Summary]:
    """`run_point` (bench's runner: a results directory per run), returning the records and timeline it wrote too.

    An interrupted run (Ctrl-C, SIGTERM) ends the whole experiment: RunInterrupted, which the CLI exits 130 on."""
    sink = MemorySink()
    summary = run_point(target, plan, directory, run_info, observers=[sink])
    if summary.interrupted:
        raise RunInterrupted(f"during {directory.name}; the runs so far are kept under {directory.parent}")
    return sink.records, list(read_timeline(directory / TIMELINE)), summary


def bunched_fraction(records: list[RequestRecord]) -> float:
    """Share of token gaps under BUNCHED_GAP_S over all streams with several tokens (0 when there are none)."""
    gaps = [b - a for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    return sum(g < BUNCHED_GAP_S for g in gaps) / len(gaps) if gaps else 0.0


def client_stalled(run: Mapping[str, object]) -> bool:
    """Whether a run's `bunched` share (see bunched_fraction) says the client did not see token timing."""
    bunched = run.get("bunched")
    return isinstance(bunched, (int, float)) and bunched > MAX_BUNCHED
