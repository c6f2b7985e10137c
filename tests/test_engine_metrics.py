"""Each engine's /metrics mapped onto the timeline's common names, on the fixtures in tests/fixtures/engine_metrics."""

from pathlib import Path

import pytest

from servelab.metrics import engines
from servelab.metrics import timeline as tl
from servelab.metrics.scrape import parse_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "engine_metrics"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_sglang_metrics_fill_the_common_names_and_keep_their_own():
    values = parse_metrics(fixture("sglang.prom"))
    assert values[tl.RUNNING] == 20  # summed over the two DP ranks
    assert values[tl.WAITING] == 4
    assert values[tl.KV_USAGE] == pytest.approx(0.4)  # a fraction: averaged over the ranks
    assert values[tl.PREEMPTIONS] == 5  # retractions
    assert values[tl.PROMPT_TOKENS] == values[tl.PREFIX_QUERIES] == 10_000  # streaming and not
    assert values[tl.PREFIX_HITS] == 3_500  # device and host cache
    assert values[tl.GENERATION_TOKENS] == 1_500
    assert values[tl.QUEUE_TIME_COUNT] == 4 and values[tl.QUEUE_TIME_SUM] == pytest.approx(0.5)
    assert values[tl.TTFT_COUNT] == 2 and values[tl.TTFT_SUM] == pytest.approx(1.0)
    assert values[tl.E2E_COUNT] == 1
    # the engine's own names are kept, mapped or not
    assert values["sglang:num_running_reqs"] == 20
    assert values["sglang:cache_hit_rate"] == pytest.approx(0.4)
    assert values["sglang:new_token_ratio"] == pytest.approx(0.4)
    assert not any("bucket" in k or "created" in k for k in values)


def test_trtllm_metrics_fill_the_common_names_and_keep_their_own():
    values = parse_metrics(fixture("trtllm.prom"))
    assert values[tl.RUNNING] == 16 and values[tl.WAITING] == 2
    assert values[tl.KV_USAGE] == pytest.approx(0.45)
    assert values[tl.PROMPT_TOKENS] == values[tl.PREFIX_QUERIES] == 12_000
    assert values[tl.PREFIX_HITS] == 3_000
    assert values[tl.GENERATION_TOKENS] == 2_400
    assert values[tl.QUEUE_TIME_SUM] == pytest.approx(0.4) and values[tl.QUEUE_TIME_COUNT] == 2
    assert values[tl.PREFILL_TIME_SUM] == pytest.approx(0.4) and values[tl.DECODE_TIME_SUM] == pytest.approx(3.0)
    assert values["trtllm_kv_cache_hit_rate"] == pytest.approx(0.25)
    assert tl.PREEMPTIONS not in values  # trtllm-serve exports no preemption counter: absent, not zero


def test_engine_is_detected_from_the_names():
    assert engines.detect(fixture("sglang.prom")) is engines.SGLANG
    assert engines.detect(fixture("trtllm.prom")) is engines.TRTLLM
    assert engines.detect("llamacpp:requests_processing 1\n") is engines.LLAMACPP
    assert engines.detect("vllm:num_requests_running 1\n") is engines.VLLM
    assert engines.detect("python_gc_objects_collected_total 1\n") is None


def test_an_engine_named_reads_only_its_own_names():
    assert parse_metrics(fixture("sglang.prom"), engines.TRTLLM) == {}
