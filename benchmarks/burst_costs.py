"""How vLLM's CPU side grows with requests in flight: bursts of 10..2,000 on the vLLM CPU build, measured and simulated.

A thousand tiny requests released at once are limited by vLLM's Python, not by
the model. With the tiny model (its forward pass negligible) this script
measures, on the vLLM CPU build, how that Python's cost grows with the number
of requests running and waiting:

1. Engine core, in process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, uniprocess,
   one OpenMP thread), the same scheduler limits as the served part
   (256 sequences, 8,192 batched tokens): N requests added at once, then
   stepped to the end. Every step's `Scheduler.schedule`,
   `update_from_output`, `sample_tokens` minus the sampler (thread CPU time)
   with the running and waiting counts it saw, the step's wall time, and the
   engine core's own cost of taking a request in (`EngineCore.add_request`
   after `preprocess_add_request`). Fitted: per-step CPU = fixed + per
   scheduled request + per waiting request; and the CPU build's whole step
   (what the simulator's replay below runs as its "GPU" step).
2. The API server as served (cpu_side_costs.ApiProbe: API process pinned to
   core 0, engine core and model worker to core 1, the client beside the API
   server on core 0: on core 1 it starved the engine and itself), bursts of
   N = 10..2,000 streamed requests released at once (128 in / 4 out and
   16 in / 32 out) and closed loops at a steady concurrency, twice: the
   client's throughput, TTFT, TPOT; vLLM's own TTFT from its arrival in
   `AsyncLLM` (so client TTFT - vLLM TTFT is the API server's intake of the
   request and the first chunk's way out); the event loop's CPU per request;
   engine steps.
3. The replay: each load's own requests served by `SimTarget` with part 1's
   step model times one served-engine factor fitted to the steady loads, and
   the API server's event-loop costs fitted here (`--from-raw` prints the
   table of docs/simulator.md; run with an older checkout on PYTHONPATH for
   its "before" column). The data file's `bursts` section (`--out`) is
   rewritten: the per-step CPU against the waiting count, the loop's CPU per
   request by load, and the moderate bursts' repeat noise.

Every server or engine run holds `flock /tmp/servelab-heavy.lock`; every load
is bounded in count and time.

    # measure (~7 min), fit, write `bursts`, print the table:
    .venv/bin/python benchmarks/burst_costs.py --raw burst.json
    .venv/bin/python benchmarks/burst_costs.py --from-raw burst.json # refit and replay only
    .venv/bin/python benchmarks/burst_costs.py --from-raw benchmarks/measured/burst_costs-cpu-2026-12-05.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # servelab on PYTHONPATH (another checkout) wins

from cpu_side_costs import (  # noqa: E402  (the sibling script's helpers)
    CACHE,
    LATENCY_METRICS,
    STEPS_METRIC,
    ApiProbe,
    heavy_lock,
    linear_fit,
    reference_loop_s,
    time_method,
)

BURST_SIZES = (10, 50, 200, 500, 1000, 2000)
SHAPES = {"128/4": (21, 4), "16/32": (3, 32)}
"""Prompt words (~6 tokens each with the tiny model's tokenizer) and output tokens."""
STEADY = ((64, 640), (512, 1536))
"""Closed loops of 128 in / 4 out: (concurrency, requests)."""
MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 256, 8192
SERVER_ARGS = (
    "--dtype",
    "float32",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    str(MAX_NUM_SEQS),
    "--max-num-batched-tokens",
    str(MAX_BATCHED_TOKENS),
    "--no-enable-prefix-caching",
)
"""cpu_side_costs.ApiProbe's server flags, which part 1 and the replay mirror."""
SERVED_REPEATS = 2


# -- 1. engine core, in process (runs under the vLLM venv's python) -----------------------------------------


def engine_worker(model_dir: str, deadline_s: float, sizes: tuple[int, ...], shapes: tuple[str, ...]) -> None:
    """Per-step CPU and wall time with the running/waiting counts each step saw; prints one JSON object."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    timers: dict[str, float] = {}
    seen: dict[str, int] = {}

    def queues(sched) -> None:
        seen["running"], seen["waiting"] = len(sched.running), len(sched.waiting)

    def batch(out) -> None:
        seen["scheduled"], seen["new"] = len(out.num_scheduled_tokens), len(out.scheduled_new_reqs)
        seen["tokens"], seen["finished"] = out.total_num_scheduled_tokens, len(out.finished_req_ids)

    time_method(timers, Scheduler, "schedule", "schedule", before=queues, after=batch)
    time_method(timers, Scheduler, "update_from_output", "update")
    time_method(timers, GPUModelRunner, "execute_model", "execute")
    time_method(timers, GPUModelRunner, "_model_forward", "forward")
    time_method(timers, GPUModelRunner, "sample_tokens", "sample_tokens")
    time_method(timers, GPUModelRunner, "_sample", "sampler")
    time_method(timers, EngineCore, "add_request", "core_add")

    llm = LLM(
        model=model_dir,
        max_model_len=4096,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        distributed_executor_backend="uni",
        enable_prefix_caching=False,
        seed=0,
        dtype="float32",
    )
    engine = llm.llm_engine
    vocab = engine.model_config.get_vocab_size()
    rng = random.Random(0)
    records, adds = [], []
    start = time.monotonic()
    for repeat in range(2):  # the first pass warms caches and compiles
        for shape in shapes:
            words, out = SHAPES[shape]
            prompt_len = 6 * words + (2 if words < 10 else 4)
            params = SamplingParams(max_tokens=out, ignore_eos=True, temperature=0)
            for n in sizes:
                timers.clear()
                t0 = time.thread_time()
                for i in range(n):
                    ids = [rng.randrange(10, vocab - 10) for _ in range(prompt_len)]
                    engine.add_request(f"{repeat}-{shape}-{n}-{i}", TokensPrompt(prompt_token_ids=ids), params)
                adds.append(
                    {
                        "repeat": repeat,
                        "shape": shape,
                        "n": n,
                        "total_s": time.thread_time() - t0,
                        "core_add_s": timers.get("core_add", 0.0),
                    }
                )
                while engine.has_unfinished_requests() and time.monotonic() - start < deadline_s:
                    timers.clear()
                    seen.clear()
                    w0, c0 = time.perf_counter(), time.thread_time()
                    engine.step()
                    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                    if "scheduled" in seen:
                        records.append(
                            {
                                "repeat": repeat,
                                "shape": shape,
                                "n": n,
                                **seen,
                                **timers,
                                "wall": wall,
                                "thread_cpu": cpu,
                            }
                        )
    print(json.dumps({"records": records, "adds": adds}))


def measure_engine(
    vllm_python: Path,
    model_dir: Path,
    deadline_s: float,
    sizes: tuple[int, ...] = BURST_SIZES,
    shapes: tuple[str, ...] = tuple(SHAPES),
) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            str(vllm_python),
            __file__,
            "--engine-worker",
            str(model_dir),
            "--deadline",
            str(deadline_s),
            "--sizes",
            ",".join(map(str, sizes)),
            "--shapes",
            ",".join(shapes),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=deadline_s + 300,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"engine worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def engine_cpu(r: dict) -> float:
    """The engine core's Python of one step: schedule, output bookkeeping, output update (not the model runner's)."""
    return r.get("schedule", 0.0) + r.get("sample_tokens", 0.0) - r.get("sampler", 0.0) + r.get("update", 0.0)


def fit_engine(engine: dict) -> dict:
    """Per-step CPU = fixed + per scheduled request + per waiting request (+ admitting); the whole step for the replay.

    Warm pass only. The whole step's wall time (the CPU build's model included) is fitted as fixed + per
    scheduled request + per scheduled token: the replay's step model for this build, not a GPU's.
    """
    steps = [r for r in engine["records"] if r["repeat"] == 1]
    x = [[1.0, r["scheduled"], r["waiting"], float(r["new"] > 0), r["new"]] for r in steps]
    cpu = linear_fit(x, [engine_cpu(r) for r in steps])
    wall = non_negative_fit([[1.0, r["scheduled"], r["tokens"]] for r in steps], [r["wall"] for r in steps])
    adds = [a for a in engine["adds"] if a["repeat"] == 1]
    per_add = sum(a["core_add_s"] for a in adds) / sum(a["n"] for a in adds)
    per_add_total = sum(a["total_s"] for a in adds) / sum(a["n"] for a in adds)
    by_waiting: dict[str, list[float]] = {}
    for r in steps:
        if r["new"] == 0 and r["scheduled"] == MAX_NUM_SEQS:
            band = "0" if r["waiting"] == 0 else f"{100 * (r['waiting'] // 100)}+"
            by_waiting.setdefault(band, []).append(engine_cpu(r))
    return {
        "step_s": cpu[0],
        "per_scheduled_request_s": cpu[1],
        "per_waiting_request_s": cpu[2],
        "admit_step_s": cpu[3],
        "per_admitted_request_s": cpu[4],
        "core_add_per_request_s": per_add,
        "add_per_request_in_process_s": per_add_total,
        "full_batch_decode_cpu_ms_by_waiting": {k: round(1e3 * statistics.median(v), 3) for k, v in by_waiting.items()},
        "build_step_wall": {"fixed_s": wall[0], "per_request_s": wall[1], "per_token_s": wall[2]},
        "steps": len(steps),
    }


def non_negative_fit(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0 (scipy's nnls): a step's fixed, per-request and per-token times
    cannot be negative, and an unconstrained fit of noisy steps can give a negative intercept, which prices a small
    step below zero. Where the unconstrained fit is non-negative, this is the same fit."""
    import numpy as np
    from scipy.optimize import nnls

    return [float(c) for c in nnls(np.array(rows, float), np.array(ys, float))[0]]


