"""Synthetic results directories for report tests: plausible shapes, written by the real ResultWriter.

A toy closed-loop server: `slots` requests decode at once, each step slower as
the batch grows, extra requests wait. That is enough to give curves a knee,
CDFs a tail, and the timeline queueing, without a simulator or a server.
"""

from __future__ import annotations

import random
from pathlib import Path

from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import ResultWriter, write_sweep_index
from servelab.schemas.results import SweepIndex
from servelab.metrics.summary import summarize
from servelab.metrics.timeline import TimelineSample
from servelab.schemas.results import RunInfo


def toy_records(
    concurrency: int, n: int, *, slots: int = 8, seed: int = 0, source: str = "http"
) -> list[RequestRecord]:
    """The "sim" flavour knows when each request was scheduled and runs a little faster, as a model would."""
    rng = random.Random(seed)
    speed = 0.9 if source == "sim" else 1.0
    free_at = [0.0] * concurrency  # closed loop: each client sends when its previous request ends
    engine_free = [0.0] * slots
    records = []
    for index in range(n):
        client = min(range(concurrency), key=free_at.__getitem__)
        send = free_at[client]
        slot = min(range(slots), key=engine_free.__getitem__)
        scheduled = max(send, engine_free[slot])
        prompt, output = rng.randint(100, 400), rng.randint(20, 60)
        step = speed * (0.010 + 0.0015 * min(concurrency, slots) * rng.uniform(0.9, 1.2))
        first = scheduled + speed * (0.02 + prompt * 1e-4 * rng.uniform(0.8, 1.5))
        finish = first + step * (output - 1)
        failed = index % 37 == 36
        records.append(
            RequestRecord(
                index=index,
                intended_time=send,
                send_time=send,
                finish_time=finish if not failed else first,
                first_token_time=None if failed else first,
                chunk_times=[] if failed else [first + i * step for i in range(output)],
                prompt_tokens=prompt,
                output_tokens=0 if failed else output,
                status="error" if failed else "ok",
                error_kind="http_500" if failed else None,
                schedule_time=scheduled if source == "sim" else None,
            )
        )
        free_at[client] = engine_free[slot] = records[-1].finish_time
    return records


def toy_timeline(records: list[RequestRecord], every: float = 0.25) -> list[TimelineSample]:
    end = max(r.finish_time for r in records)
    samples, preemptions, hits, queries = [], 0.0, 0.0, 0.0
    t = 0.0
    while t <= end + every:
        running = sum(1 for r in records if (r.schedule_time or r.send_time) <= t < r.finish_time)
        waiting = sum(1 for r in records if r.send_time <= t < (r.schedule_time or r.send_time))
        preemptions += 1.0 if running > 6 and int(t / every) % 7 == 0 else 0.0
        queries += 400.0 * running
        hits += 160.0 * running
        samples.append(
            TimelineSample(
                t=round(t, 3),
                values={
                    tl.RUNNING: float(running),
                    tl.WAITING: float(waiting),
                    tl.KV_USAGE: min(1.0, running * 0.11),
                    tl.PREEMPTIONS: preemptions,
                    tl.PREFIX_QUERIES: queries,
                    tl.PREFIX_HITS: hits,
                },
            )
        )
        t += every
    return samples


def write_toy_run(
    directory: Path,
    *,
    concurrency: int = 8,
    n: int = 80,
    source: str | None = "http",
    seed: int = 0,
    with_timeline: bool = True,
    with_summary: bool = True,
) -> Path:
    info: dict = {
        "arrival": {"max_concurrency": concurrency, "request_rate": "inf"},
        "num_prompts": n,
        "model": "tiny-qwen",
        "endpoint": "/v1/completions",
    }
    if source is not None:
        info["source"] = source
    writer = ResultWriter(directory, RunInfo.begun(**info))
    records = toy_records(concurrency, n, seed=seed, source=source or "http")
    for record in records:
        writer.records.write(record)
    if with_timeline:
        for sample in toy_timeline(records):
            writer.write_sample(sample)
    if with_summary:
        writer.write_summary(summarize(records))
    writer.close()
    return directory


def write_toy_sweep(
    directory: Path, values: tuple[int, ...] = (1, 2, 4, 8, 16), *, source: str | None = "http", n: int = 60
) -> Path:
    points = []
    for value in values:
        name = f"max-concurrency={value}"
        write_toy_run(
            directory / name, concurrency=value, n=n, source=source, seed=value + (100 if source == "sim" else 0)
        )
        points.append({"max-concurrency": value, "directory": name})
    sweep = {"key": "max-concurrency", "values": list(values)}
    write_sweep_index(directory, SweepIndex.model_validate({"sweep": sweep, "points": points}))
    return directory


