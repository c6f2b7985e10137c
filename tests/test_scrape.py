from servelab.metrics import timeline
from servelab.metrics.scrape import parse_metrics

EXPOSITION = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 123.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:gpu_cache_usage_perc KV-cache usage (old name).
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:time_to_first_token_seconds Histogram of TTFT.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.75
"""


def test_vllm_metrics_map_to_timeline_names_summed_over_engines():
    values = parse_metrics(EXPOSITION)
    assert values[timeline.RUNNING] == 5.0
    assert values[timeline.KV_USAGE] == 0.375  # a fraction: averaged, not summed
    assert values[timeline.PREEMPTIONS] == 7.0
    assert values[timeline.TTFT_SUM] == 0.75 and values[timeline.TTFT_COUNT] == 5.0
    assert not any("bucket" in k or "created" in k or k.startswith("python") for k in values)


def test_absent_metrics_are_simply_absent():
    assert parse_metrics("") == {}
    assert timeline.WAITING not in parse_metrics(EXPOSITION)