# -- 2. the API server, as served ------------------------------------------------------------------------


def burst_row(kind: str, shape: str, n: int, concurrency: int, res: dict, m0: dict, m1: dict, api_pid: int) -> dict:
    """One load: the client's figures, vLLM's own, and the event loop's CPU; keeps every request's times."""
    rows = res["rows"]
    t0 = min(r["send"] for r in rows)
    api = res["cpu"][str(api_pid)]
    loop = sum(v for k, v in api.items() if k.endswith(f"/{api_pid}"))

    def server_mean(metric: str) -> float | None:
        count = m1.get(metric + "_count", 0) - m0.get(metric + "_count", 0)
        return 1e3 * (m1.get(metric + "_sum", 0) - m0.get(metric + "_sum", 0)) / count if count else None

    multi = [r for r in rows if r["output_tokens"] > 1]
    return {
        "kind": kind,
        "shape": shape,
        "n": n,
        "concurrency": concurrency,
        "wall_s": res["wall_s"],
        "requests_per_s": n / (max(r["end"] for r in rows) - t0),
        "mean_ttft_ms": 1e3 * statistics.mean(r["first"] - r["send"] for r in rows),
        "mean_tpot_ms": 1e3 * statistics.mean((r["end"] - r["first"]) / (r["output_tokens"] - 1) for r in multi)
        if multi
        else None,
        "vllm_ttft_ms": server_mean(LATENCY_METRICS["vllm_ttft"]),
        "queue_ms": server_mean(LATENCY_METRICS["queue"]),
        "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in rows),
        "output_tokens": statistics.mean(r["output_tokens"] for r in rows),
        "chunks_per_request": statistics.mean(r["chunks"] for r in rows),
        "engine_steps": m1.get(STEPS_METRIC, 0.0) - m0.get(STEPS_METRIC, 0.0),
        "loop_cpu_s": loop,
        "api_other_threads_cpu_s": sum(api.values()) - loop,
        "engine_processes_cpu_s": sum(sum(t.values()) for pid, t in res["cpu"].items() if pid != str(api_pid)),
        "client_cpu_s": res["client_cpu_s"],
        "requests": [
            [
                round(r["send"] - t0, 6),
                round(r["first"] - t0, 6),
                round(r["end"] - t0, 6),
                r["prompt_tokens"],
                r["output_tokens"],
                r["chunks"],
            ]
            for r in rows
        ],
    }


