"""Host conditions: /proc/stat arithmetic, and NVML at its library boundary (no GPU on this machine)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from servelab.metrics.host import THROTTLE_IDLE, CpuTimes, HostWatch, condition_changes, cpu_shares, gpu_states

STAT = "cpu  100 5 50 800 20 3 2 20 0 0\ncpu0 50 2 25 400 10 1 1 10 0 0\nintr 1 2 3\n"


def test_cpu_times_come_from_the_aggregate_line() -> None:
    times = CpuTimes.parse(STAT)
    assert times == CpuTimes(busy=100 + 5 + 50 + 3 + 2, idle=800 + 20, steal=20)
    assert CpuTimes.parse("intr 1 2\n") is None


def test_shares_over_an_interval() -> None:
    start, end = CpuTimes(busy=100, idle=800, steal=0), CpuTimes(busy=190, idle=890, steal=20)
    shares = cpu_shares(start, end)
    assert shares == pytest.approx({"cpu_busy_share": 90 / 200, "cpu_steal_share": 20 / 200})
    assert cpu_shares(None, end) == {} and cpu_shares(end, end) == {}


def test_a_watch_on_this_host_reports_load_and_shares(tmp_path: Path) -> None:
    conditions = HostWatch().start().conditions()
    assert conditions["cpu_count"] >= 1 and conditions["load_avg_1m"] >= 0
    missing = HostWatch(tmp_path / "no-stat").start().conditions()  # not Linux: absent fields, no error
    assert "cpu_steal_share" not in missing and missing["cpu_count"] >= 1


class _NVMLError(Exception):
    pass


def _fake_pynvml(devices: int, fail_init: bool = False) -> types.ModuleType:
    """The few pynvml calls gpu_states makes, with the values a throttled H100 would give."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = _NVMLError
    nvml.NVML_CLOCK_SM, nvml.NVML_TEMPERATURE_GPU = 1, 0
    calls = []

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")
        calls.append("init")

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: devices
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1410
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nvml.nvmlDeviceGetTemperature = lambda h, kind: 84
    nvml.nvmlDeviceGetPowerUsage = lambda h: 699_000
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x20  # SW thermal slowdown
    nvml.calls = calls
    return nvml


def test_gpu_states_read_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml(devices=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    states = gpu_states()
    assert [s["index"] for s in states] == [0, 1]
    assert states[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "sm_clock_mhz": 1410,
        "sm_clock_max_mhz": 1980,
        "temperature_c": 84,
        "power_w": 699.0,
        "throttle_reasons": 0x20,
    }
    assert fake.calls == ["init", "shutdown"]


def test_no_nvml_library_or_no_driver_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(devices=1, fail_init=True))
    assert gpu_states() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_states() == []


def _gpu(clock: int, reasons: int = 0) -> dict:
    return {
        "index": 0,
        "sm_clock_mhz": clock,
        "sm_clock_max_mhz": 1980,
        "temperature_c": 85,
        "throttle_reasons": reasons,
    }


def test_changes_that_slow_a_server_are_named_with_their_numbers() -> None:
    then = {"cpu_steal_share": 0.0, "gpus": [_gpu(1980, THROTTLE_IDLE)]}
    same = {"cpu_steal_share": 0.03, "gpus": [_gpu(1900)]}
    assert condition_changes(then, same, now_label="now", then_label="then") == []
    worse = {"cpu_steal_share": 0.2, "gpus": [_gpu(1410, 0x20)]}
    lines = condition_changes(then, worse, now_label="during the run", then_label="at calibration")
    assert len(lines) == 3
    assert "20% of the host's CPU time" in lines[0] and "0% at calibration" in lines[0]
    assert "1410 MHz during the run, 1980 MHz at calibration" in lines[1]
    assert "throttle reasons 0x20" in lines[2]
    assert (
        condition_changes({}, {"cpu_count": 2}, now_label="a", then_label="b") == []
    )  # nothing recorded: nothing said
