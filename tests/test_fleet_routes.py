"""Workloads that make routing matter and `bench`'s routes over several servers: chats that share system prompts and
carry a conversation id, the session header, prefix-hash and session routes (the simulator's code), and each
replica's /metrics scraped beside the run. Client-side behaviour on the fake server; the real fleet is in
test_fleet_vllm.py."""

from __future__ import annotations

import numpy as np
import pytest
from support.fault_server import FaultServer
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics.records import MemorySink
from servelab.metrics.results import load_run
from servelab.sim.router import Router
from servelab.targets.errors import TargetError
from servelab.targets.http import HttpTarget
from servelab.targets.replicas import Replicas
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.errors import WorkloadError
from servelab.workload.plan import Amount, build_plan
from servelab.workload.routing import HashRing, prefix_key
from servelab.workload.spec import LoadPlan, RequestSpec


def chat_specs(n: int, **config) -> list[RequestSpec]:
    cfg = WorkloadConfig(dataset_name="multiturn", **{"turns": 3, "input_len": 16, "output_len": 4, **config})
    return list(build_plan(cfg, ArrivalConfig(), Amount(num_prompts=n)).requests)


def test_chats_open_with_one_of_a_few_shared_system_prompts_and_carry_their_conversation():
    specs = chat_specs(60, prefix_len=40, num_prefixes=3, think_time=0.5)
    heads = {tuple(s.prompt_ids[:40].tolist()) for s in specs}
    assert len(heads) == 3  # three system prompts, each shared by several of the 20 conversations
    by_conversation: dict[int, list[RequestSpec]] = {}
    for s in specs:
        assert s.conversation is not None
        by_conversation.setdefault(s.conversation, []).append(s)
    assert len(by_conversation) == 20
    for turns in by_conversation.values():
        assert [t.depends_on for t in turns[1:]] == [t.index for t in turns[:-1]]
        assert len({tuple(t.prompt_ids[:40].tolist()) for t in turns}) == 1  # one system prompt per chat
        assert [t.think_time for t in turns] == [0.0, 0.5, 0.5]
        assert turns[0].prompt_len == 40 + 16


def test_chats_without_a_system_prompt_are_as_before_and_a_negative_length_is_refused():
    specs = chat_specs(6)
    assert specs[0].prompt_len == 16 and [s.conversation for s in specs] == [0, 0, 0, 1, 1, 1]
    with pytest.raises(WorkloadError, match="--prefix-len"):
        WorkloadConfig(dataset_name="multiturn", prefix_len=-1)


