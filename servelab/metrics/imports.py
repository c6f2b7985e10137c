"""Benchmark results written by other tools (or by servelab), read as one typed `MeasuredRun` each.

`servelab calibrate --from` fits the simulator to runs the user already has.
Each reader turns one result into what was sent (the requests: lengths and
arrival times, and the concurrency cap) and what was measured (the summary
keys `vllm bench serve` and servelab's summary.json share). Formats:

  servelab      a results directory (run.json, records.jsonl, summary.json):
                every request's lengths and intended send time; a sweep
                (sweep.json) is one run per point
  vllm-bench    the JSON of `vllm bench serve --save-result`
                (vllm/benchmarks/serve.py); with `--save-detailed` it lists
                every request's input/output length and start time, without
                it only totals, so lengths come from the totals or the flags
  guidellm      `guidellm benchmark --output-path x.json` (its
                GenerativeBenchmarksReport): one run per benchmark in the file
  aiperf        AIPerf's profile_export_aiperf.json (aggregates and its
                input_config)

Where a file holds only aggregates, the workload the user gives with
simulate's flags (`WorkloadFlags`) fills in what the file does not say; a
flag that contradicts the file is refused, naming both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from servelab.errors import InputError
from servelab.metrics.results import RUN, SWEEP, load_run
from servelab.metrics.summary import summarize
from servelab.schemas.results import Json, RunFlags
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.errors import WorkloadError
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan, RequestSpec

MEASURED_KEYS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "completed",
    "duration",
)
"""What a measured run can say, named as `vllm bench serve` and servelab's summary.json name it."""
_PROMPT_ID_RANGE = 30_000
"""Prompt token ids are drawn below this: the lengths matter to the simulator, the ids only for prefix sharing."""
_LENGTH_TOLERANCE = 0.1
"""A flag's length that differs from the file's mean by more than this share (beyond the range ratio) contradicts it."""


class ResultFormat(StrEnum):
    SERVELAB = "servelab"
    VLLM_BENCH = "vllm-bench"
    GUIDELLM = "guidellm"
    AIPERF = "aiperf"


class ResultImportError(InputError):
    """A result that cannot be read as a measured run; the message names the file."""


@dataclass(frozen=True)
class MeasuredRun:
    """One benchmark run read back: the requests it sent and the figures it measured."""

    source: str
    """The file or directory (and, for a file with several benchmarks, which one)."""
    format: ResultFormat
    requests: tuple[RequestSpec, ...]
    max_concurrency: int | None
    measured: dict[str, float]
    """Summary keys (MEASURED_KEYS) the file gives, in servelab's units (ms, req/s, tok/s, s)."""
    lengths_from: str
    """Where the request lengths came from: "file" (per request), "file totals" or "flags"."""
    notes: tuple[str, ...] = ()

    def plan(self) -> LoadPlan:
        """A fresh plan of the same requests (plans are single-use)."""
        return LoadPlan(
            list(self.requests), max_concurrency=self.max_concurrency, description={"measured_run": self.source}
        )

    @property
    def burst(self) -> bool:
        return all(r.arrival_time == 0 for r in self.requests)


@dataclass(frozen=True)
class WorkloadFlags:
    """simulate's workload flags as the user gave them (None: not given), for files that hold only aggregates."""

    random_input_len: int | None = None
    random_output_len: int | None = None
    num_prompts: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None
    dataset_name: str | None = None
    dataset_path: Path | None = None
    random_range_ratio: float | None = None
    seed: int = 0

    @property
    def given(self) -> bool:
        return any(getattr(self, k) is not None for k in _FLAG_NAMES)


_FLAG_NAMES = (
    "random_input_len",
    "random_output_len",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "dataset_name",
    "dataset_path",
    "random_range_ratio",
)