LOADS = [("burst", shape, n, n) for shape in SHAPES for n in BURST_SIZES] + [
    ("steady", "128/4", n, c) for c, n in STEADY
]
"""(kind, shape, requests, concurrency) of every served load, in the order served."""


class AttachedProbe(ApiProbe):
    """ApiProbe on a vLLM CPU server started elsewhere (the test suite's fixture), pinned the same way."""

    def __init__(self, vllm_python: Path, base_url: str, api_pid: int, served_model_name: str) -> None:
        from types import SimpleNamespace

        self.vllm_python, self.server = vllm_python, SimpleNamespace(base_url=base_url, pid=api_pid)
        self.rng, self.client_core, self.served_model_name = random.Random(0), 0, served_model_name

    def __enter__(self) -> AttachedProbe:
        self.pin()
        return self

    def __exit__(self, *exc) -> None:
        self.unpin()


def serve_loads(probe: ApiProbe, loads: list[tuple[str, str, int, int]], repeats: int, deadline_s: float) -> list[dict]:
    """Every load `repeats` times after a warm-up, the client pinned beside the API server (core 0).

    Core 1 is the engine core's and its busy-polling model worker's: a client starved there sends late and
    reads late, which client TTFT would count as the server's (served with the client on core 1, the same
    bursts ran at 0.6-0.7x the throughput with twice the repeat-to-repeat spread).
    """
    probe.client_core = 0
    t_start = time.monotonic()
    probe.load(21, 4, True, 64, 16, deadline_s)  # warm-up
    out: list[dict] = []
    for repeat in range(repeats):
        for kind, shape, n, concurrency in loads:
            words, max_tokens = SHAPES[shape]
            m0 = probe.metrics()
            res = probe.load(words, max_tokens, True, n, concurrency, deadline_s)
            row = burst_row(kind, shape, n, concurrency, res, m0, probe.metrics(), probe.api_pid)
            out.append({**row, "repeat": repeat})
            print(
                f"  {kind} {shape} n={n} c={concurrency}: {row['requests_per_s']:.1f} req/s, TTFT "
                f"{row['mean_ttft_ms']:.0f} ms (vLLM {row['vllm_ttft_ms']:.0f}), TPOT {row['mean_tpot_ms'] or 0:.1f} "
                f"ms, "
                f"loop {1e3 * row['loop_cpu_s'] / n:.2f} ms/req, steps {row['engine_steps']:.0f}",
                file=sys.stderr,
                flush=True,
            )
            if time.monotonic() - t_start > deadline_s:
                raise SystemExit("served measurement ran past its time limit")
    return out


