"""How fast the simulator runs, against the code before a change, in the same run.

Workloads (one A100-80GB serving Qwen2.5-7B with vLLM's defaults and the default cost model, API server modelled,
timeline sampled every simulated second, as `servelab simulate` runs it):

- `rate5`:  10,000 requests of 1,500 in / 200 out, Poisson at 5 req/s (under capacity);
- `rate10`: the same at 10 req/s (overloaded: the queue grows through the run);
- `trace`:  a 100,000-request trace (gamma-bursty arrivals at 6 req/s, prompts 200-2,800 tokens, outputs 20-380),
  its requests generated lazily and its records reduced to a digest as they arrive, so that peak memory is the
  simulator's and not the workload's.

Each (workload, code) pair runs in its own process, the codes alternating and swapping order every repeat, so
that the ratio sees the same neighbours on this shared machine. The times are CPU (process) time of
`SimTarget.run` alone; peak RSS is the worker process's (imports and workload included; `rss before` is what it
held when the run started). Digests cover every record (times, tokens, preemptions), every timeline
sample and the run's statistics (span, engine busy time), apart. `--step-by-step` adds the new code run one
engine step at a time (no fast path): the reference whose records, timeline and statistics the new code must
reproduce exactly; the baseline should agree too, or the change says why.

    flock /tmp/servelab-heavy.lock .venv/bin/python benchmarks/sim_speed.py --baseline /tmp/base [--repeat 3]

`--baseline DIR` is a directory holding the older `servelab` package (e.g. `git archive COMMIT servelab | tar -x
-C DIR`); without it only the current code runs. `--worker` is the per-process entry point the driver calls;
with it, `--profile` prints a cProfile of the run and `--breakdown` the time of each kind of event handler (engine
steps that ran `schedule()`, decode runs, step ends, output rounds, releases...), both to stderr:

    PYTHONPATH=. .venv/bin/python benchmarks/sim_speed.py --worker rate5 --breakdown
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
CURRENT = HERE.parent.parent
WORKLOADS = ("rate5", "rate10", "trace")


def poisson_requests(n: int, rate: float, prompt_len: int, output_len: int, seed: int) -> Iterator[Any]:
    from servelab.workload.spec import RequestSpec

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    for i in range(n):
        yield RequestSpec(i, rng.integers(0, 150_000, prompt_len, dtype=np.int32), output_len, float(arrivals[i]))


def trace_requests(n: int, seed: int) -> Iterator[Any]:
    """A replayed trace: bursty timestamps (gamma, shape 0.5, mean 6 req/s) and spread lengths, made lazily."""
    from servelab.workload.spec import RequestSpec

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.gamma(0.5, 1.0 / (6.0 * 0.5), n))
    inputs = rng.integers(200, 2_800, n)
    outputs = rng.integers(20, 380, n)
    for i in range(n):
        prompt = rng.integers(0, 150_000, int(inputs[i]), dtype=np.int32)
        yield RequestSpec(i, prompt, int(outputs[i]), float(arrivals[i]))


class _DigestSink:
    """Keeps, per record, a few numbers and a hash of its token times: the records' identity at little memory."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def write(self, rec: Any) -> None:
        self.rows.append(
            (
                rec.index,
                rec.status,
                rec.send_time,
                rec.first_token_time,
                rec.finish_time,
                rec.output_tokens,
                rec.preemptions,
                len(rec.chunk_times),
                hash(tuple(rec.chunk_times)),
            )
        )


class _Breakdown:
    """Time (perf_counter) of the simulation's event handlers by kind; a handler called inside another is counted in
    the outer one. `_begin` is split by what the engine did: one `schedule()` step or a decode run, and for a run
    whether the step before it finished a request (a run that could have gone on through that finish)."""

    HANDLERS = ("_release", "_arrive", "_take_in", "_admit", "_begin", "_end", "_round", "_deliver", "_scrape_until")

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._inside = False
        self._finished = False

    def install(self) -> None:
        """Wrap the handlers of whichever `servelab` is importable (the new code's or the baseline's)."""
        from servelab.sim.engine import SimEngine
        from servelab.targets.sim import _Simulation

        for name in self.HANDLERS:
            setattr(_Simulation, name, self._timed(name, getattr(_Simulation, name)))
        finish_step = SimEngine.finish_step

        def noting_finishes(engine: Any) -> Any:
            finished = finish_step(engine)
            self._finished = bool(finished)
            return finished

        SimEngine.finish_step = noting_finishes  # type: ignore[method-assign]

    def _timed(self, name: str, handler: Any) -> Any:
        def timed(sim: Any, *args: Any) -> Any:
            if self._inside:
                return handler(sim, *args)
            after_finish, self._inside = self._finished, True
            t0 = time.perf_counter()
            try:
                return handler(sim, *args)
            finally:
                spent = time.perf_counter() - t0
                self._inside = False
                key = self._begin_kind(sim.engines[args[0]], after_finish) if name == "_begin" else name
                self.spent[key] = self.spent.get(key, 0.0) + spent
                self.calls[key] = self.calls.get(key, 0) + 1

        return timed

    @staticmethod
    def _begin_kind(engine: Any, after_finish: bool) -> str:
        if engine.decode_run is None:
            return "_begin: schedule()"
        return "_begin: decode run after a finish" if after_finish else "_begin: decode run"

    def print(self, total: float, requests: int) -> None:
        print(f"{'handler':<34} {'calls':>8} {'s':>7} {'share':>6} {'us/call':>8} {'us/request':>10}", file=sys.stderr)
        for key in sorted(self.spent, key=self.spent.__getitem__, reverse=True):
            s, n = self.spent[key], self.calls[key]
            row = f"{key:<34} {n:8d} {s:7.3f} {s / total:6.1%} {1e6 * s / n:8.1f} {1e6 * s / requests:10.1f}"
            print(row, file=sys.stderr)
        rest = total - sum(self.spent.values())
        print(f"{'(the loop itself, heap pops)':<34} {'':>8} {rest:7.3f} {rest / total:6.1%}", file=sys.stderr)