@dataclass(frozen=True)
class _FileFacts:
    """What an aggregate file says about its workload (None: it does not say)."""

    num_prompts: int | None = None
    request_rate: float | None = None
    """inf for a burst."""
    max_concurrency: int | None = None
    mean_input_len: float | None = None
    mean_output_len: float | None = None
    burstiness: float = 1.0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_consistent(source: str, facts: _FileFacts, flags: WorkloadFlags) -> None:
    """InputError naming the flag and the file when a flag says something else than the file."""
    for name in ("num_prompts", "max_concurrency"):
        given, known = getattr(flags, name), getattr(facts, name)
        if given is not None and known is not None and given != known:
            raise ResultImportError(
                f"{_flag(name)} {given} contradicts {source}, which says {name} {known}: drop the flag"
            )
    if (
        flags.request_rate is not None
        and facts.request_rate is not None
        and not math.isclose(flags.request_rate, facts.request_rate, rel_tol=1e-6)
    ):
        raise ResultImportError(
            f"--request-rate {flags.request_rate:g} contradicts {source}, which says request_rate "
            f"{facts.request_rate:g}: drop the flag"
        )
    spread = flags.random_range_ratio or 0.0
    for name, mean in (("random_input_len", facts.mean_input_len), ("random_output_len", facts.mean_output_len)):
        given = getattr(flags, name)
        if given is not None and mean is not None and abs(given - mean) > (_LENGTH_TOLERANCE + spread) * mean:
            raise ResultImportError(
                f"{_flag(name)} {given} contradicts {source}, whose requests averaged {mean:.0f} tokens: "
                "drop the flag or give the file it describes"
            )


def _requests_from_flags(source: str, facts: _FileFacts, flags: WorkloadFlags) -> tuple[list[RequestSpec], str]:
    """The requests of an aggregate-only file: simulate's workload flags, with the file's own facts where no flag is
    given."""
    _check_consistent(source, facts, flags)
    dataset = flags.dataset_name or "random"
    lengths_from = "flags" if flags.given else "file totals"

    def pick(flag: int | None, mean: float | None, what: str) -> int | None:
        if flag is not None:
            return flag
        if mean is not None:
            return max(1, round(mean))
        if dataset == "random":
            raise ResultImportError(
                f"{source} does not say the requests' {what} lengths: give --random-{what}-len "
                "(or --dataset-name/--dataset-path)"
            )
        return None

    input_len = pick(flags.random_input_len, facts.mean_input_len, "input")
    output_len = pick(flags.random_output_len, facts.mean_output_len, "output")
    num_prompts = flags.num_prompts or facts.num_prompts
    if num_prompts is None:
        raise ResultImportError(f"{source} does not say how many requests it sent: give --num-prompts")
    rate = flags.request_rate if flags.request_rate is not None else facts.request_rate
    defaults = WorkloadConfig()
    try:
        workload = WorkloadConfig(
            dataset_name=dataset,
            dataset_path=flags.dataset_path,
            input_len=input_len or defaults.input_len,
            output_len=output_len or defaults.output_len,
            range_ratio=flags.random_range_ratio or 0.0,
            seed=flags.seed,
        )
        arrival = ArrivalConfig(
            request_rate=math.inf if rate is None else rate,
            burstiness=facts.burstiness,
            max_concurrency=flags.max_concurrency or facts.max_concurrency,
        )
        plan = build_plan(workload, arrival, Amount(num_prompts=num_prompts))
    except WorkloadError as exc:
        raise ResultImportError(f"the workload given for {source}: {exc}") from exc
    return list(plan.requests), lengths_from


def _prompt(rng: np.random.Generator, length: int) -> np.ndarray:
    return rng.integers(0, _PROMPT_ID_RANGE, size=max(1, int(length)))


def _specs(
    input_lens: Sequence[int], output_lens: Sequence[int], arrivals: Sequence[float], seed: int = 0
) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    return [
        RequestSpec(index=i, prompt_ids=_prompt(rng, n), max_tokens=max(1, int(m)), arrival_time=float(t))
        for i, (n, m, t) in enumerate(zip(input_lens, output_lens, arrivals))
    ]


def _poisson_arrivals(n: int, rate: float | None, burstiness: float, seed: int) -> list[float]:
    """Arrival times of an open loop at `rate` (gamma gaps of shape `burstiness`, as vLLM draws them); 0s for a
    burst."""
    if rate is None or math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng([seed, 7]).gamma(burstiness, 1.0 / (rate * burstiness), n)
    return [0.0, *np.cumsum(gaps)[:-1].tolist()][:n]


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _run(
    source: str,
    fmt: ResultFormat,
    requests: list[RequestSpec],
    max_concurrency: int | None,
    measured: Json,
    lengths_from: str,
    notes: Sequence[str] = (),
) -> MeasuredRun:
    figures = {k: v for k in MEASURED_KEYS if (v := _finite(measured.get(k))) is not None}
    if not figures.get("completed"):
        raise ResultImportError(f"{source} has no completed requests: there is nothing measured to calibrate on")
    if not requests:
        raise ResultImportError(f"{source} lists no requests that completed")
    return MeasuredRun(source, fmt, tuple(requests), max_concurrency, figures, lengths_from, tuple(notes))


