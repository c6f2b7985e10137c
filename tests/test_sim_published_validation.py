"""benchmarks/published_validation.py runs on the published data (its accuracy is reported, not tested)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "published_validation.py"


@pytest.fixture(scope="module")
def validation():
    spec = importlib.util.spec_from_file_location("published_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_published_lengths_match_their_entries(validation):
    lengths = yaml.safe_load(validation.LENGTHS.read_text())
    entries = {e["id"]: e for e in validation.published_entries()}
    for key, lens in lengths.items():
        entry = entries[key]
        assert entry["lengths"] == key
        assert len(lens["input_lens"]) == len(lens["output_lens"]) == entry["workload"]["num_prompts"]
        assert sum(lens["input_lens"]) / len(lens["input_lens"]) == pytest.approx(entry["workload"]["mean_input_len"], abs=0.06)
        assert sum(lens["output_lens"]) / len(lens["output_lens"]) == pytest.approx(entry["workload"]["mean_output_len"], abs=0.06)


def test_the_script_replays_entries_of_every_length_kind(validation):
    rows, skipped = validation.compare({"musgrave-a100-40gb-llama31-8b-c1", "lambda-a100-80gb-llama3-8b-n80",
                                        "inferencebench-h100-llama31-8b-c1"})
    assert {r.lengths for r in rows} == {"fixed", "published"}
    assert [e["id"] for e in skipped] == ["inferencebench-h100-llama31-8b-c1"]
    for row in rows:
        assert row.predicted["completed"] == row.entry["workload"]["num_prompts"]
        assert row.error("output_throughput") is not None
    text = validation.table(rows, markdown=True)
    assert text.count("\n") == len(rows) + 1 and "lambda-a100-80gb-llama3-8b-n80" in text
