"""A real fleet: two vLLM CPU servers (the tiny model, prefix caching on) serving multi-turn chats that share system
prompts, behind servelab's own routes (several --base-url) and behind vLLM's own router (vllm-router, a wheel from
PyPI, where its venv is installed), each replica's /metrics scraped alongside; then `simulate` of the same fleet,
calibrated from one of its servers, with the same routers.

What is asserted is structural: routes that keep a conversation on one replica (session, prefix-hash) hit the
replicas' prefix caches more than round-robin, measured and simulated alike. The numbers (printed with -s) are in
docs/fleets.md; timings on this shared 2-core host, with both servers on it, are not asserted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics import timeline as tl
from servelab.metrics.results import load_run
from servelab.targets.server_process import ServerProcess, free_port, vllm_cpu_server

pytestmark = pytest.mark.vllm
runner = CliRunner()

ENGINE_ARGS = ("--max-model-len", "4096", "--max-num-seqs", "32", "--enable-prefix-caching")
SIM_ENGINE_ARGS = "--max-model-len 4096 --max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1073741824"
"""The servers' flags as the simulator reads them: the CPU backend's 128-token blocks and 1 GiB of KV."""
CHATS = (
    "--dataset-name",
    "multiturn",
    "--multiturn-turns",
    "4",
    "--prefix-len",
    "256",
    "--num-prefixes",
    "96",
    "--random-input-len",
    "128",
    "--random-output-len",
    "16",
    "--num-prompts",
    "384",
    "--max-concurrency",
    "32",
    "--ignore-eos",
)
"""96 chats of 4 turns, each opening with one of 96 system prompts (drawn at random, so some are shared) of two
128-token blocks; 32 requests in flight. prefix-hash keys a chat on its first user message (as KubeAI does), so
each chat has its own key, and its load bound (a replica takes a request while it holds at most 1.25x the mean in
flight) moves a turn off its home replica now and then: with 32 in flight that binds rarely, with 8 it bound
often enough that the route's hits depended on the hash's luck."""
ROUTER_VENV = Path(os.environ.get("SERVELAB_ROUTER_VENV", Path.home() / ".cache" / "servelab" / "router-venv"))
"""A venv with `pip install vllm-router` (the vLLM project's Rust router, a manylinux wheel)."""
OWN_ROUTES = ("round-robin", "prefix-hash", "session")
VLLM_ROUTER_POLICIES = ("round_robin", "consistent_hash")


@pytest.fixture(scope="module")
def fleet(_vllm_pool, vllm_python: Path, tiny_model: Path, tmp_path_factory) -> Iterator[list[ServerProcess]]:
    """Two servers at once (the session's default one is stopped first: the host has two cores)."""
    _vllm_pool.stop_default()
    logs = tmp_path_factory.mktemp("fleet-logs")
    servers = []
    try:
        for i in range(2):
            servers.append(
                vllm_cpu_server(
                    vllm_python,
                    tiny_model,
                    log_path=logs / f"replica-{i}.log",
                    served_model_name="tiny-qwen",
                    extra_args=ENGINE_ARGS,
                ).start()
            )
        yield servers
    finally:
        for server in servers:
            server.stop()


def _bench(out: Path, urls: list[str], *args: str) -> list[dict]:
    result = runner.invoke(
        app,
        [
            "bench",
            *[a for url in urls for a in ("--base-url", url)],
            "--model",
            "tiny-qwen",
            *CHATS,
            "--scrape-interval",
            "0.5",
            "--result-dir",
            str(out),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    return load_run(out).run_info.server_info.replicas  # each replica's load, as bench scraped it


def _hit_rate(replicas: list[dict]) -> float:
    return sum(r["prefix_cache_hits"] for r in replicas) / sum(r["prefix_cache_queries"] for r in replicas)


def _row(name: str, replicas: list[dict], summary: dict) -> str:
    shares = " / ".join(f"{r['requests_served']}: {r['prefix_cache_hit_rate']:.0%}" for r in replicas)
    return (
        f"| {name} | {_hit_rate(replicas):.0%} | {shares} | {summary['request_throughput']:.2f} "
        f"| {summary['mean_ttft_ms']:.0f} |"
    )


def _vllm_router(policy: str, urls: list[str], log: Path) -> ServerProcess:
    port = free_port("127.0.0.1")
    argv = [
        str(ROUTER_VENV / "bin" / "vllm-router"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *urls,
    ]
    return ServerProcess(
        argv, host="127.0.0.1", port=port, log_path=log, ready_paths=("/v1/models",), startup_timeout=60.0
    )


def _simulated_hit_rate(profile: Path, router: str, out: Path) -> tuple[float, dict]:
    result = runner.invoke(
        app,
        [
            "simulate",
            "--calibration",
            str(profile),
            "--engine-args",
            SIM_ENGINE_ARGS,
            "--replicas",
            "2",
            "--router",
            router,
            *CHATS,
            "--result-dir",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    last = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()][-1]["values"]
    return last[tl.PREFIX_HITS] / last[tl.PREFIX_QUERIES], json.loads((out / "summary.json").read_text())


def test_cache_aware_routes_hit_more_than_round_robin_measured_and_simulated(fleet, tiny_model, tmp_path) -> None:
    urls = [s.base_url for s in fleet]
    measured: dict[str, float] = {}
    rows = []
    for seed, route in enumerate(OWN_ROUTES, 1):  # a seed each: no run finds the previous run's prompts cached
        replicas = _bench(tmp_path / route, urls, "--route", route, "--seed", str(seed))
        assert [r["url"] for r in replicas] == [url + "/metrics" for url in urls]
        assert sum(r["requests_served"] for r in replicas) == 384
        measured[route] = _hit_rate(replicas)
        rows.append(_row(f"servelab --route {route}", replicas, load_run(tmp_path / route).summary))
    if (ROUTER_VENV / "bin" / "vllm-router").exists():
        for seed, policy in enumerate(VLLM_ROUTER_POLICIES, 10):
            with _vllm_router(policy, urls, tmp_path / f"router-{policy}.log").start() as router:
                metrics = [a for url in urls for a in ("--replica-metrics-url", url + "/metrics")]
                replicas = _bench(tmp_path / policy, [router.base_url], *metrics, "--seed", str(seed))
            assert sum(r["requests_served"] for r in replicas) == 384  # every request reached a replica we scrape
            assert [r["server_ttft_count"] for r in replicas] == [r["requests_served"] for r in replicas]
            measured[f"vllm-router {policy}"] = _hit_rate(replicas)
            rows.append(_row(f"vllm-router --policy {policy}", replicas, load_run(tmp_path / policy).summary))

    # The simulator, calibrated from one replica alone (a closed-loop random run), predicts the same fleet.
    single = tmp_path / "single"
    result = runner.invoke(
        app,
        [
            "bench",
            "--base-url",
            urls[0],
            "--model",
            "tiny-qwen",
            "--ignore-eos",
            "--max-concurrency",
            "4",
            "--num-prompts",
            "24",
            "--random-input-len",
            "128",
            "--random-output-len",
            "48",
            "--result-dir",
            str(single),
        ],
    )
    assert result.exit_code == 0, result.output
    profile = tmp_path / "profile.json"
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--from",
            str(single),
            "--gpu",
            "cpu",
            "--model",
            str(tiny_model),
            "--engine-args",
            SIM_ENGINE_ARGS,
            "-o",
            str(profile),
        ],
    )
    assert result.exit_code == 0, result.output
    simulated = {}
    for route in OWN_ROUTES:
        simulated[route], summary = _simulated_hit_rate(profile, route, tmp_path / f"sim-{route}")
        rows.append(
            f"| simulate --router {route} | {simulated[route]:.0%} | | {summary['request_throughput']:.2f} "
            f"| {summary['mean_ttft_ms']:.0f} |"
        )
    print(
        "\n| route | prefix-cache hits | per replica: served: hits | requests/s | mean TTFT (ms) "
        "|\n|---|---|---|---|---|"
    )
    print("\n".join(rows))

    for route in ("prefix-hash", "session"):
        assert measured[route] > measured["round-robin"], measured
        assert simulated[route] > simulated["round-robin"], simulated
    if "vllm-router consistent_hash" in measured:  # its key is our X-Session-ID header: session affinity
        assert measured["vllm-router consistent_hash"] > measured["vllm-router round_robin"], measured