# -- servelab results directory ---------------------------------------------------------------------------------


def read_servelab(directory: Path, flags: WorkloadFlags) -> list[MeasuredRun]:
    """A servelab results directory: every completed request as recorded, sent when the schedule wanted it."""
    if flags.given:
        raise ResultImportError(
            f"{directory} is a servelab results directory, which records every request: "
            "the workload flags would say it twice; drop them"
        )
    run = load_run(directory)
    ok = sorted((r for r in run.records if r.ok), key=lambda r: r.index)
    summary = run.summary if run.summary is not None else summarize(run.records).model_dump(exclude_unset=True)
    source = str(directory)
    if not ok or not summary.get("completed"):
        raise ResultImportError(f"{source} has no completed requests: there is nothing measured to calibrate on")
    start = min(r.intended_time for r in ok)
    info = run.run_info
    given = info.flags or RunFlags()
    point = (info.model_extra or {}).get("sweep_point") or {}  # a sweep's point: a key RunInfo leaves open
    rate = point.get("request-rate", given.request_rate)
    concurrency = point.get("max-concurrency", given.max_concurrency)
    open_loop = rate is not None and math.isfinite(float(rate))
    arrivals = [r.intended_time - start if open_loop else 0.0 for r in ok]
    requests = _specs([r.prompt_tokens for r in ok], [r.output_tokens for r in ok], arrivals)
    notes = [run.partial_note()] if run.partial else []
    return [_run(source, ResultFormat.SERVELAB, requests, concurrency, summary, "file", notes)]


def read_servelab_sweep(directory: Path, flags: WorkloadFlags) -> list[MeasuredRun]:
    """A servelab sweep: one measured run per point (its own results directory, listed in sweep.json)."""
    try:
        points = json.loads((directory / SWEEP).read_text(encoding="utf-8"))["points"]
        return [run for point in points for run in read_servelab(directory / point["directory"], flags)]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultImportError(f"cannot read the sweep {directory / SWEEP}: {exc}") from exc


# -- vllm bench serve --save-result -----------------------------------------------------------------------------


def _rate(value: Any) -> float | None:
    """vLLM writes an infinite rate as the string "inf" (a burst: every request at t=0)."""
    if value is None:
        return None
    return math.inf if str(value).lower() == "inf" else float(value)


def read_vllm_bench(path: Path, data: Json, flags: WorkloadFlags) -> list[MeasuredRun]:
    """`vllm bench serve --save-result` JSON; per-request lengths when it was saved with --save-detailed."""
    source = str(path)
    rate = _rate(data.get("request_rate"))
    concurrency = data.get("max_concurrency")
    burstiness = float(data.get("burstiness") or 1.0)
    measured = {k: data.get(k) for k in MEASURED_KEYS}
    completed = int(data.get("completed") or 0)
    if completed == 0:
        raise ResultImportError(f"{source} has no completed requests: there is nothing measured to calibrate on")
    if "input_lens" in data and "output_lens" in data:
        if flags.given:
            raise ResultImportError(
                f"{source} was saved with --save-detailed and lists every request: the workload flags "
                "would say it twice; drop them"
            )
        errors = data.get("errors") or [""] * len(data["input_lens"])
        kept = [i for i, e in enumerate(errors) if not e]
        starts = data.get("start_times")
        notes: list[str] = []
        if starts and concurrency is None and rate is not None and math.isfinite(rate):
            t0 = min(starts[i] for i in kept)
            arrivals = [starts[i] - t0 for i in kept]
        else:
            arrivals = _poisson_arrivals(len(kept), rate, burstiness, flags.seed)
            if rate is not None and math.isfinite(rate):
                notes.append(
                    "arrival times drawn at the file's request_rate (its start times are after the concurrency cap)"
                )
        requests = _specs([data["input_lens"][i] for i in kept], [data["output_lens"][i] for i in kept], arrivals)
        return [_run(source, ResultFormat.VLLM_BENCH, requests, concurrency, measured, "file", notes)]
    facts = _FileFacts(
        num_prompts=data.get("num_prompts"),
        request_rate=rate,
        max_concurrency=concurrency,
        mean_input_len=data["total_input_tokens"] / completed if data.get("total_input_tokens") else None,
        mean_output_len=data["total_output_tokens"] / completed if data.get("total_output_tokens") else None,
        burstiness=burstiness,
    )
    requests, lengths_from = _requests_from_flags(source, facts, flags)
    return [
        _run(
            source,
            ResultFormat.VLLM_BENCH,
            requests,
            facts.max_concurrency or flags.max_concurrency,
            measured,
            lengths_from,
        )
    ]


