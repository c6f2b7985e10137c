"""benchmarks/gpu_accuracy.py replays every published run (its accuracy is reported, not tested)."""

from __future__ import annotations


import numpy as np
import pytest
import yaml
from support.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def accuracy():
    return load_benchmark("gpu_accuracy")


def test_published_lengths_match_their_entries(accuracy):
    lengths = yaml.safe_load(accuracy.LENGTHS.read_text())
    entries = {e["id"]: e for e in accuracy.published_entries()}
    for key, lens in lengths.items():
        entry = entries[key]
        assert entry["lengths"] == key
        assert len(lens["input_lens"]) == len(lens["output_lens"]) == entry["workload"]["num_prompts"]
        assert sum(lens["input_lens"]) / len(lens["input_lens"]) == pytest.approx(
            entry["workload"]["mean_input_len"], abs=0.06
        )
        assert sum(lens["output_lens"]) / len(lens["output_lens"]) == pytest.approx(
            entry["workload"]["mean_output_len"], abs=0.06
        )


def test_every_run_is_replayable_on_a_few_prompts(accuracy):
    rows, skipped = accuracy.run(max_prompts=3)
    assert {e["id"] for e, _ in skipped} == {"inferencebench-h100-llama31-8b-c1", "inferencebench-h100-llama31-8b-c16"}
    assert len(rows) + len(skipped) == len(accuracy.published_entries())
    for row in rows:
        assert row.prompts == min(3, row.entry["workload"]["num_prompts"]), row.entry["id"]
        assert any(row.error(m) is not None for m in row.entry["measured"]), row.entry["id"]
    text = accuracy.report(rows, skipped)
    assert "| metric | runs | MAPE | median abs error | MPE (signed) |" in text
    assert all(row.entry["id"] in text for row in rows)


def test_the_replay_is_deterministic(accuracy):
    one = accuracy.run({"musgrave-a100-40gb-llama31-8b-c8"}, max_prompts=16)[0][0]
    two = accuracy.run({"musgrave-a100-40gb-llama31-8b-c8"}, max_prompts=16)[0][0]
    assert one.predicted["output_throughput"] == two.predicted["output_throughput"]


def test_a_prompt_pool_resends_the_same_prompts_in_one_cycle(accuracy):
    """inference-perf's shared-prefix load: `prompt_pool` distinct prompts, resent whole in a fixed order."""
    entry = next(e for e in accuracy.published_entries() if e["workload"].get("prompt_pool"))
    w = entry["workload"]
    pool, groups, prefix_len = w["prompt_pool"], w["num_prefixes"], w["prefix_len"]
    plan = accuracy._plan(entry, {}, 32_000, 3 * pool)
    specs = list(plan.requests)
    prompts = [tuple(int(t) for t in s.prompt_ids) for s in specs]
    assert len(set(prompts)) == pool
    assert prompts[:pool] == prompts[pool : 2 * pool] == prompts[2 * pool :]
    assert {len(p) for p in prompts} == {round(w["mean_input_len"])}
    assert {s.max_tokens for s in specs} == {w["mean_output_len"]}
    by_group: dict[int, set[tuple[int, ...]]] = {}
    for spec, prompt in zip(specs, prompts):
        by_group.setdefault(spec.prefix_group, set()).add(prompt[:prefix_len])
    assert len(by_group) == groups and all(len(prefixes) == 1 for prefixes in by_group.values())
    times = [s.arrival_time for s in specs]
    assert times == sorted(times) and times[-1] > 0


