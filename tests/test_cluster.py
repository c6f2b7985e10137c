"""servelab on Ray (`--ray-address`): a two-node cluster on this machine (`ray.cluster_utils.Cluster`).

What holds under any load is asserted (same study, same files, trials that
overlapped, failures recorded, no process left behind); how much faster the
cluster is lives in benchmarks/ray_scaling.py and docs/cluster.md.

The Ray tests are skipped when Ray is not installed, unless SERVELAB_REQUIRE_RAY=1
(scripts/test sets it, and installs the `ray` extra): then they fail loudly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from support.processes import wait_gone
from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.tune.confirm import ServerCommand
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace
from servelab.tune.study import SearchSettings
from servelab.tune.tuner import TuneRequest, run
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

REQUIRE_RAY = os.environ.get("SERVELAB_REQUIRE_RAY") == "1"
TRIAL_GPU = "trial_gpu"
"""The custom resource standing in for a GPU here: a stage-2 trial holds one per GPU of its configuration."""
NODE_SLOT = "node_slot"
"""One per node: trials that hold it land one on each node (the killed-node test)."""
SIM_ARGS = "--block-size 128 --kv-cache-memory-bytes 1G"
LINE = "--max-model-len 4096 --max-num-seqs 2"
TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        if REQUIRE_RAY:
            pytest.fail("SERVELAB_REQUIRE_RAY=1 but ray is not installed (pip install 'servelab[ray]')", pytrace=False)
        pytest.skip("ray is not installed (pip install 'servelab[ray]')")
    return ray


class TwoNodes:
    """A head that runs nothing plus two worker nodes, each with `slots` trial GPUs; shut down by the fixture."""

    def __init__(self, slots: tuple[int, int]) -> None:
        from ray.cluster_utils import Cluster

        # Ray's head node installs its own SIGTERM/SIGINT handlers in this process; the rest of the session
        # (run_point's interruption tests) must find them as they were.
        self.handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        self.nodes = [self.cluster.add_node(num_cpus=1, resources={TRIAL_GPU: n, NODE_SLOT: 1}) for n in slots]
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    """One cluster for the module's tests (starting one takes ~30 s here, and longer on a loaded machine): trial
    GPUs 2 + 1, so three stage-2 trials fit at once. The killed-node test, last in the file, removes a node."""
    _ray()
    cluster = TwoNodes((2, 1))
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2's config.json alone: the simulator needs the shape, not the weights."""
    directory = tmp_path_factory.mktemp("tiny-config")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


def _request(model: Path, output: Path, space: list[str], **changes: Any) -> TuneRequest:
    workload = WorkloadConfig(input_len=256, output_len=32)
    arrival = ArrivalConfig(max_concurrency=32)
    fields: dict[str, Any] = dict(
        simulated=build_deployment("cpu", model, f"{LINE} {SIM_ARGS}"),
        launch=build_deployment("cpu", model, LINE),
        sim_args=SIM_ARGS,
        space=SearchSpace.from_items(space),
        objective=Objective("goodput", SLO.parse("ttft:500")),
        sim_workload=TuneWorkload(workload, arrival, Amount(num_prompts=120)),
        bench_workload=TuneWorkload(workload, arrival, Amount(num_prompts=64)),
        search=SearchSettings(n_trials=100, sampler="grid"),
        output=output,
    )
    fields.update(changes)
    return TuneRequest(**fields)


def _servelab(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "servelab"), *args]


