"""Stage 2 for a fleet: N replicas as N servers, the workload sent through servelab's own route, each replica's load.

A configuration whose `router` knob the search chose, with more than one replica, was predicted as N engines
behind that router; one server started with `--data-parallel-size N` would measure vLLM's own balancer instead.
So such a configuration is measured as it was predicted: N servers, each started from `--server-cmd` with the
configuration's flags less the replica count (its own port, log, process group and watchdog, as a single stage-2
server), and bench's client spreading the workload over them by the route of the same name (`bench --route`,
servelab/targets/replicas.py), scraping every replica's /metrics as bench does over several `--base-url`.

Which configurations, and how:

- `round-robin`, `least-outstanding`, `prefix-hash`, `session`: a fleet, behind that client-side route.
- `least-loaded` (vLLM's data-parallel balancer, which the simulator's least-loaded models) is vLLM's own: one
  server with `--data-parallel-size N`, as for a configuration that does not search the router.
- `prefix-aware` (llm-d's precise prefix-cache scoring) reads each replica's KV-cache events, which no client
  sees: it has no client-side route. Its row keeps the prediction, and its error says why it was not measured
  (measuring it behind another route would record another router's numbers under its name).

Without a pool the replicas start side by side on this machine. With one (`--ray-address`) each replica is placed
on the cluster holding its GPUs (tensor_parallel_size of `--ray-gpu-resource`) on whatever node it lands on and
listens on every interface there; the driver waits until every replica is ready, then sends the workload from
here. A replica that will not start stops them all and is the row's error; a Ctrl-C stops them all and
propagates. The replicas' logs land in `stage2/<label>/replica-<i>/`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servelab.metrics.records import disturbances
from servelab.metrics.results import ResultWriter
from servelab.metrics.summary import summarize
from servelab.pool import Placed, TaskLost, TaskPool
from servelab.schemas.fleet import ReplicaLoad
from servelab.schemas.results import Json, RunInfo
from servelab.schemas.tune import FleetServer, Stage2Row
from servelab.schemas.vocabulary import Route, RouterPolicy
from servelab.targets.http import HttpTarget
from servelab.targets.server_process import ServerProcess, free_port
from servelab.tune.confirm import (
    LIVE_SERVER,
    ServerCheck,
    ServerCommand,
    Stage2Config,
    _row,
    _score_measured,
    _write_json,
    predict,
)
from servelab.tune.objectives import Objective
from servelab.tune.space import ROUTER
from servelab.tune.workload import TuneWorkload

EVERY_INTERFACE = "0.0.0.0"
"""Where a replica placed on a cluster listens: the driver reaches it at its node's address."""
REPLICA_FLAGS = ("--data-parallel-size", "-dp")
"""vLLM's spellings of the replica count, which each replica's own line leaves out."""
NO_CLIENT_ROUTE = (
    "not measured: the {router} router reads {reads}, so servelab has no client-side route for it; measure it "
    "behind the router itself (bench --base-url ROUTER --replica-metrics-url ...), or search a route bench has "
    "({routes})"
)
ROUTER_READS = {
    RouterPolicy.PREFIX_AWARE: "each replica's KV-cache events, which a client does not see",
    RouterPolicy.PREFIX_ESTIMATE: "the replicas' scraped KV usage against its own routing history, "
    "which bench's routes do not keep",
}
"""What each router without a client-side route decides from, for NO_CLIENT_ROUTE."""


def is_fleet(config: Stage2Config) -> bool:
    """Whether stage 2 measures `config` as a fleet of servers: its router was searched, it is not vLLM's own
    data-parallel balancer, and it has more than one replica."""
    router = config.params.get(ROUTER)
    replicas = config.deployment.config.data_parallel_size
    return router is not None and router != RouterPolicy.LEAST_LOADED and replicas > 1


