"""Workloads: length distributions, datasets and arrival processes, deterministic under a seed."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from servelab.workload.arrival import ArrivalConfig, arrival_times, schedule
from servelab.workload.datasets import WorkloadConfig, open_dataset
from servelab.workload.errors import WorkloadError
from servelab.workload.lengths import LengthDistribution
from servelab.workload.plan import Amount, build_plan
from servelab.workload.tokenizer import SYNTHETIC_ID_RANGE, PromptTokenizer

TINY_MODEL = Path(os.environ.get("SERVELAB_TINY_MODEL", Path.home() / ".cache" / "servelab" / "tiny-model"))
needs_tokenizer = pytest.mark.skipif(not (TINY_MODEL / "tokenizer.json").is_file(), reason="tiny model not built")


def specs(cfg: WorkloadConfig, n: int, arrival: ArrivalConfig | None = None):
    return list(build_plan(cfg, arrival or ArrivalConfig(), Amount(num_prompts=n)).requests)


# -- lengths ------------------------------------------------------------------


def test_uniform_follows_vllm_range_ratio():
    lengths = LengthDistribution(100, "uniform", 0.5).sample(20_000, np.random.default_rng(1))
    assert lengths.min() == 50 and lengths.max() == 150
    assert abs(lengths.mean() - 100) < 1


@pytest.mark.parametrize("shape", ["normal", "lognormal"])
def test_normal_and_lognormal_have_the_mean_and_cv(shape):
    lengths = LengthDistribution(500, shape, 0.3).sample(50_000, np.random.default_rng(2))
    assert abs(lengths.mean() - 500) < 5
    assert abs(lengths.std() / lengths.mean() - 0.3) < 0.01
    assert lengths.min() >= 1


def test_lengths_are_clipped_to_one():
    lengths = LengthDistribution(2, "normal", 3.0).sample(1000, np.random.default_rng(3))
    assert lengths.min() == 1


def test_fixed_and_bad_distributions():
    assert set(LengthDistribution(7, "fixed", 0.9).sample(10, np.random.default_rng(0))) == {7}
    with pytest.raises(WorkloadError, match="unknown length distribution"):
        LengthDistribution(7, "zipf")
    with pytest.raises(WorkloadError, match="range-ratio"):
        LengthDistribution(7, "uniform", 1.0)


# -- random / prefix / multiturn ----------------------------------------------


def test_random_is_deterministic_and_seed_dependent():
    cfg = WorkloadConfig(input_len=64, output_len=16, range_ratio=0.5, seed=5)
    a, b = specs(cfg, 50), specs(cfg, 50)
    c = specs(WorkloadConfig(input_len=64, output_len=16, range_ratio=0.5, seed=6), 50)
    assert [s.prompt_ids.tolist() for s in a] == [s.prompt_ids.tolist() for s in b]
    assert [s.max_tokens for s in a] == [s.max_tokens for s in b]
    assert [s.prompt_ids.tolist() for s in a] != [s.prompt_ids.tolist() for s in c]


def test_synthetic_ids_stay_in_the_safe_range_without_text():
    out = specs(WorkloadConfig(input_len=300, output_len=8), 20)
    ids = np.concatenate([s.prompt_ids for s in out])
    assert ids.min() >= SYNTHETIC_ID_RANGE[0] and ids.max() < SYNTHETIC_ID_RANGE[1]
    assert all(s.prompt_len == 300 and s.max_tokens == 8 and s.prompt_text is None for s in out)
    assert [s.index for s in out] == list(range(20))


def test_many_long_prompts_are_numpy_arrays():
    out = specs(WorkloadConfig(input_len=1500, output_len=200), 10_000)
    assert len(out) == 10_000
    assert all(isinstance(s.prompt_ids, np.ndarray) and s.prompt_ids.dtype == np.int32 for s in out[:10])


def test_prefix_tokens_are_really_shared():
    cfg = WorkloadConfig(dataset_name="prefix", prefix_len=40, num_prefixes=3, input_len=10, output_len=4)
    out = specs(cfg, 60)
    groups = {s.prefix_group for s in out}
    assert groups == {0, 1, 2}
    by_group: dict[int, list] = {}
    for s in out:
        assert s.prefix_len == 40 and s.prompt_len == 50
        by_group.setdefault(s.prefix_group, []).append(s.prompt_ids)
    heads = {g: {tuple(ids[:40].tolist()) for ids in v} for g, v in by_group.items()}
    assert all(len(h) == 1 for h in heads.values())
    assert len({next(iter(h)) for h in heads.values()}) == 3
    assert len({tuple(s.prompt_ids[40:].tolist()) for s in out}) == 60


def test_multiturn_resends_history_and_depends_on_the_previous_turn():
    cfg = WorkloadConfig(dataset_name="multiturn", turns=3, think_time=0.5, input_len=20, output_len=5)
    out = specs(cfg, 7, ArrivalConfig(request_rate=4))
    assert [s.depends_on for s in out] == [None, 0, 1, None, 3, 4, None]
    assert [s.think_time for s in out[:3]] == [0.0, 0.5, 0.5]
    first, second, third = out[:3]
    assert second.prompt_ids[: first.prompt_len].tolist() == first.prompt_ids.tolist()
    assert second.prompt_len == first.prompt_len + first.max_tokens + 20
    assert third.prompt_ids[: second.prompt_len].tolist() == second.prompt_ids.tolist()
    assert second.arrival_time == first.arrival_time and out[3].arrival_time > first.arrival_time


@needs_tokenizer
def test_tokenizer_prompts_have_exact_lengths():
    tok = PromptTokenizer(TINY_MODEL)
    cfg = WorkloadConfig(input_len=128, output_len=8, range_ratio=0.5, tokenizer=TINY_MODEL)
    out = specs(cfg, 40)
    for s in out:
        assert s.prompt_text is not None and s.messages == [{"role": "user", "content": s.prompt_text}]
        assert tok.encode(s.prompt_text).tolist() == s.prompt_ids.tolist()
        assert all(c.isprintable() or c in "\n\t" for c in s.prompt_text)
    assert len({s.prompt_len for s in out}) > 1


@needs_tokenizer
def test_prefix_with_tokenizer_puts_the_shared_text_in_the_system_message():
    cfg = WorkloadConfig(
        dataset_name="prefix", prefix_len=30, num_prefixes=2, input_len=10, output_len=4, tokenizer=TINY_MODEL
    )
    out = specs(cfg, 10)
    systems = {s.prefix_group: s.messages[0]["content"] for s in out}
    assert all(s.messages[0] == {"role": "system", "content": systems[s.prefix_group]} for s in out)
    assert len(PromptTokenizer(TINY_MODEL).encode(systems[out[0].prefix_group])) == 30


# -- sharegpt / jsonl -----------------------------------------------------------


def sharegpt_file(tmp_path: Path) -> Path:
    entries = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": f"question {i} " * 10},
                {"from": "gpt", "value": "answer " * (5 + i)},
            ],
        }
        for i in range(6)
    ]
    entries.append({"id": "short", "conversations": [{"from": "human", "value": "only one turn"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_takes_the_first_turns_and_estimates_without_tokenizer(tmp_path):
    path = sharegpt_file(tmp_path)
    plan = build_plan(
        WorkloadConfig(dataset_name="sharegpt", dataset_path=path), ArrivalConfig(), Amount(num_prompts=9)
    )
    out = list(plan.requests)
    assert len(out) == 9  # oversampled past the 6 usable conversations
    assert all(s.prompt_text.startswith("question") for s in out)
    assert all(s.max_tokens == round(len("answer " * (5 + int(s.prompt_text.split()[1]))) / 4) for s in out)
    assert "lengths_estimated" in plan.description["dataset_notes"]


@needs_tokenizer
def test_sharegpt_with_tokenizer_counts_real_tokens(tmp_path):
    path = sharegpt_file(tmp_path)
    tok = PromptTokenizer(TINY_MODEL)
    out = specs(WorkloadConfig(dataset_name="sharegpt", dataset_path=path, tokenizer=TINY_MODEL), 6)
    for s in out:
        assert s.prompt_len == len(tok.encode(s.prompt_text))


def test_jsonl_trace_keeps_timestamps_and_order(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [
        {"prompt": "hello there", "max_tokens": 5, "timestamp": 10.0},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "timestamp": 10.5},
        {"prompt": [1500, 1501, 1502], "max_tokens": 2, "timestamp": 12.0},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    plan = build_plan(
        WorkloadConfig(dataset_name="jsonl", dataset_path=path), ArrivalConfig(max_concurrency=2), Amount()
    )
    out = list(plan.requests)
    assert [s.arrival_time for s in out] == [0.0, 0.5, 2.0]
    assert [s.max_tokens for s in out] == [5, 3, 2]
    assert out[1].messages == [{"role": "user", "content": "hi"}]
    assert out[2].prompt_ids.tolist() == [1500, 1501, 1502]
    assert plan.description["arrival"]["process"].startswith("trace replay")
    with pytest.raises(WorkloadError, match="--request-rate conflicts with the timestamps"):
        build_plan(WorkloadConfig(dataset_name="jsonl", dataset_path=path), ArrivalConfig(request_rate=2), Amount())


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        ('{"prompt": "a", "max_tokens": 2}\n{"prompt": "b", "max_tokens": 2\n', 2, "not valid JSON"),
        ('{"prompt": "a", "max_tokens": 2}\n\n{"prompt": "b"}\n', 3, "max_tokens"),
        ('{"prompt": "a", "messages": [], "max_tokens": 2}\n', 1, "exactly one of"),
        (
            '{"prompt": "a", "max_tokens": 2, "timestamp": 5}\n{"prompt": "b", "max_tokens": 2, "timestamp": 4}\n',
            2,
            "must not decrease",
        ),
        ('{"prompt": "a", "max_tokens": 2, "timestamp": 5}\n{"prompt": "b", "max_tokens": 2}\n', 2, "every line"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message) as err:
        build_plan(WorkloadConfig(dataset_name="jsonl", dataset_path=path), ArrivalConfig(), Amount())
    assert f"{path}:{line}:" in str(err.value)


def test_malformed_sharegpt_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n {"conversations": []},\n {"conversations": [}\n]')
    with pytest.raises(WorkloadError, match=rf"{path}:3: not valid JSON"):
        open_dataset(WorkloadConfig(dataset_name="sharegpt", dataset_path=path), np.random.default_rng(0))
    path.write_text(json.dumps([{"conversations": [{"from": "human"}]}]))
    with pytest.raises(WorkloadError, match="entry 0"):
        open_dataset(WorkloadConfig(dataset_name="sharegpt", dataset_path=path), np.random.default_rng(0))


def test_dataset_flag_clashes():
    with pytest.raises(WorkloadError, match="--dataset-path.*random"):
        WorkloadConfig(dataset_path=Path("x.jsonl"))
    with pytest.raises(WorkloadError, match="needs --dataset-path"):
        WorkloadConfig(dataset_name="sharegpt")
    with pytest.raises(WorkloadError, match="--num-prompts and --duration"):
        Amount(num_prompts=5, duration=3)


# -- arrival --------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_open_loop_rate_and_burstiness(burstiness):
    rng = np.random.default_rng(11)
    times = np.fromiter(arrival_times(8.0, burstiness, rng), float, count=20_000)
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    assert abs(len(gaps) / times[-1] - 8.0) / 8.0 < 0.03
    # gamma(shape k): coefficient of variation 1/sqrt(k); Poisson has CV 1.
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < 0.05


def test_closed_loop_and_all_at_once_send_at_zero():
    out = specs(WorkloadConfig(input_len=4, output_len=2), 10, ArrivalConfig(max_concurrency=3))
    assert {s.arrival_time for s in out} == {0.0}


def test_duration_plan_is_lazy_and_bounded_by_arrivals():
    plan = build_plan(WorkloadConfig(input_len=4, output_len=2), ArrivalConfig(request_rate=50), Amount(duration=20))
    out = list(plan.requests)
    assert plan.duration == 20 and out[-1].arrival_time < 20
    assert abs(len(out) - 1000) < 120


def test_rate_sweep_points_send_the_same_prompts():
    cfg = WorkloadConfig(input_len=16, output_len=4, seed=3)
    slow = specs(cfg, 20, ArrivalConfig(request_rate=1))
    fast = specs(cfg, 20, ArrivalConfig(request_rate=10))
    assert [s.prompt_ids.tolist() for s in slow] == [s.prompt_ids.tolist() for s in fast]
    assert fast[-1].arrival_time < slow[-1].arrival_time


def test_bad_arrival_config_and_empty_schedule():
    with pytest.raises(WorkloadError, match="--request-rate"):
        ArrivalConfig(request_rate=0)
    with pytest.raises(WorkloadError, match="--max-concurrency"):
        ArrivalConfig(max_concurrency=0)
    assert list(schedule(iter([]), ArrivalConfig(), np.random.default_rng(0))) == []