def test_bench_flags_for_system_prompts_apply_to_multiturn_only():
    result = CliRunner().invoke(
        app, ["bench", "--dataset-name", "random", "--prefix-len", "8", "--base-url", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 2 and "prefix or multiturn" in result.output


def test_the_hash_ring_keeps_a_key_on_its_replica_until_the_load_bound_moves_it():
    ring = HashRing(4)
    key = prefix_key(np.arange(100))
    home = ring.pick(key, [0, 0, 0, 0])
    assert all(ring.pick(key, load) == home for load in ([0, 0, 0, 0], [1, 1, 1, 1]))
    loaded = [0, 0, 0, 0]
    loaded[home] = 3  # 3 + 1 > 1.25 x (3 + 1) / 4: over the bound
    assert ring.pick(key, loaded) != home
    assert prefix_key(np.arange(100)) == prefix_key(np.arange(25))  # only the head counts


@pytest.mark.parametrize("route", ["prefix-hash", "session"])
def test_bench_routes_and_the_simulators_routers_choose_alike(route):
    """One implementation (servelab/workload/routing.py): the same requests, with none finishing, go to the same
    replicas from the client's Replicas and the simulator's Router."""
    specs = chat_specs(30, prefix_len=30, num_prefixes=5)
    replicas = Replicas([f"http://127.0.0.1:{9000 + i}" for i in range(3)], route)
    router = Router(route)
    engines = [None] * 3  # neither route reads the engines
    for s in specs:
        assert replicas.pick(s) == router.pick(engines, s, 0.0)  # type: ignore[arg-type]


def _serve(target: HttpTarget, specs: list[RequestSpec], cap: int = 4) -> list:
    target.preflight()
    sink = MemorySink()
    run = target.run(LoadPlan(specs, max_concurrency=cap), sink)
    return sorted(sink.records, key=lambda r: r.index), run


def test_the_session_route_keeps_each_chat_on_one_replica_and_sends_its_id_in_the_header():
    specs = chat_specs(24, prefix_len=8)
    with FaultServer() as a, FaultServer() as b:
        records, run = _serve(HttpTarget([a.base_url, b.base_url], route="session"), specs)
        sessions = {a.base_url: [r.session for r in a.received], b.base_url: [r.session for r in b.received]}
    homes: dict[int, set[str]] = {}
    for spec, rec in zip(specs, records):
        homes.setdefault(spec.conversation, set()).add(rec.base_url)
    assert all(len(urls) == 1 for urls in homes.values()) and len(homes) == 8
    assert {len(v) for v in sessions.values()} != {0}  # both replicas served chats
    for url, ids in sessions.items():
        assert sorted(ids) == sorted(str(s.conversation) for s, r in zip(specs, records) if r.base_url == url)
    loads = run.server_info["replicas"]
    assert [load["url"] for load in loads] == [a.base_url + "/metrics", b.base_url + "/metrics"]
    assert all(load["samples"] >= 2 and load["max_running"] is not None for load in loads)


def test_the_prefix_hash_route_keeps_a_shared_head_on_one_replica_while_under_its_bound():
    specs = [RequestSpec(i, [7] * 30 + [i], 2) for i in range(12)]  # one head, served one at a time
    with FaultServer() as a, FaultServer() as b:
        records, _ = _serve(HttpTarget([a.base_url, b.base_url], route="prefix-hash"), specs, cap=1)
    assert len({r.base_url for r in records}) == 1


def test_no_session_header_when_asked_for_none_and_a_bad_header_name_is_refused():
    with FaultServer() as srv:
        _serve(HttpTarget(srv.base_url, session_header=None), chat_specs(3))
        assert [r.session for r in srv.received] == [None] * 3
    with pytest.raises(TargetError, match="header"):
        HttpTarget("http://127.0.0.1:1", session_header="X Session")
    with pytest.raises(TargetError, match="http"):
        HttpTarget("http://127.0.0.1:1", replica_metrics_urls=["127.0.0.1:9/metrics"])


def test_bench_through_one_url_scrapes_the_replicas_given_and_records_them(tmp_path):
    out = tmp_path / "run"
    with FaultServer() as front, FaultServer() as r1, FaultServer() as r2:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--base-url",
                front.base_url,
                "--replica-metrics-url",
                r1.base_url + "/metrics",
                "--replica-metrics-url",
                r2.base_url + "/metrics",
                "--dataset-name",
                "multiturn",
                "--multiturn-turns",
                "2",
                "--prefix-len",
                "8",
                "--random-input-len",
                "8",
                "--random-output-len",
                "4",
                "--num-prompts",
                "6",
                "--max-concurrency",
                "2",
                "--session-header",
                "X-Session-ID",
                "--result-dir",
                str(out),
            ],
        )
        sessions = [r.session for r in front.received]
    assert result.exit_code == 0, result.output
    assert sorted(sessions) == ["0", "0", "1", "1", "2", "2"]
    run = load_run(out)
    flags, server = run.run_info.flags, run.run_info.server_info
    assert flags.replica_metrics_urls == [r1.base_url + "/metrics", r2.base_url + "/metrics"]
    assert [load["url"] for load in server.replicas] == flags.replica_metrics_urls


def test_replica_metrics_urls_with_several_base_urls_are_refused(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--base-url",
            "http://127.0.0.1:1",
            "--base-url",
            "http://127.0.0.1:2",
            "--replica-metrics-url",
            "http://127.0.0.1:3/metrics",
            "--result-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2 and "--replica-metrics-url" in result.output