def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def worker(
    name: str, requests: int | None, profile: bool, step_by_step: bool, breakdown: bool = False
) -> dict[str, Any]:
    """Run one workload on whichever `servelab` is importable; returns the measurements as a dict."""
    import servelab
    from servelab.targets.deployment import build_deployment
    from servelab.workload.spec import LoadPlan

    if name == "trace":
        specs = trace_requests(requests or 100_000, seed=1)
    else:
        specs = poisson_requests(requests or 10_000, 5.0 if name == "rate5" else 10.0, 1500, 200, seed=0)
    target = build_deployment("a100-80gb", "qwen2.5-7b").sim_target()
    target.fast_forward = not step_by_step
    sink = _DigestSink()
    samples: list[Any] = []
    profiler = cProfile.Profile() if profile else None
    handlers = _Breakdown() if breakdown else None
    if handlers:
        handlers.install()
    rss_before = _rss_kib()
    c0, t0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    run = target.run(LoadPlan(specs), sink, samples.append)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if handlers:
        handlers.print(wall, len(sink.rows))
    records = hashlib.sha256(repr(sink.rows).encode())
    stats = hashlib.sha256(repr((run.duration, run.client_stats)).encode())
    timeline = hashlib.sha256()
    for s in samples:
        timeline.update(repr((s.t, sorted(s.values.items()))).encode())
    return {
        "workload": name,
        "requests": len(sink.rows),
        "cpu_s": cpu,
        "wall_s": wall,
        "steps": run.client_stats["engine_steps"],
        "simulated_s": run.duration,
        "samples": len(samples),
        "rss_before_mib": rss_before / 1024,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "records": records.hexdigest()[:12],
        "timeline": timeline.hexdigest()[:12],
        "stats": stats.hexdigest()[:12],
        "code": str(Path(servelab.__file__).parent.parent),
    }


def _spawn(code: Path, name: str, requests: int | None, step_by_step: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE), "--worker", name] + (["--step-by-step"] if step_by_step else [])
    if requests:
        cmd += ["--requests", str(requests)]
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result = dict(json.loads(out.strip().splitlines()[-1]))
    if Path(result["code"]).resolve() != code.resolve():
        raise SystemExit(f"the worker imported servelab from {result['code']}, not {code}")
    return result


def _row(label: str, r: dict[str, Any]) -> str:
    return (
        f"  {label:<12} CPU {r['cpu_s']:7.2f} s  {r['simulated_s'] / r['cpu_s']:8,.0f} sim s/CPU s  "
        f"{r['steps'] / r['cpu_s']:9,.0f} steps/s  peak RSS {r['peak_rss_mib']:6.0f} MiB "
        f"(before run {r['rss_before_mib']:5.0f})  records {r['records']} timeline {r['timeline']} stats {r['stats']}"
    )


def drive(baseline: Path | None, workloads: list[str], repeat: int, requests: int | None, reference: bool) -> None:
    codes = {"new": CURRENT} | ({"baseline": baseline} if baseline else {})
    runs = list(codes) + (["step-by-step"] if reference else [])
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in range(repeat):
        for name in workloads:
            order = runs if r % 2 == 0 else runs[::-1]
            for label in order:
                res = _spawn(codes.get(label, CURRENT), name, requests, step_by_step=label == "step-by-step")
                key = (name, label)
                if key not in best or res["cpu_s"] < best[key]["cpu_s"]:
                    best[key] = res
    print(f"best of {repeat}, CPU time of SimTarget.run; baseline: {baseline or '(none)'}")
    for name in workloads:
        new = best[(name, "new")]
        print(f"{name}: {new['requests']} requests, {new['steps']} engine steps, {new['simulated_s']:.0f} s simulated")
        for label in runs:
            print(_row(label, best[(name, label)]))
        for label in runs[1:]:
            other = best[(name, label)]
            same = [part for part in ("records", "timeline", "stats") if other[part] == new[part]]
            ratio = other["cpu_s"] / new["cpu_s"]
            print(f"  new vs {label}: {ratio:.2f}x faster; the same {' and '.join(same) or 'nothing'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="directory holding the older servelab package to compare against")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--requests", type=int, help="override every workload's request count (quick looks)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per (workload, code); the best CPU time is kept")
    ap.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="with --worker: cProfile the run (to stderr)")
    ap.add_argument(
        "--breakdown", action="store_true", help="with --worker: time of each kind of event handler (to stderr)"
    )
    ap.add_argument(
        "--step-by-step",
        action="store_true",
        help="also run the new code one engine step at a time (the fast path's reference: its results are "
        "the ones to match); with --worker: run that way",
    )
    args = ap.parse_args()
    if (args.profile or args.breakdown) and not args.worker:
        ap.error("--profile and --breakdown go with --worker NAME (one workload in this process)")
    if args.worker:
        print(json.dumps(worker(args.worker, args.requests, args.profile, args.step_by_step, args.breakdown)))
        return
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    if args.baseline and not (args.baseline / "servelab" / "__init__.py").is_file():
        ap.error(f"--baseline {args.baseline}: no servelab package there")
    drive(args.baseline, workloads, max(1, args.repeat), args.requests, args.step_by_step)


if __name__ == "__main__":
    main()
