"""benchmarks/holdout_moe.py and its held-out MoE runs (their accuracy is reported by the script, never tested)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.perf.published import PUBLISHED_MOE, published_entries
from support.benchmark_script import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def holdout():
    return load_benchmark("holdout_moe")


@pytest.fixture(scope="module")
def entries(holdout):
    return holdout.holdout_entries()


def test_every_run_names_its_source_engine_and_relation(entries):
    ids = [e["id"] for e in entries]
    assert len(ids) >= 12 and len(ids) == len(set(ids))
    for e in entries:
        assert e["source"]["url"].startswith("https://") and e["source"]["location"], e["id"]
        assert e["engine"] in ("vllm", "sglang") and e["relation"] in ("independent", "gpustack-sibling"), e["id"]
        assert e["era"] in ("v0", "v1") and e["measured"]["request_throughput"] > 0, e["id"]
        get_gpu(e["gpu"])
        assert get_model(e["model"]).moe is not None, e["id"]


def test_no_run_is_one_published_moe_yaml_scores(entries):
    """Held out by construction: not the same run, source block or numbers as a run the MoE table is built on."""
    published = published_entries(PUBLISHED_MOE)
    taken_urls = {p["source"]["url"] for p in published}
    taken_numbers = {(p["measured"]["request_throughput"], p["measured"].get("output_throughput")) for p in published}
    for e in entries:
        assert e["id"] not in {p["id"] for p in published}, e["id"]
        assert e["source"]["url"] not in taken_urls, e["id"]
        assert (e["measured"]["request_throughput"], e["measured"].get("output_throughput")) not in taken_numbers, e[
            "id"
        ]


def test_every_run_builds_its_deployment_and_replays(holdout, entries):
    """Each run's settings build a deployment and its load replays (two requests: a smoke check, not the table)."""
    results = holdout.replay_all(entries, max_prompts=2)
    assert [r["id"] for r in results] == [e["id"] for e in entries]
    for r in results:
        assert "refused" not in r, r
        assert r["predicted"]["request_throughput"] > 0, r["id"]


def test_an_open_loop_served_at_its_rate_scores_no_throughput(holdout):
    entry = {"workload": {"request_rate": 2.0}, "measured": {"request_throughput": 1.8, "mean_ttft_ms": 100.0}}
    served = {"regime": "under_capacity", "predicted": {"request_throughput": 2.0, "mean_ttft_ms": 150.0}}
    assert holdout.errors(entry, served) == {"mean_ttft_ms": pytest.approx(0.5)}
    saturated = {**served, "regime": "saturated"}
    assert holdout.errors(entry, saturated)["request_throughput"] == pytest.approx(2.0 / 1.8 - 1)


def test_code_dir_that_is_not_a_checkout_is_refused_before_any_replay(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "holdout_moe.py"), "--code-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and f"--code-dir {tmp_path}: not a servelab checkout" in done.stderr


def test_code_dir_replays_with_that_checkouts_servelab():
    """The side-by-side path: a subprocess importing the given checkout's servelab (checked), tables per checkout."""
    root = BENCHMARKS.parent
    run_id = "vllm-pr23151-qwen3-30b-a3b-h100-tp1-random2048-c10"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "holdout_moe.py"),
            "--code-dir",
            str(root),
            "--only",
            run_id,
            "--max-prompts",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert f"### {root} @ " in done.stdout and run_id in done.stdout and "### Side by side" in done.stdout


def test_an_sglang_run_is_built_on_sglangs_engine_model_from_its_own_flags(holdout, entries):
    """SGLang runs replay on SGLang's scheduler and defaults (its flags as published), vLLM runs on gpu_accuracy's."""
    by_id = {e["id"]: e for e in entries}
    sglang = holdout.engine_deployment(by_id["sglang-pr7631-deepseek-v3-h20-tp8-sglang-random1024-c8"])
    assert sglang.engine == "sglang" and sglang.config.tensor_parallel_size == 8
    assert sglang.config.max_model_len == 4096 and not sglang.config.enable_prefix_caching
    assert holdout.engine_deployment(by_id["vllm-pr23696-gpt-oss-120b-b200-tp8-sharegpt"]) is None
