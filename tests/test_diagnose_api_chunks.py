"""diagnose prices the API server's streaming by the chunks the run streamed, not one chunk per token.

vLLM's API server pays per output token and per SSE chunk (perf/vllm_cpu_costs.py); one that falls behind merges a
request's tokens into fewer chunks, so its work per request falls as its load rises. A run's records carry every
chunk's arrival, so the evidence counts them, and the API server's load is priced from that count.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.diagnose import findings as fk
from servelab.diagnose.analysis import analyse
from servelab.diagnose.evidence import gather
from servelab.diagnose.scenario import simulate, synthetic
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.schemas.vocabulary import DiagnosisSource
from servelab.targets.deployment import build_deployment

SLOW_CHUNKS = ApiServerCosts(per_request_s=1e-3, per_output_token_s=20e-6, per_chunk_s=2e-3, per_output_step_s=1e-4)
"""An API server whose chunks cost far more than the engine's steps take: it falls behind at 48 streams."""


def _run(api: ApiServerCosts):
    d = replace(build_deployment("h100", "llama-3.1-8b"), api=api)
    scenario = synthetic(128, 64, max_concurrency=48, num_requests=96)
    return d, scenario, simulate(d, scenario)


def test_the_evidence_counts_the_chunks_a_lagging_api_server_merged():
    _, _, run = _run(SLOW_CHUNKS)
    e = gather(run)
    ok = [r for r in run.records if r.ok]
    assert e.mean_chunks == pytest.approx(sum(len(r.chunk_times) for r in ok) / len(ok))
    assert e.mean_chunks < 0.5 * e.mean_output_tokens  # behind: several tokens a chunk


def test_the_api_servers_load_is_priced_from_the_chunks_streamed():
    d, scenario, run = _run(SLOW_CHUNKS)
    dx = analyse(d, scenario, run, source=DiagnosisSource.SIMULATED_RUN, with_recommendations=False)
    e = dx.evidence
    assert e.mean_chunks is not None
    a = d.api
    work = a.per_request_s + a.per_prompt_token_s * e.mean_input_tokens
    work += a.per_output_token_s * e.mean_output_tokens + a.per_chunk_s * e.mean_chunks
    one_per_token = work + a.per_chunk_s * (e.mean_output_tokens - e.mean_chunks)
    frontend = next(f for f in dx.findings if f.kind == fk.FRONTEND_CPU_BOUND)
    line = next(x for x in frontend.evidence if "ms of CPU per request" in x)
    assert f"spends {1e3 * work:.2f} ms of CPU per request" in line
    assert f"{1e3 * one_per_token:.2f} ms" not in line


def test_records_without_chunk_times_price_one_chunk_per_token():
    _, _, run = _run(SLOW_CHUNKS)
    for r in run.records:
        r.chunk_times = []
    assert gather(run).mean_chunks is None
