"""The reference step time: one small fixed decode workload, timed a few times, as the server's speed gauge.

Calibration's figures hold for the host as it was. To tell whether a later
run is comparable, `calibrate` times this workload before and after its
probes and `validate` times it again around its rounds: a change beyond the
run-to-run spread seen at both times means the server now runs at another
speed (other jobs on the host, throttled clocks), and what was measured
under it is reported as disturbed instead of being folded into an error
figure. The workload is a closed loop of a few requests with short prompts
and fixed long outputs, so its time per output token is a pure decode step
at a fixed batch, the steadiest figure a server gives.
"""

from __future__ import annotations

from pathlib import Path

from servelab.calibrate.probes import DECODE, MAX_BUNCHED, Probe, bunched_fraction, probe_load, run_into
from servelab.schemas.profile import ReferenceTiming
from servelab.schemas.results import RunInfo
from servelab.targets.base import Target

REFERENCE_BATCH, REFERENCE_PROMPT, REFERENCE_OUTPUT = 4, 16, 64
REFERENCE_RUNS = 3
"""Runs per timing: enough for a spread, short enough to repeat between validate's rounds (~1 s on the CPU server)."""


def reference_probe(max_num_seqs: int | None) -> Probe:
    batch = min(REFERENCE_BATCH, max_num_seqs or REFERENCE_BATCH)
    return Probe(
        f"reference-b{batch}-p{REFERENCE_PROMPT}-o{REFERENCE_OUTPUT}",
        DECODE,
        REFERENCE_PROMPT,
        REFERENCE_OUTPUT,
        batch,
        batch,
    )


def time_reference(
    target: Target,
    max_num_seqs: int | None,
    vocab_size: int,
    directory: Path,
    run_info: RunInfo,
    runs: int = REFERENCE_RUNS,
    warm_up: bool = False,
) -> ReferenceTiming:
    """Time the reference workload `runs` times (each run kept under `directory`), fresh prompts each run.

    `warm_up`: one more run first, not counted, for a server that has not yet
    run this shape (the CPU backend compiles kernels on first use).
    """
    probe = reference_probe(max_num_seqs)
    if warm_up:
        run_into(target, probe_load(probe, vocab_size, seed=19_999), directory / "warmup", run_info)
    values, stalled = [], 0
    for i in range(runs):
        records, _, summary = run_into(
            target, probe_load(probe, vocab_size, seed=20_000 + i), directory / f"run-{i + 1}", run_info
        )
        tpot_ms = summary.median_tpot_ms
        if bunched_fraction(records) > MAX_BUNCHED or not summary.completed or summary.failed or tpot_ms is None:
            stalled += 1
            continue
        values.append(float(tpot_ms))
    return ReferenceTiming(workload=probe.name, runs_ms=values, stalled_runs=stalled)


def merged(*timings: ReferenceTiming) -> ReferenceTiming:
    """Timings of the same workload as one: its spread then covers any drift between them."""
    return ReferenceTiming(
        workload=timings[0].workload,
        runs_ms=[v for t in timings for v in t.runs_ms],
        stalled_runs=sum(t.stalled_runs for t in timings),
    )


def speed_check(
    calibrated: ReferenceTiming | None, target: Target, max_num_seqs: int | None, vocab_size: int, directory: Path
) -> list[str]:
    """Time the reference on a live server and compare it with a calibration's: one line when the speed changed.

    For a server measured against a profile's predictions (tune's stage 2):
    the prediction holds for the server's calibrated speed, so a server now
    slower or faster is said to be so, with the numbers, next to what it measured.
    """
    if calibrated is None:
        return [
            "the calibration profile has no reference step time (schema 2, or fitted from runs by calibrate --from): "
            "this server's speed is unchecked"
        ]
    timing = time_reference(
        target, max_num_seqs, vocab_size, directory, RunInfo.begun(verb="speed-check"), warm_up=True
    )
    if timing.workload != calibrated.workload:
        return [
            f"this server's reference ({timing.workload}) is not the calibrated one ({calibrated.workload}): "
            "its speed is unchecked"
        ]
    change = calibrated.speed_change(timing)
    return [change.describe()] if change is not None and change.changed else []
