"""vLLM's measured CPU-side costs: the API server's fit (benchmarks/cpu_side_costs.py) and the data file's loader.

The measurement itself starts a real vLLM server and is timing-dependent, so it
lives in the benchmark and its numbers in docs/simulator.md; here the fit is
checked on rows made from known costs, and the data file for consistency.
"""

from __future__ import annotations


import pytest

from servelab.perf.vllm_cpu_costs import measured
from support.benchmark_script import load_benchmark


def _script():
    return load_benchmark("cpu_side_costs")


def _row(name: str, prompt: float, out: float, stream: bool, chunks: float, steps: float) -> dict:
    """A scenario whose event-loop and off-loop CPU follow known costs exactly (`steps`: engine steps per request)."""
    fixed, stream_extra, per_prompt, per_token, per_chunk, per_step = 2e-3, 0.8e-3, 0.5e-6, 20e-6, 80e-6, 0.6e-3
    loop = (
        fixed + per_prompt * prompt + per_token * out + (stream_extra + per_chunk * chunks) * stream + per_step * steps
    )
    off = 0.3e-3 + 1.5e-6 * prompt
    return {
        "scenario": name,
        "repeat": 0,
        "stream": stream,
        "prompt_tokens": prompt,
        "output_tokens": out,
        "chunks_per_request": chunks if stream else 1.0,
        "engine_steps_per_request": steps,
        "api_main_thread_s_per_request": loop,
        "api_all_threads_s_per_request": loop + off,
    }


def test_api_fit_recovers_the_costs_the_rows_were_made_from():
    rows = [
        _row("128/1 s", 128, 1, True, 1, 0.03),
        _row("128/4 s", 128, 4, True, 3.4, 0.06),
        _row("128/4 n", 128, 4, False, 1, 0.05),
        _row("1024/1 s", 1008, 1, True, 1, 0.08),
        _row("128/64 s", 128, 64, True, 41, 0.9),
        _row("128/64 n", 128, 64, False, 1, 0.7),
        _row("128/1 s c=8", 128, 1, True, 1, 0.3),
        _row("128/64 s c=8", 128, 64, True, 64, 9.0),
    ]
    fit = _script().fit_api(rows)
    assert fit["per_request_non_stream_s"] == pytest.approx(2e-3)
    assert fit["per_request_s"] == pytest.approx(2.8e-3)  # a streamed request: its start, usage chunk and [DONE]
    assert fit["per_token_s"] == pytest.approx(20e-6)
    assert fit["per_chunk_s"] == pytest.approx(80e-6)
    assert fit["per_engine_step_s"] == pytest.approx(0.6e-3)
    assert fit["per_output_token_s"] == pytest.approx(100e-6)  # one token a chunk
    assert fit["loop_per_prompt_token_s"] == pytest.approx(0.5e-6)
    assert fit["off_loop_per_prompt_token_s"] == pytest.approx(1.5e-6)
    assert fit["per_prompt_token_s"] == pytest.approx(2e-6)
    assert all(abs(r) < 1e-9 for r in fit["fit_relative_residuals"].values())
    assert len(fit["fit_relative_residuals"]) == len(rows)


def test_data_file_output_costs_are_consistent_and_scale_with_the_speed_factor():
    costs = measured()
    assert costs.api_per_output_token_s == pytest.approx(costs.api_per_token_s + costs.api_per_chunk_s)
    assert costs.api_per_chunk_s > 0 and costs.api_per_token_s > 0
    one, two = costs.api_server(1.0), costs.api_server(2.0)
    assert (
        two.per_output_step_s,
        two.per_output_token_s,
        two.per_chunk_s,
        two.per_request_s,
        two.latency_s,
    ) == pytest.approx(
        (
            2 * costs.api_per_engine_step_s,
            2 * costs.api_per_token_s,
            2 * costs.api_per_chunk_s,
            2 * costs.api_per_request_s,
            2 * one.latency_s,
        )
    )
    assert two.per_streamed_token_s == pytest.approx(2 * costs.api_per_output_token_s)
    assert one.per_prompt_token_s == pytest.approx(costs.api_loop_per_prompt_token_s)  # the loop's share only


def test_data_file_concurrency_one_overhead_covers_the_loop_cpu_it_contains():
    """At concurrency 1 nothing queues, so the measured non-model latency holds the loop's CPU for that request."""
    c = measured()
    prompt = 128
    loop_cpu = (
        c.api_per_request_s
        + c.api_loop_per_prompt_token_s * prompt
        + c.api_per_engine_step_s
        + c.api_per_token_s
        + c.api_per_chunk_s
    )
    assert c.api_c1_overhead_s + c.api_c1_overhead_per_prompt_token_s * prompt > loop_cpu
    assert 0 < c.api_loop_per_prompt_token_s < c.api_per_prompt_token_s
    # What is left is latency on no serial core: positive, and the same c=1 total once the loop CPU is added back.
    api = c.api_server(1.0)
    assert api.latency_s > 0
    assert api.latency_s + loop_cpu - c.api_loop_per_prompt_token_s * prompt == pytest.approx(c.api_c1_overhead_s)