def replica_args(engine_args: str) -> str:
    """A replica's flags: the configuration's less the replica count (each replica is one server)."""
    words = shlex.split(engine_args)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in REPLICA_FLAGS:
            skip = True
        elif not word.startswith(tuple(f"{flag}=" for flag in REPLICA_FLAGS)):
            kept.append(word)
    return shlex.join(kept)


@dataclass(frozen=True)
class ReplicaStarted:
    """A replica's server, up: its port (on the node the driver knows it by), what it took, the node's name."""

    port: int
    pid: int | None
    startup_s: float | None
    host: str


class FleetReplica:
    """One replica's server where it was placed: started on `start()`, stopped (its files returned) on `stop()`.

    `directory` is where its log goes; None (a replica on a cluster node) writes into a scratch directory whose
    files `stop()` returns for the driver to keep.
    """

    def __init__(self, command: ServerCommand, engine_args: str, directory: str | None, port: int | None) -> None:
        self.scratch = None if directory is not None else tempfile.mkdtemp(prefix="servelab-replica-")
        self.directory = Path(directory or self.scratch or "")
        self.port = port or free_port(command.host)
        self.argv = command.argv(engine_args, self.port)
        self.server = ServerProcess(
            self.argv,
            host=command.host,
            port=self.port,
            log_path=self.directory / "server.log",
            env={**os.environ, **command.env},
            startup_timeout=command.startup_timeout,
            stop_timeout=command.stop_timeout,
        )

    def start(self) -> ReplicaStarted:
        """Launch and wait until ready; ServerStartError (with the log's tail) when it will not start."""
        self.server.start()
        return ReplicaStarted(self.port, self.server.pid, self.server.startup_seconds, socket.gethostname())

    def check(self, check_server: ServerCheck, base_url: str, config: Stage2Config) -> list[str]:
        return check_server(base_url, config, self.directory / "server-check")

    def exit_code(self) -> int | None:
        return self.server.exit_code()

    def stop(self) -> dict[str, bytes]:
        """Stop the server's group; the files of a scratch directory (a replica on a cluster node), else none."""
        self.server.stop()
        if self.scratch is None:
            return {}
        files = {str(p.relative_to(self.directory)): p.read_bytes() for p in self.directory.rglob("*") if p.is_file()}
        shutil.rmtree(self.scratch, ignore_errors=True)
        return files


class _Local:
    """A replica on this machine, behind the same face as one placed on a pool."""

    def __init__(self, replica: FleetReplica, address: str) -> None:
        self.replica, self.address = replica, address

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.replica, method)(*args)

    def release(self) -> None:
        self.replica.server.stop()


def measure_fleet(
    config: Stage2Config,
    command: ServerCommand,
    workload: TuneWorkload,
    objective: Objective,
    out: Path,
    check_server: ServerCheck | None = None,
    *,
    pool: TaskPool | None = None,
    gpu_resource: str = "GPU",
) -> Stage2Row:
    """One fleet configuration: its replicas started, checked, sent the workload through its route, stopped,
    scored. A replica that will not start, or a router with no client-side route, is the row's error."""
    out.mkdir(parents=True, exist_ok=True)
    predicted, score, violation = predict(config, workload, objective)
    router = str(config.params[ROUTER])
    result = _row(config, command, predicted, score, violation, directory=str(out), route=router)
    if router not in tuple(Route):
        reads = ROUTER_READS.get(RouterPolicy(router), "what bench's routes do not see")
        result.error = NO_CLIENT_ROUTE.format(router=router, reads=reads, routes=", ".join(Route))
        return result
    replicas = _place(config, command, out, pool, gpu_resource)
    marker = _mark_live(replicas, out) if pool is None else None
    try:
        measured = _run_fleet(replicas, result, config, command, workload, out, check_server)
        ended = [_ended(replica) for replica in replicas] if measured is not None else []
        _collect(replicas, out, remote=pool is not None)
    finally:
        for replica in replicas:
            replica.release()
        if marker is not None:
            marker.unlink(missing_ok=True)
    if measured is None:
        return result
    for server, end in zip(result.fleet, ended):
        server.exit_code = end if isinstance(end, int) else None
    writer, server_info = measured
    summary = summarize(writer.records.records, slo=objective.slo, percentiles=objective.percentiles)
    writer.write_summary(summary)
    result.replicas = [ReplicaLoad.model_validate(load) for load in server_info.get("replicas", [])]
    result.error = _disturbed(ended, disturbances(summary.errors_by_kind), out)
    _score_measured(result, summary, config, objective)
    return result