# -- GuideLLM -----------------------------------------------------------------------------------------------------


def _successful(metrics: Json, name: str) -> Json:
    """One of GuideLLM's StatusDistributionSummary's successful-request distributions ({} when absent)."""
    summary = metrics.get(name) or {}
    return summary.get("successful") or {}


def _distribution(metrics: Json, name: str, key: str, scale: float = 1.0) -> dict[str, float | None]:
    d = _successful(metrics, name)
    pct = d.get("percentiles") or {}

    def scaled(v: Any) -> float | None:
        x = _finite(v)
        return None if x is None else x * scale

    return {
        f"mean_{key}_ms": scaled(d.get("mean")),
        f"median_{key}_ms": scaled(d.get("median", pct.get("p50"))),
        f"p99_{key}_ms": scaled(pct.get("p99")),
    }


def _guidellm_strategy(benchmark: Json) -> tuple[float | None, int | None]:
    """(request rate, concurrency) of a GuideLLM scheduling strategy: synchronous, concurrent, throughput, constant,
    poisson."""
    config = benchmark.get("config") or benchmark.get("args") or {}
    strategy = config.get("strategy") or benchmark.get("strategy") or {}
    kind = str(strategy.get("type_") or strategy.get("type") or "")
    if kind == "synchronous":
        return math.inf, 1
    if kind == "concurrent":
        return math.inf, int(strategy["streams"])
    if kind == "throughput":
        return math.inf, strategy.get("max_concurrency")
    if kind in ("constant", "poisson", "async"):
        return float(strategy["rate"]), strategy.get("max_concurrency")
    raise ResultImportError(
        f"GuideLLM strategy {kind or 'missing'!r} is not one servelab can replay "
        "(synchronous, concurrent, throughput, constant, poisson)"
    )


def read_guidellm(path: Path, data: Json, flags: WorkloadFlags) -> list[MeasuredRun]:
    """A GuideLLM benchmarks report: one measured run per benchmark (a sweep has several)."""
    runs = []
    for i, benchmark in enumerate(data["benchmarks"]):
        source = f"{path}#benchmark{i}"
        metrics = benchmark.get("metrics") or {}
        rate, concurrency = _guidellm_strategy(benchmark)
        totals = metrics.get("request_totals") or benchmark.get("request_totals") or {}
        completed = int(totals.get("successful") or 0)
        scheduler = benchmark.get("scheduler_metrics") or {}
        duration = _finite(benchmark.get("duration"))
        if duration is None and "measure_end_time" in scheduler:
            duration = scheduler["measure_end_time"] - scheduler["measure_start_time"]
        measured: Json = {
            "completed": completed,
            "duration": duration,
            "request_throughput": _successful(metrics, "requests_per_second").get("mean"),
            "output_throughput": _successful(metrics, "output_tokens_per_second").get("mean"),
            **_distribution(metrics, "time_to_first_token_ms", "ttft"),
            **_distribution(metrics, "time_per_output_token_ms", "tpot"),
            **_distribution(metrics, "inter_token_latency_ms", "itl"),
            **_distribution(metrics, "request_latency", "e2el", scale=1e3),  # GuideLLM's request latency is in seconds
        }
        per_request = ((benchmark.get("requests") or {}).get("successful")) or []
        if per_request and all(r.get("prompt_tokens") and r.get("output_tokens") for r in per_request):
            if flags.given:
                raise ResultImportError(
                    f"{source} lists every request: the workload flags would say it twice; drop them"
                )
            starts = [float(r.get("request_start_time", r.get("start_time")) or 0.0) for r in per_request]
            t0 = min(starts)
            arrivals = [
                s - t0 if rate is not None and math.isfinite(rate) and concurrency is None else 0.0 for s in starts
            ]
            requests = _specs(
                [r["prompt_tokens"] for r in per_request], [r["output_tokens"] for r in per_request], arrivals
            )
            runs.append(_run(source, ResultFormat.GUIDELLM, requests, concurrency, measured, "file"))
            continue
        facts = _FileFacts(
            num_prompts=completed or None,
            request_rate=rate,
            max_concurrency=concurrency,
            mean_input_len=_finite(_successful(metrics, "prompt_token_count").get("mean")),
            mean_output_len=_finite(_successful(metrics, "output_token_count").get("mean")),
        )
        requests, lengths_from = _requests_from_flags(source, facts, flags)
        runs.append(_run(source, ResultFormat.GUIDELLM, requests, concurrency, measured, lengths_from))
    return runs