def measure_served(vllm_python: Path, model_dir: Path, deadline_s: float, repeats: int) -> list[dict]:
    log = Path("/tmp") / f"burst-costs-{os.getpid()}.log"
    with ApiProbe(vllm_python, model_dir, log) as probe:
        return serve_loads(probe, LOADS, repeats, deadline_s)


# -- 3. the replay (servelab's venv) --------------------------------------------------------------------


class BuildStep:
    """The CPU build's engine step as part 1 timed it, times the served engine's factor (a CostModel).

    The replay's stand-in for a GPU's step: fixed + per scheduled request + per scheduled token.
    """

    def __init__(self, fit: dict, served_factor: float = 1.0) -> None:
        self.fixed, self.per_token = served_factor * fit["fixed_s"], served_factor * fit["per_token_s"]
        self.per_request = served_factor * fit["per_request_s"]

    def step_time(self, batch) -> float:
        requests = len(batch.prefill_chunks) + len(batch.decode_contexts)
        return self.fixed + self.per_request * requests + self.per_token * batch.num_tokens

    def wake_time(self, idle_s: float) -> float:
        return 0.0


def fit_api(raw: dict, with_client: bool = False):
    """The API server's core over every served load: per request + per SSE chunk + per engine step + per output token.

    Fitted to the event loop's CPU (non-negative least squares); with `with_client`, to the loop's plus the load
    generator's, which shares that core here (pinned beside the API server), so the replay charges both to the one core.
    The latency on no core (thread hand-offs, ZMQ hops) is the data file's, scaled by the reference loops' ratio
    (a burst's TTFT is seconds, this is milliseconds). Returns (ApiServerCosts, the fit as a dict).
    """
    from servelab.perf.vllm_cpu_costs import ApiServerCosts, measured

    rows = raw["served"]
    x = [[r["n"], sum(q[5] for q in r["requests"]), r["engine_steps"], sum(q[4] for q in r["requests"])] for r in rows]
    y = [r["loop_cpu_s"] + (r["client_cpu_s"] if with_client else 0.0) for r in rows]
    import numpy as np
    from scipy.optimize import nnls

    per_request, per_chunk, per_step, per_token = (float(c) for c in nnls(np.array(x, float), np.array(y))[0])
    file = measured().api_server(raw["reference_s"] / measured().reference_loop_s)
    costs = ApiServerCosts(
        per_request_s=per_request,
        per_output_token_s=per_token,
        per_chunk_s=per_chunk,
        per_output_step_s=per_step,
        latency_s=file.latency_s,
        latency_per_prompt_token_s=file.latency_per_prompt_token_s,
    )
    residuals = [
        sum(c * v for c, v in zip((per_request, per_chunk, per_step, per_token), xi)) / yi - 1 for xi, yi in zip(x, y)
    ]
    return costs, {
        "per_request_s": per_request,
        "per_chunk_s": per_chunk,
        "per_engine_step_s": per_step,
        "per_output_token_s": per_token,
        "max_relative_residual": max(map(abs, residuals)),
    }