TOY_DIAGNOSIS = {
    "source": "measured",
    "deployment": {
        "model": "Qwen2.5-7B",
        "gpu": "A100-80GB-SXM",
        "engine_args": "--max-num-seqs 256",
        "engine_config": {},
        "num_gpu_blocks": 4000,
        "kv_cache_gib": 60.0,
        "coefficients": {},
        "cpu_costs_source": "default",
        "frontend": {},
        "warnings": [],
    },
    "workload": {
        "requests": 400,
        "offered_rate": None,
        "max_concurrency": 16,
        "mean_input_tokens": 250.0,
        "mean_output_tokens": 40.0,
    },
    "bottleneck": "max_num_seqs_bound",
    "findings": [
        {
            "kind": "max_num_seqs_bound",
            "title": "max_num_seqs caps the batch while requests queue",
            "score": 0.8,
            "evidence": ["252 requests running per replica = max_num_seqs 256"],
            "recommendations": [
                {
                    "change": "--max-num-seqs 512",
                    "engine_args": "--max-num-seqs 512",
                    "metric": "capacity_rps",
                    "before": 8.0,
                    "after": 12.0,
                    "gain": 0.5,
                    "effects": {"p99_ttft_ms": [900.0, 300.0]},
                    "confirm": "servelab bench --max-concurrency 16",
                }
            ],
        }
    ],
    "ceilings": {
        "prefill_compute_rps": 10.7,
        "decode_bandwidth_tps": 9000.0,
        "decode_bandwidth_tps_at_max_batch": 7135.0,
        "saturation_rps": 8.4,
        "slo_max_rps": None,
        "kv_capacity_seqs": 616,
        "max_num_seqs": 256,
    },
    "standing": {"prefill_compute": 0.77, "decode_bandwidth": 0.23, "saturation": 0.99},
    "utilization": {},
    "evidence": {},
    "slo": None,
    "slo_attainment": None,
    "observed": {"qps": None, "ttft_ms": None, "gpu_util": None},
    "notes": ["'GPU memory full' is by design"],
    "advice": None,
}
"""The shape of diagnosis.json as `servelab diagnose RESULTS` writes it (Diagnosis.as_dict): every required key, the
open parts (utilization, evidence) empty."""


_VALIDATION_METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_e2el_ms")
_VALIDATION_MEASURED = {
    "closed-c3": (310.0, 41.0, 95.0, 9.1, 780.0),
    "closed-c12": (820.0, 66.0, 210.0, 13.5, 1650.0),
    "poisson-70pct": (540.0, 52.0, 340.0, 11.8, 1200.0),
}
"""Each toy point's measured figures, in _VALIDATION_METRICS' order."""
_VALIDATION_SCALE = (1.06, 0.86, 0.7, 1.12, 1.04)
"""The toy simulation: each figure the measured one times this (errors of 4% to 30%)."""


def toy_validation() -> dict:
    """A `servelab validate` report as validate_on writes it (repeats trimmed), errors computed by validate's own
    code."""
    from servelab.calibrate.calibrate import compare
    from servelab.calibrate.validate import BOUNDS_PCT, GOALS_PCT, median_abs_errors
    from servelab.schemas.validation import PointResult

    measured = {name: dict(zip(_VALIDATION_METRICS, row)) for name, row in _VALIDATION_MEASURED.items()}
    scale = dict(zip(_VALIDATION_METRICS, _VALIDATION_SCALE))
    points = []
    for name, m in measured.items():
        s = {k: v * scale[k] for k, v in m.items()}
        points.append(
            {
                "point": name,
                "shape": {"name": name},
                "measured": m,
                "simulated": s,
                "error_pct": compare(m, s),
                "repeats": [{"measured": m, "simulated": s}] * 2,
            }
        )
    medians = median_abs_errors([PointResult.model_validate(p) for p in points])
    return {
        "schema_version": 1,
        "kind": "servelab.validation",
        "created_at": 1.79e9,
        "server": {"base_url": "http://127.0.0.1:8000", "model": "tiny-qwen"},
        "profile": {"created_at": 1.79e9, "engine_args": "--max-num-seqs 32 --block-size 128", "gpu": "cpu"},
        "engine_args": "--max-num-seqs 32 --block-size 128",
        "engine_config": {},
        "points": points,
        "median_abs_error_pct": medians,
        "bounds_pct": BOUNDS_PCT,
        "goals_pct": GOALS_PCT,
        "within_bounds": all(medians[k] is not None and medians[k] <= b for k, b in BOUNDS_PCT.items()),
    }