def _run_fleet(
    replicas: Sequence[Placed],
    result: Stage2Row,
    config: Stage2Config,
    command: ServerCommand,
    workload: TuneWorkload,
    out: Path,
    check_server: ServerCheck | None,
) -> tuple[ResultWriter, Json] | None:
    """Every replica started (each one's server in `result.fleet`), checked and sent the workload: the run's writer
    and what it learnt of the servers; None, with the reason in `result.error`, when one would not start."""
    started = _start_all(replicas, command.startup_timeout)
    result.fleet = [_server(r, s) for r, s in zip(replicas, started) if isinstance(s, ReplicaStarted)]
    failed = [(i, s) for i, s in enumerate(started) if isinstance(s, BaseException)]
    if failed:
        result.error = "; ".join(f"replica {i} would not start: {e}" for i, e in failed)
        return None
    urls = [server.base_url for server in result.fleet]
    result.startup_s = max(s.startup_s or 0.0 for s in started if isinstance(s, ReplicaStarted))
    if check_server is not None:
        for replica, url in zip(replicas, urls):
            result.warnings += replica.call("check", check_server, url, config)
    began = time.monotonic()
    measured = _bench(urls, Route(str(config.params[ROUTER])), config, workload, out)
    result.bench_s = time.monotonic() - began
    return measured


def _mark_live(replicas: Sequence[Placed], out: Path) -> Path:
    """The marker `--resume` reads to stop servers a SIGKILLed tune left (reap_orphaned_server): every replica's
    command line."""
    marker = out.parent / LIVE_SERVER
    argvs = [r.replica.argv for r in replicas if isinstance(r, _Local)]
    _write_json(marker, {"argv": argvs[0], "argvs": argvs})
    return marker


def _place(
    config: Stage2Config, command: ServerCommand, out: Path, pool: TaskPool | None, gpu_resource: str
) -> list[Placed]:
    """The configuration's replicas, not yet started: here (each on its own free port, its log under `out`), or
    each on the pool holding its tensor-parallel GPUs and listening on every interface of its node."""
    n = config.deployment.config.data_parallel_size
    args = replica_args(config.engine_args)
    if pool is None:
        ports = _distinct_ports(command, n)
        return [
            _Local(FleetReplica(command, args, str(out / f"replica-{i}"), p), command.host) for i, p in enumerate(ports)
        ]
    remote = replace(command, host=EVERY_INTERFACE)
    held = {gpu_resource: config.deployment.config.tensor_parallel_size, "CPU": 0}
    return [pool.place(FleetReplica, (remote, args, None, None), held) for _ in range(n)]