def test_ray_is_not_imported_without_ray_address(tmp_path: Path, tiny_config: Path) -> None:
    """The single-machine commands never load Ray: tune and simulate run, then sys.modules is checked."""
    program = (
        "import sys\n"
        "from servelab.cli import main\n"
        "for argv in sys.argv[1:]:\n"
        "    try:\n"
        "        main(argv.split('\\x1f'))\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code in (0, None), exc.code\n"
        "    except Exception as exc:  # typer.Exit, as main() raises it outside a console script\n"
        "        assert getattr(exc, 'exit_code', 1) == 0, exc\n"
        "print('ray' in sys.modules, 'servelab.cluster.ray_pool' in sys.modules)\n"
    )
    common = ["--random-input-len", "256", "--random-output-len", "32", "--json"]
    tune = [
        "tune",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--engine-args",
        LINE,
        "--sim-args",
        SIM_ARGS,
        "--space",
        "max_num_seqs=2,8",
        "--sim-prompts",
        "40",
        "--goodput",
        "ttft:500",
        "--result-dir",
        str(tmp_path / "tune"),
        *common,
    ]
    simulate = [
        "simulate",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--engine-args",
        f"{LINE} {SIM_ARGS}",
        "--num-prompts",
        "20",
        "--result-dir",
        str(tmp_path / "sim"),
        *common,
    ]
    done = subprocess.run(
        [sys.executable, "-c", program, "\x1f".join(tune), "\x1f".join(simulate)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False False"
    assert (tmp_path / "tune" / "tune.json").exists() and (tmp_path / "sim" / "summary.json").exists()


def test_ray_address_without_ray_installed_is_one_clear_error(tmp_path: Path, tiny_config: Path) -> None:
    """Ray missing (hidden from the import system here) is bad input (exit 2) before anything runs."""
    program = (
        "import sys\n"
        "sys.modules['ray'] = None  # what `import ray` meets where the extra is not installed\n"
        "from servelab.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    argv = [
        "tune",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--engine-args",
        LINE,
        "--space",
        "max_num_seqs=2,8",
        "--goodput",
        "ttft:500",
        "--ray-address",
        "auto",
        "--result-dir",
        str(tmp_path / "tune"),
    ]
    done = subprocess.run([sys.executable, "-c", program, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: --ray-address needs Ray: pip install 'servelab[ray]'"
    assert not (tmp_path / "tune").exists()


@pytest.mark.ray
def test_stage1_on_two_nodes_is_the_sequential_study(tmp_path: Path, tiny_config: Path, two_nodes: TwoNodes) -> None:
    """A grid simulated over the cluster leaves the same scores, trial numbers and ranking as one process."""
    from servelab.cluster.ray_pool import RayPool

    space = ["max_num_seqs=2,4,8,16,32", "max_num_batched_tokens=default,512"]
    sequential = run(_request(tiny_config, tmp_path / "one", space)).model_dump(mode="json")
    pool = RayPool(two_nodes.address)
    assert pool.slots == 2
    spread = run(_request(tiny_config, tmp_path / "two", space, pool=pool)).model_dump(mode="json")

    def scores(doc: dict[str, Any]) -> dict[int, tuple[Any, ...]]:
        return {
            t["number"]: (json.dumps(t["params"], sort_keys=True), t["score"], t["feasible"]) for t in doc["trials"]
        }

    assert len(spread["trials"]) == 10
    assert scores(spread) == scores(sequential)
    assert spread["ranking"] == sequential["ranking"]
    assert spread["recommendation"] == sequential["recommendation"]
    assert sorted(p.name for p in (tmp_path / "two" / "stage1").iterdir()) == sorted(
        p.name for p in (tmp_path / "one" / "stage1").iterdir()
    )

    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "two" / "stage1").glob("*/trial.json")}
    resumed = run(_request(tiny_config, tmp_path / "two", space, pool=pool, resume=True)).model_dump(mode="json")
    assert scores(resumed) == scores(spread)  # --resume on the cluster: every trial read back, none simulated again
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "two" / "stage1").glob("*/trial.json")} == written


def _vllm_command(vllm_python: Path, tiny_model: Path, pids: Path) -> str:
    """The real vLLM CPU server, started through a shell that first appends its PID (the server's, after
    exec) to `pids`: the test can then check by PID that no server outlived its trial, wherever it ran."""
    server = (
        f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {tiny_model} "
        "--served-model-name tiny-qwen {engine_args} --host {host} --port {port}"
    )
    return f"sh -c 'echo $$ >> {pids}; exec {server}'"