def per_request_api(raw: dict):
    """The API server's core when the loads have one shape (per-token and per-request work cannot be told apart):
    the mean CPU per request of the event loop and of the load generator, which shares that core here (pinned
    beside it), all charged at intake, and the data file's no-core latency."""
    from servelab.perf.vllm_cpu_costs import ApiServerCosts, measured

    file = measured().api_server(raw["reference_s"] / measured().reference_loop_s)
    per_request = statistics.mean((r["loop_cpu_s"] + r["client_cpu_s"]) / r["n"] for r in raw["served"])
    return ApiServerCosts(
        per_request_s=per_request, latency_s=file.latency_s, latency_per_prompt_token_s=file.latency_per_prompt_token_s
    )


def replay(row: dict, engine_fit: dict, api, served_factor: float = 1.0) -> dict:
    """`row`'s own requests (their measured prompt and output lengths) served by SimTarget: req/s, mean TTFT, TPOT."""
    from servelab.metrics.summary import summarize

    sink, target = replay_records(row, engine_fit, api, served_factor)
    s = summarize(sink.records).model_dump(exclude_unset=True)
    counters = [e.counters for e in target.last_engines]
    engine_ttft_ms = 1e3 * sum(c.ttft_sum for c in counters) / sum(c.ttft_count for c in counters)
    return {
        "requests_per_s": s["request_throughput"],
        "mean_ttft_ms": s["mean_ttft_ms"],
        "mean_tpot_ms": s["mean_tpot_ms"],
        "api_ttft_ms": s["mean_ttft_ms"] - engine_ttft_ms,
    }


