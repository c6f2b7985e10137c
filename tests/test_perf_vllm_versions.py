"""A server on an older vLLM is simulated with that release's defaults (perf/vllm_versions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab.perf import vllm_cpu_costs
from servelab.perf.engine_args import default_batch_limits
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.perf.vllm_versions import parse_version
from servelab.targets.deployment import build_deployment


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.11.0", (0, 11)),
        ("v0.11", (0, 11)),
        ("0.10.1.1", (0, 10)),
        ("0.11.0rc2", (0, 11)),
        ("1.2", (1, 2)),
        (None, None),
        ("latest", None),
        ("", None),
    ],
)
def test_versions_are_read_as_people_write_them(text, version):
    assert parse_version(text) == version


@pytest.mark.parametrize("text", ["eleven", "0.4.3"])
def test_an_unreadable_or_pre_0_5_version_is_refused(text):
    with pytest.raises(PerfConfigError):
        parse_version(text)


def test_vllm_0_11_runs_its_own_defaults_and_flags_still_win():
    old = build_deployment("h100-sxm", "llama-3.1-8b", vllm_version="0.11.0").config
    assert (old.async_scheduling, old.scheduler_reserve_full_isl, old.gpu_memory_utilization) == (False, False, 0.9)
    new = build_deployment("h100-sxm", "llama-3.1-8b").config
    assert (new.async_scheduling, new.scheduler_reserve_full_isl, new.gpu_memory_utilization) == (True, True, 0.92)
    flagged = build_deployment(
        "h100-sxm", "llama-3.1-8b", "--async-scheduling --gpu-memory-utilization 0.8", vllm_version="0.11.0"
    ).config
    assert (flagged.async_scheduling, flagged.gpu_memory_utilization) == (True, 0.8)


def test_the_defaults_change_at_the_release_that_changed_them():
    def config(version: str):
        return build_deployment("a100-80gb", "qwen2.5-7b", vllm_version=version).config

    assert config("0.13.0").async_scheduling is False and config("0.14.0").async_scheduling is True
    assert not config("0.18.0").scheduler_reserve_full_isl and config("0.19.0").scheduler_reserve_full_isl
    assert config("0.19.1").gpu_memory_utilization == 0.9 and config("0.20.0").gpu_memory_utilization == 0.92


def test_the_largest_batch_defaults_start_at_0_28_on_chips_of_160_gib_and_more():
    mi300x, h100 = get_gpu("mi300x"), get_gpu("h100-sxm")
    assert default_batch_limits(mi300x, 1, vllm_version=(0, 27)) == default_batch_limits(h100, 1)
    assert default_batch_limits(mi300x, 1, vllm_version=(0, 28)) == (16384, 1024) == default_batch_limits(mi300x, 1)


def test_an_older_release_prints_only_the_flags_it_was_given():
    deployment = build_deployment("h100-sxm", "llama-3.1-8b", "--max-num-seqs 64", vllm_version="0.11.0")
    assert deployment.engine_args() == "--max-num-seqs 64"
    assert deployment.describe()["vllm_version"] == "0.11"
    assert deployment.rebuilt(max_num_seqs=32).config.async_scheduling is False


def test_cpu_costs_come_from_the_oldest_measured_release_at_or_after_the_served_one(tmp_path: Path, monkeypatch):
    doc = yaml.safe_load(vllm_cpu_costs.DATA.read_text())
    for version, per_request in (("0.32.0", 0.003), ("0.11.0", 0.006), ("0.20.0", 0.004)):
        name = "vllm_cpu_costs.yaml" if version == "0.32.0" else f"vllm_cpu_costs-{version}.yaml"
        (tmp_path / name).write_text(
            yaml.safe_dump(
                {**doc, "vllm_version": version, "api_server": {**doc["api_server"], "per_request_s": per_request}}
            )
        )
    monkeypatch.setattr(vllm_cpu_costs, "DATA", tmp_path / "vllm_cpu_costs.yaml")
    vllm_cpu_costs._measured_releases.cache_clear()
    try:
        picked = {
            v: vllm_cpu_costs.measured(v).api_per_request_s
            for v in [(0, 9), (0, 11), (0, 12), (0, 20), (0, 27), (0, 40)]
        }
        assert picked == {(0, 9): 0.006, (0, 11): 0.006, (0, 12): 0.004, (0, 20): 0.004, (0, 27): 0.003, (0, 40): 0.003}
        assert vllm_cpu_costs.measured().api_per_request_s == 0.003
    finally:
        vllm_cpu_costs._measured_releases.cache_clear()