def _distinct_ports(command: ServerCommand, n: int) -> list[int]:
    """A free port per replica, none twice (the OS may hand a just-closed port out again)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port(command.host)
        if port not in ports:
            ports.append(port)
    return ports


def _start_all(replicas: Sequence[Placed], startup_timeout: float) -> list[ReplicaStarted | BaseException]:
    """Every replica started side by side; each one's outcome (what it took, or why it did not start).

    A replica gets twice `startup_timeout`: its own server's wait for readiness, and as long again to be placed (on
    a cluster an actor waits until its GPUs are free; where they never will be, the fleet is not started). Once one
    replica fails the others are stopped: the fleet cannot be measured. On any exception here (a Ctrl-C) every
    replica is released until none is still starting, so that one whose launch raced the interrupt does not
    outlive it.
    """
    limit = 2 * startup_timeout
    with ThreadPoolExecutor(max_workers=len(replicas)) as threads:
        futures = [threads.submit(replica.call, "start") for replica in replicas]
        try:
            done, late = wait(futures, timeout=limit, return_when=FIRST_EXCEPTION)
        except BaseException:
            _release_until_done(replicas, futures)
            raise
        if late:
            _release_until_done(replicas, futures)
    failed = any(f.exception() is not None for f in done)
    cut_short = (
        RuntimeError("stopped, as another replica would not start")
        if failed
        else TimeoutError(f"not placed and ready within {limit:.0f} s (twice --startup-timeout)")
    )
    return [cut_short if f in late else _outcome(f) for f in futures]


def _release_until_done(replicas: Sequence[Placed], futures: Sequence[Future[Any]]) -> None:
    while not all(f.done() for f in futures):
        for replica in replicas:
            replica.release()
        wait(futures, timeout=0.5)


def _outcome(future: Future[Any]) -> ReplicaStarted | BaseException:
    error = future.exception()
    return future.result() if error is None else error


def _server(replica: Placed, started: ReplicaStarted) -> FleetServer:
    return FleetServer(
        base_url=f"http://{replica.address}:{started.port}",
        pid=started.pid,
        startup_s=started.startup_s,
        host=started.host,
    )


def _ended(replica: Placed) -> int | TaskLost | None:
    """How a replica stands after the measurement: None while its server runs, its exit code once it exited, or
    why it cannot say (its worker or node was lost)."""
    try:
        code: int | None = replica.call("exit_code")
    except TaskLost as lost:
        return lost
    return code


def _collect(replicas: Sequence[Placed], out: Path, remote: bool) -> None:
    """Stop every replica; a replica on the pool hands back its log, written under `out/replica-<i>/` (one already
    let go, or lost with its node, has no log to give)."""
    for i, replica in enumerate(replicas):
        try:
            files: dict[str, bytes] = replica.call("stop")
        except TaskLost:
            continue
        for name, data in files.items() if remote else ():
            path = out / f"replica-{i}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _bench(
    urls: list[str], route: Route, config: Stage2Config, workload: TuneWorkload, out: Path
) -> tuple[ResultWriter, Json]:
    """The workload sent over the replicas by `route`, written into `out` as bench writes a run over several
    --base-url (every replica's /metrics scraped: run.json's server_info.replicas); a Ctrl-C during it
    propagates once what was measured is on disk."""
    run_info = RunInfo.begun(
        kind="tune-stage2",
        source="http",
        label=config.label,
        engine_args=config.engine_args,
        replica_engine_args=replica_args(config.engine_args),
        workload=workload.describe(),
        base_urls=urls,
        route=route,
    )
    writer = ResultWriter(out, run_info)
    try:
        run = HttpTarget(urls, ignore_eos=True, route=route).run(workload.plan(), writer.records, writer.write_sample)
        writer.update_run_info(server_info=run.server_info, client_stats=run.client_stats, interrupted=run.interrupted)
    finally:
        writer.close()
    if run.interrupted:
        raise KeyboardInterrupt
    return writer, run.server_info


def _disturbed(ended: Sequence[int | TaskLost | None], failures: dict[str, int], out: Path) -> str | None:
    """Why a fleet's measurement does not describe its configuration (a replica died or was lost, or requests
    failed)."""
    died = [
        f"replica {i} exited with code {end}" if isinstance(end, int) else f"replica {i} was lost: {end}"
        for i, end in enumerate(ended)
        if end is not None
    ]
    if not died and not failures:
        return None
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(failures.items())) or "no request failed"
    return f"{'; '.join(died) or 'every replica running'} during the measurement ({failed}; logs in {out}/replica-*)"
