"""What the host was doing while something was measured: load, CPU steal, GPU clocks.

A timing taken on a shared machine is only comparable with another taken
under similar conditions. Calibration records these conditions so that a
later run can say, with numbers, when it is not comparable: other jobs on
the CPUs (load average, the share of CPU time the hypervisor gave to other
guests, "steal"), and on a GPU host the clocks, temperature and throttle
reasons NVML reports (a throttled GPU runs the same kernels slower).

Everything here degrades to absent fields, never to an error: no /proc
(not Linux), no NVML library or no GPU are ordinary situations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from servelab.schemas.results import Json

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The aggregate `cpu` line of /proc/stat: cumulative jiffies of all CPUs."""

    busy: int
    idle: int
    steal: int

    @classmethod
    def parse(cls, text: str) -> CpuTimes | None:
        """From /proc/stat's text (user nice system idle iowait irq softirq steal ...); None without a `cpu` line."""
        for line in text.splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                values = [int(v) for v in fields[1:]] + [0] * 8
                user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
                return cls(busy=user + nice + system + irq + softirq, idle=idle + iowait, steal=steal)
        return None

    @classmethod
    def read(cls, path: Path = PROC_STAT) -> CpuTimes | None:
        try:
            return cls.parse(path.read_text())
        except OSError:
            return None


def cpu_shares(start: CpuTimes | None, end: CpuTimes | None) -> dict[str, float]:
    """Busy and steal shares of all CPUs' time between two readings; empty when either is missing or no time passed."""
    if start is None or end is None:
        return {}
    busy, idle, steal = end.busy - start.busy, end.idle - start.idle, end.steal - start.steal
    total = busy + idle + steal
    if total <= 0:
        return {}
    return {"cpu_busy_share": busy / total, "cpu_steal_share": steal / total}


class GpuState(TypedDict):
    """One local GPU as NVML reports it when the conditions are taken."""

    index: int
    name: str
    sm_clock_mhz: int
    sm_clock_max_mhz: int
    temperature_c: int
    power_w: float
    throttle_reasons: int


class HostConditions(TypedDict, total=False):
    """The host's conditions over an interval (a profile's `host`, run.json's `client_host`): each field only when
    the host could say it."""

    cpu_count: int | None
    load_avg_1m: float
    cpu_busy_share: float
    cpu_steal_share: float
    gpus: list[GpuState]


def gpu_states() -> list[GpuState]:
    """Per local NVIDIA GPU: SM clock and its maximum, temperature, power, active throttle reasons; [] without NVML.

    Read through nvidia-ml-py (`pynvml`); any NVML error (no driver, no GPU)
    means "no GPU to report", since a CPU-only host is a normal case here.
    """
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        states: list[GpuState] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            states.append(
                GpuState(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                    sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                    temperature_c=pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                    power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                    throttle_reasons=pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
                )
            )
        return states
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class HostWatch:
    """Host conditions over an interval: start() ... conditions(). Cheap (two small file reads), so it brackets any
    run."""

    def __init__(self, stat_path: Path = PROC_STAT) -> None:
        self._stat_path = stat_path
        self._start: CpuTimes | None = None

    def start(self) -> HostWatch:
        self._start = CpuTimes.read(self._stat_path)
        return self

    def conditions(self, *, gpus: bool = False) -> HostConditions:
        """Load average at the end, CPU busy/steal shares since start(), and the GPUs' states when asked."""
        out = HostConditions(cpu_count=os.cpu_count())
        try:
            out["load_avg_1m"] = os.getloadavg()[0]
        except OSError:
            pass
        shares = cpu_shares(self._start, CpuTimes.read(self._stat_path))
        if shares:
            out["cpu_busy_share"], out["cpu_steal_share"] = shares["cpu_busy_share"], shares["cpu_steal_share"]
        if gpus:
            out["gpus"] = gpu_states()
        return out


STEAL_SHARE_NOTICED = 0.05
"""CPU time given to other guests above this share (and this much more than before) slows a CPU-bound server visibly."""
CLOCK_DROP_NOTICED = 0.10
"""A GPU's SM clock this much further below its maximum than before runs the same kernels visibly slower."""
THROTTLE_IDLE = 0x1
"""NVML's "GPU idle" throttle reason: clocks are down because nothing runs, not a slowdown of work."""


def condition_changes(then: Json, now: HostConditions | Json, *, now_label: str, then_label: str) -> list[str]:
    """What differs between two hosts' conditions in a way that changes timings, one sentence each; [] when nothing
    does.

    Only what can be attributed is named: CPU time taken by other guests (steal),
    and GPU clocks lowered or throttled. The load average is not compared: on a
    host that also runs the server it mostly counts the server itself.
    """
    out = []
    steal, steal_then = now.get("cpu_steal_share"), then.get("cpu_steal_share") or 0.0
    if steal is not None and steal > STEAL_SHARE_NOTICED and steal - steal_then > STEAL_SHARE_NOTICED:
        out.append(
            f"the hypervisor gave {100 * steal:.0f}% of the host's CPU time to other guests {now_label} "
            f"({100 * steal_then:.0f}% {then_label}): CPU-side timings are slowed"
        )
    before = {g["index"]: g for g in then.get("gpus", [])}
    for gpu in now.get("gpus", []):
        old = before.get(gpu["index"])
        ratio = gpu["sm_clock_mhz"] / gpu["sm_clock_max_mhz"] if gpu.get("sm_clock_max_mhz") else None
        old_ratio = old["sm_clock_mhz"] / old["sm_clock_max_mhz"] if old and old.get("sm_clock_max_mhz") else None
        if old is not None and ratio is not None and old_ratio is not None and old_ratio - ratio > CLOCK_DROP_NOTICED:
            out.append(
                f"GPU {gpu['index']} ran at {gpu['sm_clock_mhz']} MHz {now_label}, {old['sm_clock_mhz']} MHz "
                f"{then_label} (maximum {gpu['sm_clock_max_mhz']} MHz): kernels run slower"
            )
        reasons = (gpu.get("throttle_reasons") or 0) & ~THROTTLE_IDLE
        if reasons and not (old and (old.get("throttle_reasons") or 0) & ~THROTTLE_IDLE):
            out.append(
                f"GPU {gpu['index']} was throttled {now_label} (NVML throttle reasons {reasons:#x}, "
                f"{gpu.get('temperature_c')} C) and not {then_label}"
            )
    return out
