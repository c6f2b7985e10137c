"""GPU telemetry: a DCGM exporter's real exposition served over HTTP, NVML at its library boundary.

No GPU and no DCGM exporter can exist on this machine, so the exporter's
output is served by a local HTTP server (tests/support/dcgm_exporter.py),
and NVML's functions are replaced on the real `pynvml` module (its error
classes stay real). A real GPU: benchmarks/gpu_telemetry_check.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import aiohttp
import pynvml
import pytest
from support.dcgm_exporter import DCGM_EXPOSITION, dcgm_exporter

from servelab.metrics import gpu
from servelab.metrics.gpu import (
    GpuTelemetry,
    NvmlSampler,
    gpu_key,
    gpu_sampler,
    parse_dcgm,
    split_gpu_key,
)
from servelab.metrics.scrape import MetricsScraper


def test_dcgm_default_and_profiling_fields_become_gpu_columns_in_timeline_units() -> None:
    values = parse_dcgm(DCGM_EXPOSITION)
    assert values[gpu_key(0, gpu.UTIL)] == pytest.approx(0.97)  # percent -> fraction
    assert values[gpu_key(0, gpu.SM_CLOCK_MHZ)] == 1410
    assert values[gpu_key(0, gpu.MEM_USED_BYTES)] == 79584 * 2**20  # MiB -> bytes
    assert values[gpu_key(1, gpu.MEM_FREE_BYTES)] == 80627 * 2**20
    assert values[gpu_key(0, gpu.POWER_W)] == pytest.approx(312.507)
    assert values[gpu_key(0, gpu.TEMPERATURE_C)] == 67
    assert values[gpu_key(0, gpu.SM_ACTIVE)] == pytest.approx(0.412)
    assert values[gpu_key(0, gpu.TENSOR_ACTIVE)] == pytest.approx(0.18733)
    assert values[gpu_key(0, gpu.DRAM_ACTIVE)] == pytest.approx(0.6412)
    assert values[gpu_key(0, gpu.GR_ENGINE_ACTIVE)] == pytest.approx(0.953105)
    assert values[gpu_key(1, gpu.UTIL)] == 0.0  # an idle GPU is a zero, not an absence
    assert {split_gpu_key(k) for k in values} == {
        (i, f) for i in ("0", "1") for f in gpu.FIELDS if f != gpu.THROTTLE_REASONS
    }


def test_dcgm_blank_values_and_foreign_metrics_are_left_out() -> None:
    blank = (
        '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 140737488355328\n'
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.2\n"
    )
    assert parse_dcgm(blank) == {}
    assert split_gpu_key("vllm:num_requests_running") is None and split_gpu_key("gpu0:nonsense") is None


def test_dcgm_garbage_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_dcgm("<html>not metrics</html>\n")


@pytest.fixture
def exporter() -> Iterator[str]:
    with dcgm_exporter() as url:
        yield url


async def _scrape(server_url: str, telemetry: GpuTelemetry | None) -> tuple[list[dict[str, float]], dict]:
    """Three scrapes of `server_url`/metrics with `telemetry` beside them, as HttpTarget.arun wires them."""
    rows: list[dict[str, float]] = []
    async with aiohttp.ClientSession() as session, gpu_sampler(telemetry, session) as sampler:
        scraper = MetricsScraper(session, server_url, lambda: 0.0, lambda s: rows.append(s.values), gpu=sampler)
        for _ in range(3):
            await scraper.sample_once()
        return rows, scraper.stats()


def test_a_dcgm_exporter_is_sampled_with_every_scrape_even_when_the_server_has_no_metrics(exporter: str) -> None:
    rows, stats = asyncio.run(_scrape(exporter + "/no-such-server-metrics", GpuTelemetry(exporter + "/metrics")))
    assert len(rows) == 3 and all(r[gpu_key(0, gpu.UTIL)] == pytest.approx(0.97) for r in rows)
    assert stats["failures"] == 3  # the server's scrapes failed; the GPU's did not
    assert stats["gpu"] == {"source": exporter + "/metrics", "samples": 3, "failures": 0, "last_error": None}


def test_a_dead_exporter_means_absent_columns_and_counted_failures(exporter: str) -> None:
    rows, stats = asyncio.run(_scrape(exporter + "/metrics", GpuTelemetry("http://127.0.0.1:9/metrics")))
    assert len(rows) == 3 and not any(split_gpu_key(k) for r in rows for k in r)  # the server's rows, no GPU columns
    assert stats["gpu"]["failures"] == 3 and stats["gpu"]["last_error"]


def test_without_a_gpu_local_telemetry_adds_nothing_and_raises_nothing(exporter: str) -> None:
    """This machine has no NVIDIA driver: real pynvml, real NVMLError, no columns."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA GPU; the no-GPU path cannot be shown here")
    rows, stats = asyncio.run(_scrape(exporter + "/missing", GpuTelemetry()))
    assert rows == [] and stats["gpu"]["source"] == "nvml" and stats["gpu"]["unavailable"]


