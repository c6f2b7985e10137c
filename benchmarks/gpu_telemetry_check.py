"""Does `bench`'s GPU telemetry read a real GPU? One command on a GPU host, under five minutes.

The tests cannot show this: there is no GPU where they run, so NVML is
replaced at its library boundary there (tests/test_gpu_telemetry.py). This
script runs the real path instead: the same MetricsScraper and NVML sampler
`bench` uses, scraping a stand-in server /metrics served from this process,
writing timeline.jsonl through the same ResultWriter, while GPU 0 idles, then
multiplies matrices, then idles again. It checks

- the columns are in the timeline, per GPU index (utilisation, SM clock,
  memory used/free, temperature, clock-event reasons; power when the GPU
  reports it), in the same rows as the server's metrics;
- utilisation rises under the load: GPU 0's mean during the matmuls is at
  least 0.5 and 0.2 above its idle mean; memory used rises by what the load
  allocated.

The load is torch's or cupy's (whichever is installed); with neither, only the
sampling is checked and the script says so. No GPU (no driver, no device): a
clear message and exit code 2, nothing else.

    python benchmarks/gpu_telemetry_check.py [--load-s 20] [--idle-s 5] [--interval 0.5] [--out DIR]

Exit codes: 0 all checks passed; 1 a check failed (the table says which); 2 no GPU here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pynvml

from servelab.metrics import gpu
from servelab.metrics.gpu import GpuTelemetry, gpu_key, gpu_sampler
from servelab.metrics.results import ResultWriter
from servelab.metrics.scrape import MetricsScraper
from servelab.metrics.timeline import RUNNING, TimelineSample, read_timeline
from servelab.schemas.results import RunInfo

REQUIRED = (gpu.UTIL, gpu.SM_CLOCK_MHZ, gpu.MEM_USED_BYTES, gpu.MEM_FREE_BYTES, gpu.TEMPERATURE_C, gpu.THROTTLE_REASONS)
LOADED_UTIL = 0.5
UTIL_RISE = 0.2
SERVER_METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 0.0\n'


def gpu_count() -> int:
    """Local NVIDIA GPUs; 0 when there is no driver or no device."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


class _Server(BaseHTTPRequestHandler):
    """A stand-in for the server's /metrics, so the rows are the merged rows `bench` writes."""

    def do_GET(self) -> None:
        body = SERVER_METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def metrics_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


Load = Callable[[threading.Event, threading.Event], int]
"""Multiplies matrices on GPU 0, sets the first event once it computes, stops at the second; returns bytes held."""


def matmul_load() -> tuple[str, Load] | None:
    """(library, the load: 8192^2 fp16 matmuls on GPU 0); None when neither torch with CUDA nor cupy is installed."""
    try:
        import torch

        if torch.cuda.is_available():

            def run_torch(started: threading.Event, stop: threading.Event) -> int:
                a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
                b = torch.randn_like(a)
                c = a @ b
                torch.cuda.synchronize()
                started.set()
                while not stop.is_set():
                    for _ in range(8):
                        c = a @ b
                    torch.cuda.synchronize()
                return 3 * c.numel() * c.element_size()

            return "torch", run_torch
    except ImportError:
        pass
    try:
        import cupy

        def run_cupy(started: threading.Event, stop: threading.Event) -> int:
            with cupy.cuda.Device(0):
                a = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
                b = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
                c = a @ b
                cupy.cuda.Device(0).synchronize()
                started.set()
                while not stop.is_set():
                    for _ in range(8):
                        c = a @ b
                    cupy.cuda.Device(0).synchronize()
                return 3 * c.nbytes

        return "cupy", run_cupy
    except ImportError:
        return None


async def sample_phases(
    url: str,
    writer: ResultWriter,
    interval: float,
    idle_s: float,
    load_s: float,
    load: Load | None,
) -> tuple[dict[str, tuple[float, float]], int, dict]:
    """Scrape through idle, load, idle; returns each phase's run-time span, the bytes the load held, scraper stats."""
    zero = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - zero

    phases: dict[str, tuple[float, float]] = {}
    held = 0
    async with aiohttp.ClientSession() as session, gpu_sampler(GpuTelemetry(), session) as sampler:
        scraper = MetricsScraper(session, url, clock, writer.write_sample, interval, gpu=sampler)
        stop_scraping = asyncio.Event()
        scraping = asyncio.create_task(scraper.run(stop_scraping))
        await scraper.sample_once()
        await asyncio.sleep(idle_s)
        phases["idle before"] = (0.0, clock())
        if load is not None:
            started, stop_load = threading.Event(), threading.Event()
            worker = asyncio.create_task(asyncio.to_thread(load, started, stop_load))
            # CUDA context creation and the first kernels' loading take seconds at 0% utilisation: not the load.
            if not await asyncio.to_thread(started.wait, 120.0):
                stop_load.set()
                raise RuntimeError("the matmul load did not start within 120 s")
            start = clock()
            await asyncio.sleep(load_s)
            stop_load.set()
            held = await worker
            phases["load"] = (start + interval, clock())
            start = clock()
            await asyncio.sleep(idle_s)
            phases["idle after"] = (start + 2 * interval, clock())
        stop_scraping.set()
        await scraping
        await scraper.sample_once()
        return phases, held, scraper.stats()