# -- AIPerf ---------------------------------------------------------------------------------------------------------


def read_aiperf(path: Path, data: Json, flags: WorkloadFlags) -> list[MeasuredRun]:
    """AIPerf's profile_export_aiperf.json: aggregates ({unit, avg, p50, p99, ...} per metric) and its input_config.

    AIPerf's inter_token_latency is per request (latency - TTFT) / (output tokens - 1), vLLM's TPOT.
    """
    source = str(path)
    records: Json = data["records"] if isinstance(data.get("records"), dict) else data

    def stat(name: str, key: str = "avg", scale: float = 1.0) -> float | None:
        value = _finite((records.get(name) or {}).get(key))
        return None if value is None else value * scale

    measured = {
        "completed": stat("request_count"),
        "duration": stat("benchmark_duration"),
        "request_throughput": stat("request_throughput"),
        "output_throughput": stat("output_token_throughput"),
    }
    for name, key in (("time_to_first_token", "ttft"), ("inter_token_latency", "tpot"), ("request_latency", "e2el")):
        measured |= {
            f"mean_{key}_ms": stat(name),
            f"median_{key}_ms": stat(name, "p50"),
            f"p99_{key}_ms": stat(name, "p99"),
        }
    if not measured["completed"]:
        raise ResultImportError(f"{source} has no completed requests: there is nothing measured to calibrate on")
    loadgen = (data.get("input_config") or {}).get("loadgen") or {}
    rate = _finite(loadgen.get("request_rate"))
    facts = _FileFacts(
        num_prompts=int(measured["completed"]),
        request_rate=rate if rate is not None else math.inf,
        max_concurrency=loadgen.get("concurrency"),
        mean_input_len=stat("input_sequence_length"),
        mean_output_len=stat("output_sequence_length"),
    )
    requests, lengths_from = _requests_from_flags(source, facts, flags)
    return [_run(source, ResultFormat.AIPERF, requests, facts.max_concurrency, measured, lengths_from)]


# -- dispatch ---------------------------------------------------------------------------------------------------------


def _json_format(data: Any) -> ResultFormat | None:
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("benchmarks"), list):
        return ResultFormat.GUIDELLM
    if "request_throughput" in data and ("mean_ttft_ms" in data or "num_prompts" in data):
        return ResultFormat.VLLM_BENCH
    if (
        isinstance(data.get("request_throughput"), dict)
        or "input_config" in data
        or isinstance(data.get("records"), dict)
    ):
        return ResultFormat.AIPERF
    return None


_JSON_READERS: dict[ResultFormat, Callable[[Path, Json, WorkloadFlags], list[MeasuredRun]]] = {
    ResultFormat.VLLM_BENCH: read_vllm_bench,
    ResultFormat.GUIDELLM: read_guidellm,
    ResultFormat.AIPERF: read_aiperf,
}


def read_measured_runs(path: Path, flags: WorkloadFlags | None = None) -> list[MeasuredRun]:
    """Every measured run in `path` (a results directory or a JSON file); ResultImportError naming it otherwise."""
    flags = flags or WorkloadFlags()
    if path.is_dir():
        if (path / SWEEP).is_file():
            return read_servelab_sweep(path, flags)
        if not (path / RUN).is_file():
            raise ResultImportError(f"{path} is a directory but not a servelab results directory (no {RUN} or {SWEEP})")
        return read_servelab(path, flags)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultImportError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultImportError(
            f"{path} is not JSON ({exc}): give a servelab results directory, a `vllm bench serve "
            "--save-result` JSON, a GuideLLM benchmarks JSON or AIPerf's profile_export_aiperf.json"
        ) from exc
    fmt = _json_format(data)
    if fmt is None:
        raise ResultImportError(
            f"{path} is not a result servelab knows: give a servelab results directory, a `vllm bench "
            "serve --save-result` JSON, a GuideLLM benchmarks JSON or AIPerf's profile_export_aiperf.json"
        )
    try:
        return _JSON_READERS[fmt](path, data, flags)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, InputError):
            raise
        raise ResultImportError(
            f"{path} looks like a {fmt} result but cannot be read: {type(exc).__name__} {exc}"
        ) from exc