def replay_records(row: dict, engine_fit: dict, api, served_factor: float = 1.0):
    """`row`'s own requests served by SimTarget as the CPU build was configured: (the records' sink, the target)."""
    import numpy as np

    from servelab.metrics.records import MemorySink
    from servelab.perf.engine_config import EngineConfig
    from servelab.targets.sim import SimTarget
    from servelab.workload.spec import LoadPlan, RequestSpec

    config = EngineConfig(
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        enable_prefix_caching=False,
        async_scheduling=False,
        max_model_len=4096,
    )
    rng = np.random.default_rng(0)
    specs = [
        RequestSpec(index=i, prompt_ids=rng.integers(10, 4000, size=int(r[3])), max_tokens=int(r[4]))
        for i, r in enumerate(row["requests"])
    ]
    step = BuildStep(engine_fit["build_step_wall"], served_factor)
    concurrency = None if row["kind"] == "burst" else row["concurrency"]
    sink = MemorySink()
    target = SimTarget(config, 200_000, step, api=api)
    target.run(LoadPlan(specs, max_concurrency=concurrency), sink)
    return sink, target


def fit_served_factor(raw: dict, api, rows: list[dict] | None = None) -> float:
    """How much slower the served engine's step is than the in-process one, from the steady loads only.

    Served, the CPU build's model runs in a worker process whose shared-memory reader busy-polls on the
    engine core's own core, and the engine core's input and output threads (de)serialize every request and
    step there too: one factor on part 1's step, fitted to the steady closed loops' request throughput
    (scipy), so that the bursts, the loads this benchmark is about, stay held out; or to `rows`.
    """
    from scipy.optimize import minimize_scalar

    engine_fit = fit_engine(raw["engine"])
    steady = rows if rows is not None else [r for r in raw["served"] if r["kind"] == "steady"]

    def loss(k: float) -> float:
        return sum((replay(r, engine_fit, api, k)["requests_per_s"] / r["requests_per_s"] - 1) ** 2 for r in steady)

    return float(minimize_scalar(loss, bounds=(1.0, 5.0), method="bounded", options={"xatol": 0.01}).x)


ONE_BURST = ("burst", "128/4", 300, 300)
"""The one-shape check's burst: 300 requests of 128 in / 4 out, all released at once."""


def one_burst_check(engine: dict, bursts: list[dict], reference_s: float) -> dict:
    """The CPU-side model against one burst shape served several times, with everything from this session.

    The API server's core per request comes from these bursts (one shape, so all of it charged at intake), and
    the served engine's factor from their request throughput (the CPU build's engine pace is not the CPU side):
    their mean TTFT, which the intake queue and its sharing with the output rounds decide, is what is compared,
    against the larger of the repeats' own spread and the moderate bursts' recorded noise.
    """
    from servelab.perf.vllm_cpu_costs import burst_noise

    raw = {"engine": engine, "served": bursts, "reference_s": reference_s}
    api = per_request_api(raw)
    factor = fit_served_factor(raw, api, bursts)
    predicted = replay(bursts[0], fit_engine(engine), api, factor)
    measured = statistics.mean(r["mean_ttft_ms"] for r in bursts)
    return {
        "predicted_ttft_ms": predicted["mean_ttft_ms"],
        "measured_ttft_ms": measured,
        "repeats_ttft_ms": [r["mean_ttft_ms"] for r in bursts],
        "error": predicted["mean_ttft_ms"] / measured - 1,
        "noise": max(repeat_spread(bursts, "mean_ttft_ms"), burst_noise()["mean_ttft_ms"]),
        "served_factor": factor,
        "api_per_request_ms": 1e3 * api.per_request_s,
    }


