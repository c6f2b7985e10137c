"""benchmarks/gpu_step_compare.py reads the H200 probe runs (its accuracy is reported in docs/kernels.md, not
tested)."""

from __future__ import annotations

import json
import sys

import pytest

from servelab.perf import kernel_fit as kf
from servelab.perf.hardware import get_gpu
from support.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def compare():
    return load_benchmark("gpu_step_compare")


@pytest.fixture(scope="module")
def probes(compare):
    return [json.loads(path.read_text()) for path in compare.MEASURED]


def test_rounds_are_grouped_per_model_and_every_round_kept(compare, probes):
    first, second = (compare.step_runs(p) for p in probes[:2])
    assert {run.round for run in first} == {None} and {run.impl for run in first} == {"lean", "hf"}
    assert {run.impl for run in second} == {"lean"}
    assert sorted((run.model, run.round) for run in second) == [(run.model, run.round) for run in second]
    for model in {run.model for run in second}:
        assert [run.round for run in second if run.model == model] == [1, 2, 3]
    assert sum(len(run.rows) for run in second) == sum(len(v) for k, v in probes[1].items() if k.startswith("lean/"))


def test_only_rows_timed_by_back_to_back_calls_can_be_host_bound(compare, probes):
    hw = get_gpu(compare.GPU)
    fit = kf.load_kernel_fit(hw)
    first, second = (compare.gemm_rows(p, hw, fit, None) for p in probes[:2])
    assert any(r.host_bound for r in first)
    assert second and not any(r.host_bound for r in second)
    graph_timed = {
        (r["gemm"], r["m"], r["n"], r["k"])
        for k, v in probes[1].items()
        if k.startswith("gemm/")
        for r in v
        if r.get("graph")
    }
    assert len(graph_timed) == len({(r.gemm, r.m, r.n, r.k) for r in second})


def test_sets_out_every_file_given_without_an_hf_stage(compare, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_step_compare.py", "--measured", *map(str, compare.MEASURED)])
    compare.main()
    out = capsys.readouterr().out
    for path in compare.MEASURED:
        assert f"## {path.name}:" in out
    assert out.count("### Eager ms per layer") == len(compare.MEASURED)