def cell(value: float | None, scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value / scale)


def mean_in(samples: list[TimelineSample], name: str, span: tuple[float, float]) -> float | None:
    seen = [s.values[name] for s in samples if span[0] <= s.t <= span[1] and name in s.values]
    return sum(seen) / len(seen) if seen else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--load-s", type=float, default=20.0)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="where timeline.jsonl goes (default: a temp dir)")
    args = parser.parse_args()
    n = gpu_count()
    if n == 0:
        print(
            "no NVIDIA GPU here (NVML finds no driver or no device): nothing to check; run this on a GPU host",
            file=sys.stderr,
        )
        return 2
    load = matmul_load()
    no_load = "none (neither torch with CUDA nor cupy is installed: sampling only)"
    print(f"{n} GPU(s); load: {load[0] + ' fp16 8192^2 matmuls on GPU 0' if load else no_load}")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-telemetry-"))
    writer = ResultWriter(out, RunInfo.begun(verb="gpu_telemetry_check"))
    with metrics_server() as url:
        phases, held, stats = asyncio.run(
            sample_phases(url, writer, args.interval, args.idle_s, args.load_s, load[1] if load else None)
        )
    writer.close()
    samples = list(read_timeline(out / "timeline.jsonl"))
    print(f"{len(samples)} rows in {out / 'timeline.jsonl'}; sampler: {stats.get('gpu')}")

    checks: list[tuple[str, bool, str]] = []
    for i in range(n):
        missing = [f for f in REQUIRED if not any(gpu_key(i, f) in s.values for s in samples)]
        checks.append((f"GPU {i} columns", not missing, f"missing {missing}" if missing else ", ".join(REQUIRED)))
        power = any(gpu_key(i, gpu.POWER_W) in s.values for s in samples)
        print(f"GPU {i}: power {'reported' if power else 'not reported by this GPU (absent column, as designed)'}")
    merged = sum(1 for s in samples if RUNNING in s.values and gpu_key(0, gpu.UTIL) in s.values)
    checks.append(("server and GPU in the same rows", merged == len(samples) > 0, f"{merged}/{len(samples)} rows"))

    print(f"\n{'phase':<12} {'span s':>12} {'util':>6} {'SM MHz':>7} {'mem GiB':>8} {'W':>6} {'C':>4}")
    means: dict[str, dict[str, float | None]] = {}
    for phase, span in phases.items():
        m = {
            f: mean_in(samples, gpu_key(0, f), span)
            for f in (gpu.UTIL, gpu.SM_CLOCK_MHZ, gpu.MEM_USED_BYTES, gpu.POWER_W, gpu.TEMPERATURE_C)
        }
        means[phase] = m
        print(
            f"{phase:<12} {span[0]:5.1f}-{span[1]:5.1f} {cell(m[gpu.UTIL], 0.01) + '%':>6} "
            f"{cell(m[gpu.SM_CLOCK_MHZ]):>7} "
            f"{cell(m[gpu.MEM_USED_BYTES], 2**30, '{:.2f}'):>8} {cell(m[gpu.POWER_W]):>6} "
            f"{cell(m[gpu.TEMPERATURE_C]):>4}"
        )
    if load is not None:
        idle = means["idle before"][gpu.UTIL] or 0.0
        busy = means["load"][gpu.UTIL] or 0.0
        checks.append(
            (
                "utilisation rises under load",
                busy >= LOADED_UTIL and busy >= idle + UTIL_RISE,
                (
                    f"GPU 0 {100 * idle:.0f}% idle -> {100 * busy:.0f}% loaded "
                    f"(needs >= {100 * LOADED_UTIL:.0f}% and +{100 * UTIL_RISE:.0f} points)"
                ),
            )
        )
        mem_idle, mem_busy = means["idle before"][gpu.MEM_USED_BYTES], means["load"][gpu.MEM_USED_BYTES]
        rise = (mem_busy or 0.0) - (mem_idle or 0.0)
        checks.append(
            (
                "memory used rises by the load's tensors",
                rise >= 0.9 * held,
                f"+{rise / 2**30:.2f} GiB, the load holds {held / 2**30:.2f} GiB",
            )
        )

    print()
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