def measure_one_burst(vllm_python: Path, model_dir: Path, deadline_s: float, repeats: int) -> dict:
    """`one_burst_check` on a server this script starts: the engine timed in process, then the burst served."""
    engine = measure_engine(vllm_python, model_dir, deadline_s, sizes=(ONE_BURST[2],), shapes=(ONE_BURST[1],))
    log = Path("/tmp") / f"burst-costs-{os.getpid()}.log"
    with ApiProbe(vllm_python, model_dir, log) as probe:
        bursts = serve_loads(probe, [ONE_BURST] * repeats, 1, deadline_s)
    return one_burst_check(engine, bursts, reference_loop_s(repeats=2))


def repeat_spread(rows: list[dict], metric: str) -> float:
    """The largest relative deviation of one repeat of a load from the repeats' mean: the measurement's own noise."""
    vals = [r[metric] for r in rows]
    mean = statistics.mean(vals)
    return max(abs(v / mean - 1) for v in vals)


def api_ttft(row: dict) -> float:
    """The API server's part of the mean TTFT: client TTFT less vLLM's own (from the request's arrival in AsyncLLM)."""
    return row["mean_ttft_ms"] - row["vllm_ttft_ms"]


def table(raw: dict, models: dict, served_factor: float) -> str:
    """Markdown: each load's measured mean (and range over repeats) against every model's replay of its requests."""
    engine_fit = fit_engine(raw["engine"])
    groups: dict[tuple, list[dict]] = {}
    for row in raw["served"]:
        groups.setdefault((row["kind"], row["shape"], row["n"], row["concurrency"]), []).append(row)
    names = list(models)
    head = "| load | metric | measured (range) | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (3 + len(names))]
    for (kind, shape, n, c), rows in groups.items():
        sims = {name: replay(rows[0], engine_fit, api, served_factor) for name, api in models.items()}
        label = f"{kind} {shape} n={n}" + (f" c={c}" if kind != "burst" else "")
        for metric, fmt in (
            ("requests_per_s", "{:.1f}"),
            ("mean_ttft_ms", "{:.0f}"),
            ("mean_tpot_ms", "{:.1f}"),
            ("api_ttft_ms", "{:.0f}"),
        ):
            vals = [api_ttft(r) if metric == "api_ttft_ms" else r[metric] for r in rows]
            vals = [v for v in vals if v is not None]
            if not vals:
                continue
            m = statistics.mean(vals)
            cells = [f"{fmt.format(sims[k][metric])} ({100 * (sims[k][metric] / m - 1):+.0f}%)" for k in names]
            lines.append(
                f"| {label} | {metric} | {fmt.format(m)} ({fmt.format(min(vals))}-{fmt.format(max(vals))}) | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


MODERATE = (200, 500)
"""Burst sizes whose repeat spread is recorded as the measurement's noise (the one-burst check's bound)."""


def bursts_section(raw: dict) -> dict:
    """The data file's `bursts` section: what grows with requests in flight, and the bursts' own noise."""
    engine = fit_engine(raw["engine"])
    api, api_fit = fit_api(raw)
    groups: dict[tuple, list[dict]] = {}
    for r in raw["served"]:
        groups.setdefault((r["kind"], r["shape"], r["n"]), []).append(r)
    moderate = [rows for (kind, _, n), rows in groups.items() if kind == "burst" and n in MODERATE and len(rows) > 1]
    return {
        "measured_at": raw["measured_at"],
        "command": "flock-guarded: .venv/bin/python benchmarks/burst_costs.py --raw burst.json (refit: --from-raw)",
        "reference_loop_s": round(raw["reference_s"], 4),
        "engine_core": {
            "per_waiting_request_s": engine["per_waiting_request_s"],
            "full_batch_decode_cpu_ms_by_waiting": engine["full_batch_decode_cpu_ms_by_waiting"],
            "core_add_per_request_s": engine["core_add_per_request_s"],
            "note": "per-step CPU (schedule + output bookkeeping + update) against running and waiting counts, 2,000 "
            "requests added at once, max_num_seqs 256: no growth with the waiting queue, so none is charged",
        },
        "api_server_loop": {
            **api_fit,
            "note": "event-loop CPU over every served load of this host (non-negative least "
            "squares); per request it grows by 15-20% from 200 to 2,000 in flight "
            "(loop_ms_per_request), not with the count as such",
        },
        "loop_ms_per_request": {
            f"{k} {s} n={n}": round(1e3 * statistics.mean(r["loop_cpu_s"] / r["n"] for r in rows), 3)
            for (k, s, n), rows in groups.items()
        },
        "repeat_noise": {
            m: round(max(repeat_spread(rows, m) for rows in moderate), 3)
            for m in ("requests_per_s", "mean_ttft_ms", "mean_tpot_ms")
        },
    }


def write_bursts(out: Path, raw: dict) -> None:
    """Replace the data file's `bursts` section, keeping everything else."""
    import yaml

    from cpu_side_costs import write_yaml

    doc = yaml.safe_load(out.read_text())
    doc["bursts"] = bursts_section(raw)
    write_yaml(out, doc)


# -- entry point ------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=",".join(map(str, BURST_SIZES)), help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=900.0, help="time limit of each part, seconds")
    ap.add_argument("--repeats", type=int, default=SERVED_REPEATS, help="passes over the served loads")
    ap.add_argument("--vllm-python", type=Path, default=CACHE / "vllm-venv" / "bin" / "python")
    ap.add_argument("--model-dir", type=Path, default=CACHE / "tiny-model")
    ap.add_argument("--raw", type=Path, help="write the raw measurements as JSON here (refused if it exists)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "servelab/perf/data/vllm_cpu_costs.yaml",
        help="the data file whose `bursts` section is rewritten",
    )
    ap.add_argument("--from-raw", type=Path, help="refit and replay raw measurements written by --raw")
    ap.add_argument("--engine-from", type=Path, help="reuse part 1's output (the engine worker's JSON) from this file")
    ap.add_argument(
        "--one-burst",
        action="store_true",
        help="only the one-shape check: one burst of 300 (128 in / 4 out) served --repeats times, replayed",
    )
    args = ap.parse_args()
    if args.one_burst:
        with heavy_lock():
            check = measure_one_burst(args.vllm_python, args.model_dir, args.deadline, max(args.repeats, 3))
        print(json.dumps(check, indent=2))
        return
    if args.engine_worker:
        engine_worker(
            args.engine_worker, args.deadline, tuple(map(int, args.sizes.split(","))), tuple(args.shapes.split(","))
        )
        return
    if args.from_raw:
        import gzip

        opened = gzip.open if args.from_raw.suffix == ".gz" else open
        with opened(args.from_raw, "rt") as fh:
            raw = json.load(fh)
    else:
        if args.raw and args.raw.exists():
            raise SystemExit(f"--raw {args.raw} exists; give another path (measurements are never overwritten)")
        reference = reference_loop_s()
        with heavy_lock():
            engine = (
                json.loads(args.engine_from.read_text().strip().splitlines()[-1])
                if args.engine_from
                else measure_engine(args.vllm_python, args.model_dir, args.deadline)
            )
            print(f"engine core: {json.dumps(fit_engine(engine))}", file=sys.stderr, flush=True)
            served = measure_served(args.vllm_python, args.model_dir, args.deadline, args.repeats)
        raw = {
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "reference_s": reference,
            "engine": engine,
            "served": served,
        }
        if args.raw:
            args.raw.write_text(json.dumps(raw))
    write_bursts(args.out, raw)
    api, _ = fit_api(raw)
    factor = fit_served_factor(raw, api)
    print(f"served engine factor {factor:.2f} (steady loads); replay of every load:\n")
    print(table(raw, {"simulated": api}, factor))


if __name__ == "__main__":
    main()