def test_held_out_scoring_leaves_out_the_source_a_constant_was_read_off(accuracy):
    """The eager launch cost is read off staru09's C=20 run: its C=50 sibling matches by construction and is not scored;
    an open loop served at its offered rate keeps its latencies in the score but not its throughput."""
    rows, _ = accuracy.run(
        {"staru09-a100-80gb-llama31-8b-c50", "kvcached-h100-qwen3-0.6b-poisson16-seed42"}, max_prompts=60
    )
    sibling, poisson = sorted(rows, key=lambda r: r.entry["id"].startswith("kvcached"))
    assert sibling.by_construction and not sibling.scored and sibling.scored_error("mean_tpot_ms") is None
    assert poisson.scored and poisson.scored_error("mean_ttft_ms") is not None
    assert poisson.served_at_offered_rate == (poisson.regime != accuracy.Regime.SATURATED)
    assert (poisson.scored_error("request_throughput") is None) == poisson.served_at_offered_rate
    table = accuracy.residual_table(rows)
    assert {
        r.run
        for regimes in table.values()
        for limits in regimes.values()
        for metrics in limits.values()
        for rs in metrics.values()
        for r in rs
    } == {poisson.entry["id"]}


def test_the_client_warm_up_runs_first_and_is_left_out_of_the_scored_records(accuracy):
    """inference-bench's client runs the first 2C prompts to completion before the measured ones: the replay sends
    them first, sends the measured requests once they have drained, and scores only the measured ones, with the
    throughput the source's formula gives (C x output / sum of E2E)."""
    entry = next(e for e in accuracy.published_entries() if e["id"] == "inference-bench-l4-qwen25-7b-long-c16")
    published = yaml.safe_load(accuracy.LENGTHS.read_text())
    deployment = accuracy.specs_deployment(entry)
    plan, warmup = accuracy.warmed_plan(entry, published, deployment, 5)
    specs = list(plan.requests)
    assert warmup == 32 and len(specs) == 32 + 5
    assert {s.arrival_time for s in specs[:warmup]} == {0.0}
    assert {s.arrival_time for s in specs[warmup:]} == {plan.warmup} and plan.warmup > 0
    row = accuracy.replay(entry, published, 5)
    assert row.prompts == row.predicted["completed"] == 5
    sum_e2e = row.predicted["mean_e2el_ms"] / 1000 * 5
    assert row.predicted["output_throughput"] == pytest.approx(16 * 5 * 512 / sum_e2e)


def test_the_sharegpt_stand_in_holds_only_what_the_clients_keep_at_the_published_means(accuracy):
    """vLLM's and SGLang's ShareGPT samplers drop prompts over 1,024 tokens and pairs over 2,048 (and under 4): the
    stand-in does too, at the published means, where the unfiltered lognormal sends replies thousands of tokens long."""
    lengths = accuracy.sharegpt_stand_in(215.3, 197.1, 1000)
    prompts, replies = np.array(lengths["input_lens"]), np.array(lengths["output_lens"])
    assert len(prompts) == len(replies) == 1000
    assert prompts.min() >= 4 and replies.min() >= 4 and prompts.max() <= 1024 and (prompts + replies).max() <= 2048
    assert prompts.mean() == pytest.approx(215.3, rel=0.01) and replies.mean() == pytest.approx(197.1, rel=0.01)
    assert np.median(replies) < 0.8 * replies.mean()  # still skewed: most replies short, a few long


def test_a_sharegpt_run_is_replayed_at_the_stand_ins_lengths_on_its_arrivals(accuracy):
    """A ShareGPT entry's plan sends the stand-in's lengths (no reply past what the clients keep) at its request
    rate."""
    entry = {
        "id": "x",
        "workload": {
            "dataset": "sharegpt",
            "num_prompts": 200,
            "request_rate": 4,
            "max_concurrency": None,
            "mean_input_len": 230.0,
            "mean_output_len": 194.0,
        },
    }
    plan = accuracy._plan(entry, {}, 1000, None)
    specs = list(plan.requests)
    lengths = accuracy.sharegpt_stand_in(230.0, 194.0, 200)
    assert [len(s.prompt_ids) for s in specs] == lengths["input_lens"]
    assert [s.max_tokens for s in specs] == lengths["output_lens"]
    arrivals = [s.arrival_time for s in specs]
    assert arrivals == sorted(arrivals) and 30 < arrivals[-1] < 70  # 200 requests at 4/s
