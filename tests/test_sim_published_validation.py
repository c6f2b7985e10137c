"""benchmarks/gpu_accuracy.py replays every published run (its accuracy is reported, not tested)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_accuracy.py"


@pytest.fixture(scope="module")
def accuracy():
    spec = importlib.util.spec_from_file_location("gpu_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_published_lengths_match_their_entries(accuracy):
    lengths = yaml.safe_load(accuracy.LENGTHS.read_text())
    entries = {e["id"]: e for e in accuracy.published_entries()}
    for key, lens in lengths.items():
        entry = entries[key]
        assert entry["lengths"] == key
        assert len(lens["input_lens"]) == len(lens["output_lens"]) == entry["workload"]["num_prompts"]
        assert sum(lens["input_lens"]) / len(lens["input_lens"]) == pytest.approx(entry["workload"]["mean_input_len"], abs=0.06)
        assert sum(lens["output_lens"]) / len(lens["output_lens"]) == pytest.approx(entry["workload"]["mean_output_len"], abs=0.06)


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