@pytest.mark.vllm
@pytest.mark.ray
@pytest.mark.ray_servers
@pytest.mark.timeout(1800)  # three vLLM servers loading at once on a busy machine
def test_stage2_trials_run_side_by_side_on_two_nodes(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, _vllm_pool: Any, two_nodes: TwoNodes
) -> None:
    """The baseline and the top 2, one real server each, all at once on two nodes: every trial measured, its files
    on the driver, the trials overlapped, and no server is left."""
    from servelab.cluster.ray_pool import RayPool

    _vllm_pool.stop_default()  # the session's server would share the 2 cores with these three
    pids = tmp_path / "pids"
    server = ServerCommand(
        _vllm_command(vllm_python, tiny_model, pids), env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout=900
    )
    request = _request(
        tiny_model,
        tmp_path / "tune",
        ["max_num_seqs=2,8,32"],
        top_k=2,
        server=server,
        pool=RayPool(two_nodes.address),
        gpu_resource=TRIAL_GPU,
    )
    doc = run(request).model_dump(mode="json")

    results = doc["stage2"]["results"]
    assert [r["label"] for r in results][0] == "baseline" and len(results) == 3
    assert all(r["error"] is None for r in results), [r["error"] for r in results]
    assert max(r["started_at"] for r in results) < min(r["ended_at"] for r in results)  # all three ran at once
    for r in results:
        directory = Path(r["directory"])
        assert directory.parent == tmp_path / "tune" / "stage2"
        summary = json.loads((directory / "summary.json").read_text())
        assert (
            summary["completed"] == 64
            and (directory / "records.jsonl").exists()
            and (directory / "server.log").exists()
        )
    # (the three servers share the host's cores, so their scores rank nothing: benchmarks/ray_stage2_speed.py times
    # them)
    assert doc["recommendation"]["source"] == "stage2" and doc["recommendation"]["params"] != {}
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 3 and not wait_gone(started, within=10.0)
    report = subprocess.run(
        _servelab("report", str(tmp_path / "tune"), "-o", str(tmp_path / "report.html")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0 and (tmp_path / "report.html").stat().st_size > 0, report.stderr


def _both_serving(output: Path) -> bool:
    """Both trials' servers answer /health (found through the PIDs file and their command lines' --port: their
    nodes' scratch directories are not the driver's to read)."""
    pids_file = output.parent / "pids"
    if not pids_file.exists():
        return False
    started = [int(line) for line in pids_file.read_text().split()]
    return len(started) == 2 and all(_healthy(pid) for pid in started)


def _healthy(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        port = int(argv[argv.index("--port") + 1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except (OSError, ValueError, IndexError):
        return False


@pytest.mark.ray
def test_simulate_sweep_on_two_nodes_writes_the_sequential_sweep(
    tmp_path: Path, tiny_config: Path, two_nodes: TwoNodes
) -> None:
    """`simulate --sweep ... --ray-address`: every point simulated on the cluster, the same curve and files here."""
    argv = _servelab(
        "simulate",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--engine-args",
        f"{LINE} {SIM_ARGS}",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
        "--num-prompts",
        "60",
        "--sweep",
        "request-rate=1,2,4,8,16",
        "--json",
    )
    one = subprocess.run([*argv, "--result-dir", str(tmp_path / "one")], capture_output=True, text=True, timeout=600)
    spread = subprocess.run(
        [*argv, "--result-dir", str(tmp_path / "two"), "--ray-address", two_nodes.address],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0 and spread.returncode == 0, spread.stderr

    def curve(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [
            (p["request-rate"], p["directory"], p["completed"], p["mean_ttft_ms"], p["output_throughput"])
            for p in doc["points"]
        ]

    assert curve(json.loads(spread.stdout)) == curve(json.loads(one.stdout))
    assert len(json.loads(spread.stdout)["points"]) == 5
    for point in json.loads(spread.stdout)["points"]:
        directory = tmp_path / "two" / point["directory"]
        assert sorted(p.name for p in directory.iterdir()) == sorted(
            p.name for p in (tmp_path / "one" / point["directory"]).iterdir()
        )
        assert (directory / "records.jsonl").read_text() == (
            tmp_path / "one" / point["directory"] / "records.jsonl"
        ).read_text()


def test_simulate_ray_address_without_sweep_is_refused(tmp_path: Path, tiny_config: Path) -> None:
    done = subprocess.run(
        _servelab(
            "simulate",
            "--gpu",
            "cpu",
            "--model",
            str(tiny_config),
            "--num-prompts",
            "10",
            "--ray-address",
            "auto",
            "--result-dir",
            str(tmp_path / "sim"),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "--ray-address spreads the points of a --sweep" in done.stderr and not (tmp_path / "sim").exists()


def _bench_clients(vllm_server: Any, two_nodes: TwoNodes, out: Path, clients: int, *load: str) -> list[str]:
    """`servelab bench` against the real server from `clients` actors on the module's cluster, capped at CAP."""
    return _servelab(
        "bench",
        "--base-url",
        vllm_server.base_url,
        "--model",
        vllm_server.model_name,
        "--ignore-eos",
        "--random-input-len",
        "64",
        "--random-output-len",
        "16",
        "--max-concurrency",
        str(CAP),
        *load,
        "--result-dir",
        str(out),
        "--json",
        "--ray-address",
        two_nodes.address,
        "--clients",
        str(clients),
    )


CAP = 4


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def _peak_in_flight(records: list[dict[str, Any]], tolerance: float, after: float = float("-inf")) -> int:
    """The most requests in flight at once (at a send after `after`) in merged records, counting two requests as
    overlapping only beyond `tolerance` (the clients' clock error bound: their times are aligned to that)."""
    return max(
        (
            sum(1 for q in records if q["send_time"] <= r["send_time"] < q["finish_time"] - tolerance)
            for r in records
            if r["send_time"] > after
        ),
        default=0,
    )


@pytest.mark.vllm
@pytest.mark.ray
def test_bench_from_three_clients_shares_one_cap_and_sends_the_same_requests_as_one(
    tmp_path: Path, vllm_server: Any, two_nodes: TwoNodes
) -> None:
    """`bench --ray-address --clients 3 --max-concurrency 4` against the real server: every request of the plan once,
    in one records.jsonl on the driver, the same tokens as `--clients 1`; across the clients never more than 4
    requests in flight (from the records' send and finish times), and 4 at some point (one cap, not 2+1+1); each
    client's clock, overhead and slot-broker round trips recorded."""

    def bench(clients: int) -> dict[str, Any]:
        out = tmp_path / f"clients-{clients}"
        done = subprocess.run(
            _bench_clients(
                vllm_server,
                two_nodes,
                out,
                clients,
                "--num-prompts",
                "24",
                "--dataset-name",
                "multiturn",
                "--multiturn-turns",
                "2",
            ),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr
        records = _records(out)
        return {
            "summary": json.loads(done.stdout),
            "records": records,
            "indices": sorted(r["index"] for r in records),
            "statuses": {r["status"] for r in records},
        }

    one, three = bench(1), bench(3)
    assert three["indices"] == one["indices"] == list(range(24)) and three["statuses"] == one["statuses"] == {"ok"}
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        assert three["summary"][key] == one["summary"][key], key
    clients = three["summary"]["client_stats"]["clients"]
    assert [c["client"] for c in clients] == [0, 1, 2]
    for c in clients:
        assert c["clock_rtt_ms"] > 0 and abs(c["clock_offset_ms"]) <= 1000 * 60  # one host here: a small offset
        assert c["start_skew_ms"] is not None and "cpu_share" in c and "median_schedule_lag_ms" in c
        broker = c["slot_broker"]
        assert 0 <= broker["median_round_trip_ms"] <= broker["p99_round_trip_ms"] <= broker["max_round_trip_ms"]
    assert sum(c["slot_broker"]["acquires"] + c["slot_broker"]["kept"] for c in clients) == 24  # a slot per request
    tolerance = max(c["clock_rtt_ms"] for c in clients) / 1000
    assert _peak_in_flight(three["records"], tolerance) == CAP


def _ray_children(two_nodes: TwoNodes, title: str) -> list[int]:
    """PIDs of this cluster's worker processes whose title (Ray sets `ray::Class.method`) contains `title`."""
    nodes = [two_nodes.cluster.head_node, *two_nodes.nodes]  # actors that ask for no CPU may land on the head too
    parents = {info.process.pid for node in nodes for info in node.all_processes["raylet"]}
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid in parents and title in cmdline:
            found.append(int(proc.name))
    return found


@pytest.mark.vllm
@pytest.mark.ray
def test_a_killed_clients_slots_go_back_to_the_others(tmp_path: Path, vllm_server: Any, two_nodes: TwoNodes) -> None:
    """`--clients 3 --max-concurrency 4`, one client killed (SIGKILL) mid-run: the broker takes back its slots, so
    the two others still reach the whole cap after its death and never pass it; they finish every request they
    own; its unfinished requests are recorded as `client_worker_died`, so every request of the plan has one record;
    the run ends disturbed (exit 3)."""
    out = tmp_path / "killed"
    # 64-token answers (the other tests' 16 end in ~70 ms, no longer than a loaded host's broker round trip and
    # near the clock tolerance the overlaps are counted beyond): the two survivors must be able to fill the cap.
    proc = subprocess.Popen(
        _bench_clients(vllm_server, two_nodes, out, 3, "--num-prompts", "120", "--random-output-len", "64"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and (not (out / "records.jsonl").exists() or len(_records(out)) < 8)
        ):
            time.sleep(0.2)
        victims = _ray_children(two_nodes, "ClientActor")
        assert proc.poll() is None and len(victims) == 3, victims
        os.kill(victims[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 3, stderr
    summary = json.loads(stdout)
    clients = summary["client_stats"]["clients"]
    dead = [c for c in clients if "died" in c]
    assert len(dead) == 1 and isinstance(dead[0]["slots_reclaimed"], int), clients
    assert all(c["slot_broker"]["acquires"] > 0 for c in clients if "died" not in c)
    records = _records(out)
    died = [r for r in records if r["error_kind"] == "client_worker_died"]
    assert died and all(r["status"] == "ok" for r in records if r not in died)
    assert sorted(r["index"] for r in records) == list(range(120))  # the dead client's unfinished share included
    tolerance = max(c["clock_rtt_ms"] for c in clients) / 1000
    assert _peak_in_flight(records, tolerance) == CAP
    assert _peak_in_flight(records, tolerance, after=died[0]["send_time"]) == CAP


def _children_alone(two_nodes: TwoNodes, title: str, count: int) -> list[int]:
    """`_ray_children` once exactly `count` are left: the actors of an earlier test are killed when it ends, but
    their processes may take a moment to go."""
    deadline = time.monotonic() + 60
    while len(found := _ray_children(two_nodes, title)) != count and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


@pytest.mark.ray
def test_a_client_killed_before_it_reported_anything_leaves_a_record_of_each_request_of_its_share(
    two_nodes: TwoNodes,
) -> None:
    """Issue 15: a client killed before the driver heard of any request it took (here: while its pre-flight waits on
    a socket that accepts and never answers) still leaves its whole share on record, as `client_worker_died`; so
    does the other, whose pre-flight then fails (the socket closed). Before, the driver recorded only what a
    client had reported taking, and such a death left no record at all."""
    from servelab.cluster.clients import RayClients
    from servelab.workload.plan import build_plan

    def plan() -> Any:
        return build_plan(
            WorkloadConfig(input_len=32, output_len=8), ArrivalConfig(max_concurrency=CAP), Amount(num_prompts=12)
        )

    written: list[Any] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        clients = RayClients(
            two_nodes.address, 2, {"base_url": f"http://127.0.0.1:{listener.getsockname()[1]}", "model": "tiny"}, plan
        )
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(clients.run, plan(), type("Sink", (), {"write": staticmethod(written.append)})())
            listener.settimeout(120)
            waiting = [listener.accept()[0] for _ in range(2)]  # both clients are in their pre-flight: nothing taken
            victims = _children_alone(two_nodes, "ClientActor", 2)
            assert len(victims) == 2, victims
            os.kill(victims[0], signal.SIGKILL)
            for connection in waiting:
                connection.close()
            result = run.result(timeout=300)
    assert sorted(r.index for r in written) == list(range(12)), written
    assert {r.error_kind for r in written} == {"client_worker_died"}
    died = [c["died"] for c in result.client_stats["clients"]]
    assert len(died) == 2 and any(d.startswith("ActorDiedError") for d in died), died


def test_a_dead_client_disturbs_the_run_even_with_no_request_failed() -> None:
    """A client of `--clients N` that died makes the run disturbed (exit 3) by itself: with a --duration plan the
    driver cannot know what it would still have sent, so its death may leave no failed request behind."""
    from servelab.cli.run_and_show import _disturbed
    from servelab.metrics.records import RequestRecord
    from servelab.schemas.results import ClientEntry, ClientStats, Summary
    from servelab.metrics.summary import summarize

    def summary(**died: str) -> Summary:
        clients = [ClientEntry(client=0, host="a", clock_offset_ms=0.0, clock_rtt_ms=1.0, **died)]
        ok = RequestRecord(index=0, intended_time=0.0, send_time=0.0, finish_time=1.0, output_tokens=1)
        return summarize([ok]).model_copy(update={"client_stats": ClientStats(clients=clients)})

    assert _disturbed([summary()]) == ""
    assert _disturbed([summary(died="ActorDiedError: gone")]) == "client 0 (a) died: ActorDiedError: gone"


@pytest.mark.ray
def test_a_shared_cap_with_workers_is_refused_before_any_client_starts(two_nodes: TwoNodes) -> None:
    """`--max-concurrency 4 --clients 2 --workers 2`: a shared cap runs one event loop per client, so one clear error,
    no request sent (the base URL answers nothing: no client got as far as trying it)."""
    from servelab.cluster.clients import RayClients
    from servelab.errors import InputError
    from servelab.workload.plan import build_plan

    def plan() -> Any:
        return build_plan(
            WorkloadConfig(input_len=32, output_len=8), ArrivalConfig(max_concurrency=4), Amount(num_prompts=4)
        )

    written: list[Any] = []
    clients = RayClients(two_nodes.address, 2, {"base_url": "http://127.0.0.1:9", "model": "tiny", "workers": 2}, plan)
    with pytest.raises(InputError, match="one cap shared by the --clients 2, each on one event loop: drop --workers"):
        clients.run(plan(), type("Sink", (), {"write": staticmethod(written.append)})())
    assert written == []


@pytest.mark.ray
def test_a_client_that_dies_before_the_run_starts_is_one_clear_error_and_nothing_is_sent(
    two_nodes: TwoNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client actor killed (for real, by Ray) while the driver reads its clock: one ClusterError naming it, every
    actor started for the run stopped, no record written (nothing was sent)."""
    import ray

    from servelab.cluster.clients import RayClients
    from servelab.cluster.ray_pool import ClusterError
    from servelab.workload.plan import build_plan

    def plan() -> Any:
        return build_plan(
            WorkloadConfig(input_len=32, output_len=8), ArrivalConfig(max_concurrency=4), Amount(num_prompts=4)
        )

    clients = RayClients(two_nodes.address, 2, {"base_url": "http://127.0.0.1:9", "model": "tiny"}, plan)
    seen: list[Any] = []
    read_clock = RayClients._clock

    def clock_of_a_dying_second_client(self: RayClients, actor: Any) -> tuple[float, float]:
        seen.append(actor)
        if len(seen) == 2:
            ray.kill(actor)
        return read_clock(self, actor)

    monkeypatch.setattr(RayClients, "_clock", clock_of_a_dying_second_client)
    written: list[Any] = []
    with pytest.raises(ClusterError, match="client 1 died before the run started"):
        clients.run(plan(), type("Sink", (), {"write": staticmethod(written.append)})())
    assert written == []
    assert _stopped_within(seen[0], 60), "the client that was alive was left running"


def _stopped_within(actor: Any, seconds: float) -> bool:
    """Whether the actor is gone within `seconds`: ray.kill only asks the GCS to end it, so a call made at once may
    still be served before the kill lands; poll until a call fails as a dead actor's does."""
    import ray

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.host.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(0.2)
    return False


def test_clients_share_one_plan_with_conversations_whole_and_the_whole_cap() -> None:
    """How `--clients` divides a plan: every request once, each conversation on one client, and each client's plan
    carrying the whole cap (one cap, shared through the broker, not split into shares)."""
    from collections import deque

    from servelab.cluster.clients import owned
    from servelab.workload.plan import build_plan

    def plan() -> Any:
        return build_plan(
            WorkloadConfig(dataset_name="multiturn", turns=3, input_len=32, output_len=8),
            ArrivalConfig(max_concurrency=7),
            Amount(num_prompts=30),
        )

    whole = list(plan().requests)
    shares = [owned(plan(), 3, i, deque()) for i in range(3)]
    parts = [list(s.requests) for s in shares]
    assert sorted(r.index for part in parts for r in part) == [r.index for r in whole]
    assert [s.max_concurrency for s in shares] == [7, 7, 7] and all(parts)
    owner = {r.index: i for i, part in enumerate(parts) for r in part}
    assert all(owner[r.index] == owner[r.depends_on] for r in whole if r.depends_on is not None)
    assert [(r.index, r.arrival_time) for r in parts[1]] == [
        (r.index, r.arrival_time) for r in whole if owner[r.index] == 1
    ]


def test_slot_broker_lends_each_slot_once_and_takes_back_a_leaving_clients() -> None:
    """The shared cap's broker (a plain class; Ray makes it an actor): a freed slot goes to the first waiter with
    its free time, a withdrawn wait takes nothing (and a withdrawn grant comes back), and a client that leaves
    (dead, or done) gives back every slot it holds, its later releases ignored."""
    from servelab.cluster.slot_broker import SlotBroker

    async def scenario() -> None:
        broker = SlotBroker(2)
        assert (await broker.acquire(0, 0))[0] == 0.0
        assert (await broker.acquire(1, 0))[0] == 0.0
        waiting = [asyncio.create_task(broker.acquire(2, 0)), asyncio.create_task(broker.acquire(1, 1))]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiting) and not broker.free
        await broker.release(0, 1.5)  # client 0's request ended at 1.5: the first waiter (client 2) gets that slot
        assert (await waiting[0])[0] == 1.5 and not waiting[1].done()
        await broker.withdraw(1, 1)  # client 1 stops waiting: it gets nothing
        assert await waiting[1] is None
        await broker.withdraw(1, 7)  # withdrawn before its acquire arrived
        assert await broker.acquire(1, 7) is None
        assert dict(broker.held) == {0: 0, 1: 1, 2: 1} and not broker.free
        assert await broker.leave(1, 2.0) == 1  # client 1 died holding one slot: it is free again
        await broker.release(1, 3.0)  # ... and what it says afterwards changes nothing
        assert list(broker.free) == [2.0] and await broker.acquire(1, 8) is None
        granted = asyncio.create_task(broker.acquire(0, 1))
        assert (await granted)[0] == 2.0
        await broker.withdraw(0, 1)  # granted, but its client had stopped waiting: the slot comes back
        assert list(broker.free) == [2.0] and broker.held[0] == 0

    asyncio.run(scenario())


class _ActorHandle:
    """Ray's actor-handle call shape (`handle.method.remote(...)`) over a plain object on this event loop: the
    library boundary, so the client's side of the shared cap runs against the real broker without a cluster."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.actor, name)
        return type("Method", (), {"remote": staticmethod(lambda *a: asyncio.ensure_future(method(*a)))})


async def _settle() -> None:
    """Let every task this loop has ready run its course (a handful of hops each): by iterations, not by time."""
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_client_passes_a_slot_it_frees_to_its_own_waiting_request_and_gives_back_the_rest() -> None:
    """Two clients' SharedSlots over one broker (cap 2): a slot freed while the same client has a request waiting
    goes to that request without the broker (its wait there withdrawn); a slot freed with nobody waiting here goes
    to the broker and on to the other client; a wait cancelled takes nothing."""
    _ray()  # the client side reads Ray's error types
    from servelab.cluster.slot_broker import SharedSlots, SlotBroker

    async def scenario() -> None:
        broker = SlotBroker(2)
        handle = _ActorHandle(broker)
        one, two = (SharedSlots(handle, me, lambda: 0.0) for me in (0, 1))
        assert [await one.acquire(), await one.acquire()] == [0.0, 0.0]
        mine, theirs = asyncio.create_task(one.acquire()), asyncio.create_task(two.acquire())
        await _settle()
        assert not mine.done() and not theirs.done() and len(broker.waiting) == 2
        one.release(1.0)  # client 0's own waiting request takes it, no round trip
        assert await mine == 1.0 and one.kept == 1
        await _settle()
        assert list(broker.waiting) == [(1, 0)] and broker.held[0] == 2  # its wait at the broker withdrawn
        one.release(2.0)  # nobody waits on client 0: through the broker to client 1
        assert await theirs == 2.0 and dict(broker.held) == {0: 1, 1: 1}
        waiting = asyncio.create_task(two.acquire())
        await _settle()
        waiting.cancel()
        await _settle()
        assert not broker.waiting
        one.release(3.0)
        await _settle()
        assert list(broker.free) == [3.0] and one.stats()["acquires"] == 2 and two.stats()["acquires"] == 1

    asyncio.run(scenario())


@pytest.mark.vllm
@pytest.mark.ray
@pytest.mark.timeout(1800)
def test_trial_on_a_killed_node_is_recorded_failed_and_leaves_no_server(
    tmp_path: Path, tiny_model: Path, vllm_python: Path, tiny_config: Path, _vllm_pool: Any, two_nodes: TwoNodes
) -> None:
    """(Last in the file: it takes a node from the module's cluster.) `servelab tune --ray-address` with one trial
    per node (each holds the node's one NODE_SLOT); a node dies while its server is up: that trial is
    recorded failed with the reason, the other is measured, tune ends normally, and both servers are gone."""
    _vllm_pool.stop_default()
    pids = tmp_path / "pids"
    output = tmp_path / "tune"
    argv = _servelab(
        "tune",
        "--gpu",
        "cpu",
        "--model",
        str(tiny_config),
        "--engine-args",
        LINE,
        "--sim-args",
        SIM_ARGS,
        "--space",
        "max_num_seqs=2,8",
        "--top-k",
        "1",
        "--sim-prompts",
        "60",
        "--goodput",
        "ttft:500",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
        "--max-concurrency",
        "8",
        "--num-prompts",
        "400",
        "--result-dir",
        str(output),
        "--json",
        "--server-cmd",
        _vllm_command(vllm_python, tiny_model, pids),
        "--server-env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "--startup-timeout",
        "900",
        "--ray-address",
        two_nodes.address,
        "--ray-gpu-resource",
        NODE_SLOT,
    )
    log = (tmp_path / "tune.log").open("w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None and not _both_serving(output):
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "tune.log").read_text()
        assert _both_serving(output), "the two servers never both came up"
        two_nodes.cluster.remove_node(two_nodes.nodes[1], allow_graceful=False)
        stdout, _ = proc.communicate(timeout=900)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, (tmp_path / "tune.log").read_text()
    results = json.loads(stdout)["stage2"]["results"]
    lost = [r for r in results if r["error"]]
    assert len(results) == 2 and len(lost) == 1, results
    assert lost[0]["error"].startswith("the trial was lost on the cluster: ")
    assert lost[0]["measured"] is None and lost[0]["predicted_score"] is not None
    assert json.loads((output / "stage2" / lost[0]["label"] / "stage2.json").read_text())["error"] == lost[0]["error"]
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2 and not wait_gone(started, within=120.0)
