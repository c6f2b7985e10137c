"""HttpTarget against the real vLLM CPU server: the numbers servelab reports are the server's numbers."""

from __future__ import annotations

import pytest

from servelab.metrics import timeline
from servelab.metrics.records import MemorySink
from servelab.targets.http import HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_real_vllm_streams_exact_lengths_and_is_scraped(vllm_server, endpoint):
    specs = [
        RequestSpec(i, [100 + (i * 7 + k) % 900 for k in range(64)], 16, prompt_text=f"request {i} says hello")
        for i in range(8)
    ]
    sink, samples = MemorySink(), []
    target = HttpTarget(vllm_server.base_url, endpoint=endpoint, ignore_eos=True, scrape_interval=0.5)
    result = target.run(LoadPlan(specs, max_concurrency=4), sink, samples.append)
    assert result.server_info["model"] == vllm_server.model_name
    assert len(sink.records) == 8
    for r in sink.records:
        assert r.ok, r.error
        assert r.output_tokens == 16
        assert r.first_token_time is not None and r.first_token_time <= r.finish_time
        if endpoint == "/v1/completions":
            assert r.prompt_tokens == 64
    assert len(samples) >= 2
    generated = timeline.counter_delta(samples, timeline.GENERATION_TOKENS)
    assert generated is not None and generated >= 8 * 16
    stats = result.client_stats
    assert stats["cpu_share"] < 1.0
    # The self-report's structure (whether it warns depends on what else the host runs, so that is a benchmark):
    assert stats["startup_wave"]["requests"] == 4 and stats["mean_steady_send_lag_ms"] is not None
    assert stats["added_delay"]["samples"] >= 1 and stats["added_delay"]["p99_ms"] >= stats["added_delay"]["median_ms"]
    assert stats["reason"].startswith("client kept up") != stats["client_may_be_bottleneck"]