@pytest.fixture
def two_nvml_gpus(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """pynvml's functions as a driver with two A100s answers them; GPU 1 refuses power readings, and the driver
    predates nvmlDeviceGetCurrentClocksEventReasons (so the older name must be used)."""
    calls: list[str] = []

    def power(handle: int) -> int:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 298_500

    def event_reasons(handle: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    patches = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-80GB",
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=93 if h == 0 else 0, memory=40),
        "nvmlDeviceGetClockInfo": lambda h, kind: 1410 if kind == pynvml.NVML_CLOCK_SM else 1593,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=80 * 2**30, used=78 * 2**30, free=2 * 2**30),
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, kind: 64,
        "nvmlDeviceGetCurrentClocksEventReasons": event_reasons,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x4,  # SW power cap
    }
    for name, fn in patches.items():
        monkeypatch.setattr(pynvml, name, fn)
    return calls


def test_nvml_reads_every_field_per_gpu_and_skips_what_a_gpu_refuses(two_nvml_gpus: list[str]) -> None:
    sampler = NvmlSampler()
    values = sampler.read()
    sampler.close()
    assert values[gpu_key(0, gpu.UTIL)] == pytest.approx(0.93)
    assert values[gpu_key(0, gpu.SM_CLOCK_MHZ)] == 1410
    assert values[gpu_key(0, gpu.MEM_USED_BYTES)] == 78 * 2**30
    assert values[gpu_key(0, gpu.POWER_W)] == pytest.approx(298.5)
    assert values[gpu_key(1, gpu.TEMPERATURE_C)] == 64
    assert values[gpu_key(1, gpu.THROTTLE_REASONS)] == 0x4
    assert gpu_key(1, gpu.POWER_W) not in values and gpu_key(1, gpu.UTIL) in values
    assert sampler.stats() == {"source": "nvml", "gpus": ["NVIDIA A100-SXM4-80GB"] * 2, "unavailable": None}
    assert two_nvml_gpus == ["init", "shutdown"]


def test_nvml_telemetry_rides_along_with_each_scrape_and_is_released_after(
    two_nvml_gpus: list[str], exporter: str
) -> None:
    rows, stats = asyncio.run(_scrape(exporter + "/missing", GpuTelemetry()))
    assert len(rows) == 3 and all(r[gpu_key(0, gpu.UTIL)] == pytest.approx(0.93) for r in rows)
    assert stats["gpu"]["gpus"] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert two_nvml_gpus == ["init", "shutdown"]


def test_no_telemetry_config_samples_no_gpu(exporter: str) -> None:
    rows, stats = asyncio.run(_scrape(exporter + "/metrics", None))
    assert len(rows) == 3 and not any(split_gpu_key(k) for r in rows for k in r) and "gpu" not in stats
