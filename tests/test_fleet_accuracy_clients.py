"""benchmarks/fleet_accuracy.py: its replays of the published runs' clients and its rule for client-paced points."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from servelab.metrics import timeline as tl
from servelab.metrics.timeline import TimelineSample
from servelab.workload.routing import prefix_key

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fleet_accuracy.py"


@pytest.fixture(scope="module")
def fleet_accuracy():
    spec = importlib.util.spec_from_file_location("fleet_accuracy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_accuracy"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("fleet_accuracy", None)


def test_kubeai_client_cycles_800_prompts_in_one_shuffled_order(fleet_accuracy):
    client = fleet_accuracy.KubeAIClient()
    specs = client.specs()
    assert len(specs) == client.requests
    distinct = {bytes(np.asarray(s.prompt_ids).tobytes()) for s in specs}
    assert len(distinct) == client.prompts
    period = client.prompts
    assert all(np.array_equal(specs[i].prompt_ids, specs[i + period].prompt_ids) for i in range(0, 8000 - period, 97))
    assert all(s.max_tokens == client.message_tokens for s in specs)


def test_kubeai_client_prompts_are_turns_of_threads(fleet_accuracy):
    """A thread's prompts grow by two messages a turn, each extends the one before, and all share the hash key."""
    client = fleet_accuracy.KubeAIClient()
    prompts = client.prompt_ids()
    thread = prompts[: client.turns]
    lengths = [len(p) for p in thread]
    assert lengths == [(2 * t + 1) * client.message_tokens for t in range(client.turns)]
    assert all(np.array_equal(thread[t][: lengths[t - 1]], thread[t - 1]) for t in range(1, client.turns))
    assert len({prefix_key(p) for p in thread}) == 1
    assert prefix_key(prompts[client.turns]) != prefix_key(thread[0])
    mean = np.mean([len(p) for p in prompts])
    assert mean == pytest.approx(client.turns * client.message_tokens, rel=0.02)


def test_client_limited_reads_littles_law_off_the_published_numbers(fleet_accuracy):
    limited = fleet_accuracy.client_limited
    assert limited("kubeai", 800, "prefix-hash", 76.43, 0.28020)
    assert not limited("kubeai", 800, "k8s-service", 50.01, 1.31977)
    assert not limited("kubeai", 8000, "least-load", 52.43, 39.16380)
    assert not limited("llm-d", 3, "random", 2505.7, 1.102)


def test_shared_prefix_client_cycles_whole_prompts(fleet_accuracy):
    """inference-perf sends the same 249 prompts, question included, in one order, over and over within a stage."""
    profile = fleet_accuracy.STAGED["llm-d"]
    client = profile.client
    specs, stages = fleet_accuracy.drained_specs(profile, seed=0)
    stage = [specs[i] for i in stages[max(stages)]]
    count = client.groups * client.per_group
    assert len(stage) > 2 * count
    assert len({np.asarray(s.prompt_ids).tobytes() for s in stage}) == count
    assert all(np.array_equal(stage[i].prompt_ids, stage[i + count].prompt_ids) for i in range(len(stage) - count))
    systems = {np.asarray(s.prompt_ids[: client.system_tokens]).tobytes() for s in stage[:count]}
    assert len(systems) == client.groups
    assert {len(s.prompt_ids) for s in stage} == {client.system_tokens + client.question_tokens}


def test_llmd_tpot_undoes_inference_perf_s_stamps_on_the_blank_line_of_every_event(fleet_accuracy):
    """A stream of N tokens at a steady time per token, stamped the way the report's inference-perf stamped it (every
    line: each event's data line, the blank line just after it, then [DONE] and its blank line): the mean gap
    between stamps is half a token's time, and llmd_tpot_ms gives the token's time back."""
    tokens, tpot_ms = 1000, 26.0
    data_lines = np.arange(tokens) * tpot_ms
    done = data_lines[-1] + tpot_ms
    stamps = np.sort(np.concatenate([data_lines, data_lines, [done, done]]))  # the blank lines come at once
    mean_gap = float(np.mean(np.diff(stamps)))
    assert mean_gap == pytest.approx(tpot_ms / 2, rel=0.01)
    assert fleet_accuracy.llmd_tpot_ms(mean_gap, tokens) == pytest.approx(tpot_ms, rel=0.002)


def test_a_stage_s_hit_rate_is_the_share_of_its_looked_up_tokens_the_caches_held(fleet_accuracy):
    """Counters from the last scrape at or before each end of the window, differenced: vLLM's hits over queries."""

    def sample(t, hits, queries):
        return TimelineSample(t, {tl.PREFIX_HITS: hits, tl.PREFIX_QUERIES: queries})

    samples = [sample(0.0, 0, 0), sample(1.0, 100, 1000), sample(2.0, 1000, 2000), sample(3.0, 1000, 2000)]
    assert fleet_accuracy._hit_rate(samples, 1.5, 2.5) == pytest.approx(0.9)
    assert fleet_accuracy._hit_rate(samples, 0.0, 2.0) == pytest.approx(0.5)
    assert fleet_accuracy._hit_rate(samples, 2.0, 3.0) == 0.0  # nothing looked up


def test_the_73_capacity_client_is_150_groups_of_5_whose_prompts_fill_73_percent_of_the_fleet_s_kv(fleet_accuracy):
    """The report's sizing: 150 x (6,000 + 5 x 1,200) = 1.8 M resident tokens over 8 pods of 307,328, and a warm-up
    that sends one full set of 750 prompts."""
    profile = fleet_accuracy.STAGED["llm-d-73"]
    client = profile.client
    resident = client.groups * (client.system_tokens + client.per_group * client.question_tokens)
    assert resident / (fleet_accuracy.LLMD73.replicas * 307_328) == pytest.approx(0.732, abs=0.001)
    rate, seconds = profile.warmup
    assert rate * seconds == client.groups * client.per_group


def test_a_drained_run_sends_each_stage_after_the_one_before_it_from_its_first_prompt(fleet_accuracy):
    """inference-perf's stages: int(rate x seconds) requests each, numbered from 0 (prompt n mod 750), held until
    the stage before has finished (on its last request), then its pause, its start and each one's offset."""
    profile = fleet_accuracy.STAGED["llm-d-73"]
    specs, stages = fleet_accuracy.drained_specs(profile, seed=0)
    prompts = profile.client.prompt_ids()
    warmup = specs[: int(profile.warmup[0] * profile.warmup[1])]
    assert all(s.depends_on is None for s in warmup)
    assert np.all(np.diff([s.arrival_time for s in warmup]) > 0)
    assert warmup[0].arrival_time >= fleet_accuracy.STAGE_START_S
    previous_last = warmup[-1].index
    for rate, seconds in profile.stages:
        members = [specs[i] for i in stages[rate]]
        assert len(members) == int(rate * seconds)
        assert {s.depends_on for s in members} == {previous_last}
        assert all(s.think_time > fleet_accuracy.STAGE_INTERVAL_S + fleet_accuracy.STAGE_START_S for s in members)
        assert all(np.array_equal(s.prompt_ids, prompts[n % len(prompts)]) for n, s in enumerate(members))
        previous_last = members[-1].index
    assert [s.index for s in specs] == list(range(len(specs)))
