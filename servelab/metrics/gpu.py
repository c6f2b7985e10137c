"""GPU telemetry during a run: how busy, how fast and how full the GPUs were, beside the server's metrics.

A server's own gauges say what the engine scheduled; they cannot say whether
the GPU was busy, throttled or out of memory. Two sources give that:

- the local GPUs through NVML (nvidia-ml-py), the figures `nvidia-smi` shows,
  when the server runs on the machine that runs the benchmark;
- a remote host's GPUs through a DCGM exporter's Prometheus endpoint
  (`--gpu-metrics-url`), which also carries the profiling fields that say how
  busy the chip really is (SM active, tensor pipe active, DRAM active):
  nvidia-smi's "utilisation" counts a GPU as busy while any kernel runs, so
  one tiny kernel at a time reads 100%.

Both land in the timeline under the same columns, `gpu<index>:<field>` (see
`gpu_key`), so every reader is source-neutral. Fractions are 0..1 whatever
the source's unit (DCGM and NVML report utilisation in percent).

Telemetry is evidence, never load or failure: no NVML library, no driver,
no GPU, a field the GPU does not support, an exporter that is down, all
mean absent columns (and a counted failure for the exporter), never an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:  # imported by the functions that send requests: a command that sends none starts without it
    import aiohttp

UTIL = "util"
"""Share of the sample period in which a kernel ran (nvidia-smi's "GPU-Util"), 0..1."""
SM_CLOCK_MHZ = "sm_clock_mhz"
MEM_USED_BYTES = "mem_used_bytes"
MEM_FREE_BYTES = "mem_free_bytes"
POWER_W = "power_w"
TEMPERATURE_C = "temperature_c"
THROTTLE_REASONS = "throttle_reasons"
"""NVML's clock-event bitmask (0x1 is "idle", not a slowdown); DCGM mirrors it bit for bit."""
SM_ACTIVE = "sm_active"
"""DCGM profiling: share of cycles an SM had at least one warp resident, averaged over SMs, 0..1."""
TENSOR_ACTIVE = "tensor_active"
DRAM_ACTIVE = "dram_active"
GR_ENGINE_ACTIVE = "gr_engine_active"

FIELDS = (
    UTIL,
    SM_CLOCK_MHZ,
    MEM_USED_BYTES,
    MEM_FREE_BYTES,
    POWER_W,
    TEMPERATURE_C,
    THROTTLE_REASONS,
    SM_ACTIVE,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
)

MIB = 1 << 20

DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": (UTIL, 0.01),
    "DCGM_FI_DEV_SM_CLOCK": (SM_CLOCK_MHZ, 1.0),
    "DCGM_FI_DEV_FB_USED": (MEM_USED_BYTES, MIB),
    "DCGM_FI_DEV_FB_FREE": (MEM_FREE_BYTES, MIB),
    "DCGM_FI_DEV_POWER_USAGE": (POWER_W, 1.0),
    "DCGM_FI_DEV_GPU_TEMP": (TEMPERATURE_C, 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (THROTTLE_REASONS, 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (THROTTLE_REASONS, 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": (SM_ACTIVE, 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (TENSOR_ACTIVE, 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": (DRAM_ACTIVE, 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (GR_ENGINE_ACTIVE, 1.0),
}
"""DCGM exporter metric -> (timeline field, factor to the timeline's unit)."""

DCGM_BLANK = float(1 << 47)
"""DCGM writes "no value" (field unsupported, not yet sampled) as huge sentinels: DCGM_FP64_BLANK = 2**47 and
DCGM_INT64_BLANK = 2**63 - 16 and up. No real reading of the fields above comes near them."""

SCRAPE_TIMEOUT_S = 2.0


def gpu_key(index: int | str, field: str) -> str:
    """The timeline column of one GPU's field, e.g. `gpu0:util`."""
    return f"gpu{index}:{field}"


def split_gpu_key(name: str) -> tuple[str, str] | None:
    """(index, field) of a `gpu_key` column; None for any other column (the server's metrics)."""
    head, sep, field = name.partition(":")
    if not sep or not head.startswith("gpu") or field not in FIELDS:
        return None
    return head[3:], field


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """Where a run's GPU figures come from: plain data, so that a target holding it can be sent to worker processes.

    With `dcgm_url` the GPUs are those of the host the exporter runs on and
    local NVML is not read (the benchmark host's own GPUs, if any, would
    collide with the server's by index and are not the ones serving).
    """

    dcgm_url: str | None = None


class NvmlStats(TypedDict):
    """What the local-NVML sampler says of itself in a run's client stats: the GPUs it read, or why none."""

    source: str
    gpus: list[str]
    unavailable: str | None


class DcgmStats(TypedDict):
    """What the DCGM-exporter sampler says of itself in a run's client stats: its URL and how its fetches went."""

    source: str
    samples: int
    failures: int
    last_error: str | None


class GpuSampler(Protocol):
    """A run's live source of GPU columns; sampling never raises (a failure is an empty dict and a counted error)."""

    async def sample(self) -> dict[str, float]: ...

    def stats(self) -> NvmlStats | DcgmStats: ...


NVML_READERS: dict[str, Callable[[Any, Any], float]] = {
    UTIL: lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
    SM_CLOCK_MHZ: lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
    MEM_USED_BYTES: lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used,
    MEM_FREE_BYTES: lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).free,
    POWER_W: lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
    TEMPERATURE_C: lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
    THROTTLE_REASONS: lambda nvml, h: _clock_event_reasons(nvml, h),
}
"""Timeline field -> its NVML reading (pynvml module, device handle), in the timeline's unit."""


class NvmlSampler:
    """The local GPUs through NVML, opened once for a run (nvmlInit enumerates devices and is not cheap)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.names: list[str] = []
        self.unavailable: str | None = None
        self._nvml: Any = None
        try:
            import pynvml
        except ImportError as exc:
            self.unavailable = f"nvidia-ml-py not importable: {exc}"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML: {exc}"
            return
        self._nvml = pynvml
        try:
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML: {exc}"
            self.close()

    def read(self) -> dict[str, float]:
        """Every field of every GPU that NVML answers; a field it refuses (unsupported, lost GPU) is left out."""
        values: dict[str, float] = {}
        for i, handle in enumerate(self.handles):
            for field, read in NVML_READERS.items():
                try:
                    values[gpu_key(i, field)] = float(read(self._nvml, handle))
                except self._nvml.NVMLError:
                    continue
        return values

    async def sample(self) -> dict[str, float]:
        # NVML calls block for up to milliseconds each: off the event loop that times the requests.
        return await asyncio.to_thread(self.read) if self.handles else {}

    def close(self) -> None:
        """Release NVML (its init is reference-counted: other users in the process keep theirs)."""
        nvml, self._nvml, self.handles = self._nvml, None, []
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass

    def stats(self) -> NvmlStats:
        return NvmlStats(source="nvml", gpus=self.names, unavailable=self.unavailable)


def parse_dcgm(text: str) -> dict[str, float]:
    """A DCGM exporter's exposition text as `gpu_key` columns; fields not in DCGM_FIELDS and blank values are left out.

    The GPU is the `gpu` label (its index on that host). Raises ValueError on
    text that is not Prometheus exposition format.
    """
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            mapped = DCGM_FIELDS.get(sample.name)
            index = sample.labels.get("gpu")
            if mapped is None or index is None or sample.value >= DCGM_BLANK:
                continue
            field, factor = mapped
            values[gpu_key(index, field)] = float(sample.value) * factor
    return values


class DcgmSampler:
    """A DCGM exporter's /metrics, fetched on the run's scrape session."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.samples = 0
        self.failures = 0
        self.last_error: str | None = None

    async def sample(self) -> dict[str, float]:
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            async with self.session.get(self.url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            values = await asyncio.to_thread(parse_dcgm, text)
        except (TimeoutError, aiohttp.ClientError, ValueError, UnicodeDecodeError) as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return {}
        self.samples += 1
        return values

    def stats(self) -> DcgmStats:
        return DcgmStats(source=self.url, samples=self.samples, failures=self.failures, last_error=self.last_error)


@asynccontextmanager
async def gpu_sampler(config: GpuTelemetry | None, session: aiohttp.ClientSession) -> AsyncIterator[GpuSampler | None]:
    """The live sampler for a run's telemetry config (None: no GPU telemetry), released when the run ends."""
    if config is None:
        yield None
    elif config.dcgm_url is not None:
        yield DcgmSampler(session, config.dcgm_url)
    else:
        nvml = NvmlSampler()
        try:
            yield nvml
        finally:
            nvml.close()


def _clock_event_reasons(nvml: Any, handle: Any) -> int:
    """The clock-event bitmask; drivers before r535 only have it under its older name (same bits)."""
    try:
        return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except nvml.NVMLError_FunctionNotFound:
        return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
