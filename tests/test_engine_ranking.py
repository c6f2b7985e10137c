"""benchmarks/engine_ranking.py and the published engine runs it replays (its accuracy is reported, not tested)."""

from __future__ import annotations


import pytest
import yaml

from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.sim.engines import ENGINES
from support.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def ranking():
    return load_benchmark("engine_ranking")


@pytest.fixture(scope="module")
def entries(ranking):
    return yaml.safe_load(ranking.RUNS.read_text())


def test_every_entry_names_its_source_and_what_it_assumed(entries):
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        assert e["source"]["url"].startswith("https://") and e["source"]["location"], e["id"]
        assert e["assumed"], e["id"]
        assert len(e["measured"]) >= 2 and set(e["measured"]) <= set(ENGINES), e["id"]
        assert set(e["measured"]) <= set(e["flags"]) and set(e["measured"]) <= set(e["versions"]), e["id"]
        get_gpu(e["gpu"])
        get_model(e["model"])
        if "excluded" in e:
            assert isinstance(e["excluded"], str) and e["excluded"].strip(), e["id"]


def test_lengths_entries_point_at_the_sources_own_requests(ranking, entries):
    lengths = yaml.safe_load(ranking.LENGTHS.read_text())
    for e in entries:
        if e.get("lengths"):
            assert len(lengths[e["lengths"]]["input_lens"]) >= e["workload"]["num_prompts"], e["id"]


@pytest.mark.slow
def test_every_scored_run_replays_on_every_engine_it_names(ranking, entries, tmp_path):
    scored = [e for e in entries if not e.get("excluded")]
    assert scored
    for e in scored:
        for engine in e["measured"]:
            assert ranking.predict(e, engine, tmp_path, max_prompts=3) > 0, (e["id"], engine)


def test_drawn_sharegpt_lengths_pass_vllms_sampler_filter(ranking):
    run = {"id": "t", "workload": {"input_len": 230, "output_len": 203, "sharegpt": True, "num_prompts": 1000}}
    specs = list(ranking.load_plan(run, vocab=1000).requests)
    assert len(specs) == 1000
    assert [s.index for s in specs] == list(range(1000))
    assert max(len(s.prompt_ids) for s in specs) <= 1024
    assert max(len(s.prompt_ids) + s.max_tokens for s in specs) <= 2048
    assert min(min(len(s.prompt_ids), s.max_tokens) for s in specs) >= 4


def test_a_prompt_spread_leaves_every_output_at_the_clients_max_tokens(ranking):
    run = {
        "id": "t",
        "workload": {
            "input_len": 1875,
            "input_range_ratio": 0.3333,
            "output_len": 2000,
            "max_concurrency": 50,
            "num_prompts": 50,
        },
    }
    plan = ranking.load_plan(run, vocab=1000)
    specs = list(plan.requests)
    assert plan.max_concurrency == 50
    assert {s.max_tokens for s in specs} == {2000}
    prompts = [len(s.prompt_ids) for s in specs]
    assert 1250 <= min(prompts) < max(prompts) <= 2500


def test_stated_versions_pick_the_vllm_release(ranking):
    assert ranking.stated_version("0.9.0 (V1)") == "0.9"
    assert ranking.stated_version("0.20.1") == "0.20"
    assert ranking.stated_version("not stated") is None


def test_a_three_engine_run_is_scored_on_every_pair(ranking):
    measured = {"vllm": 100.0, "sglang": 120.0, "trtllm": 150.0}
    predicted = {"vllm": 100.0, "sglang": 110.0, "trtllm": 165.0}
    pairs = {(a, b): error for a, b, error in ranking.pair_errors(measured, predicted)}
    assert set(pairs) == {("trtllm", "sglang"), ("trtllm", "vllm"), ("sglang", "vllm")}
    assert pairs[("trtllm", "vllm")] == pytest.approx(0.10)
    assert pairs[("sglang", "vllm")] == pytest.approx(110 / 120 - 1)
    # Both ratios to the slowest within 15%, the third pair outside: it is scored, not implied.
    assert pairs[("trtllm", "sglang")] == pytest.approx((165 / 110) / (150 / 120) - 1)
    assert pairs[("trtllm", "sglang")] > 0.15


def test_a_two_engine_run_has_one_pair(ranking):
    assert [(a, b) for a, b, _ in ranking.pair_errors({"vllm": 2.0, "sglang": 3.0}, {"vllm": 1.0, "sglang": 1.0})] == [
        ("sglang", "vllm")
    ]


def test_a_tensorrt_llm_side_replays_with_its_llm_api_options(ranking, tmp_path):
    # No scored run has a TensorRT-LLM side yet: its replay path (flags + --extra_llm_api_options YAML) is checked here.
    run = {
        "id": "t",
        "gpu": "H100-SXM",
        "model": "Llama-3.1-8B",
        "versions": {},
        "flags": {"trtllm": "--max_batch_size 8", "trtllm_options": {"kv_cache_config": {"enable_block_reuse": False}}},
        "workload": {"input_len": 128, "output_len": 16, "max_concurrency": 4, "num_prompts": 4},
    }
    assert ranking.predict(run, "trtllm", tmp_path) > 0
    assert (tmp_path / "t-trtllm.yaml").exists()
