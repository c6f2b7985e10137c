"""Stage 2: start a real server per configuration, run the bench workload, stop it; measured next to predicted.

The simulator ranks; only a measurement decides. Each configuration (the
user's current one first, as the baseline, then the simulator's top-k) gets
its own server from the user's `--server-cmd` template, started through
`ServerProcess` (new process group, `/health` wait with the log tail on
failure, SIGTERM then SIGKILL of the whole group). No server outlives its
measurement: the context manager stops it on any exit, an interpreter exit
stops what is still registered, each server's watchdog stops it when tune
itself is SIGKILLed, and a marker file naming the live group lets the next
`--resume` kill a server that still outlived it.

A configuration whose server will not start (a bad flag, a crash while
loading, no answer within --startup-timeout), or whose server dies or drops
connections during the measurement, is a failed trial: its result keeps the
error and the server's log tail, and the study goes on to the next one.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import string
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from servelab.atomic import write_text_atomic
from servelab import SCHEMA_VERSION
from servelab.metrics.records import disturbances
from servelab.metrics.results import ResultWriter
from servelab.schemas.results import Json, RunInfo, Summary
from servelab.metrics.summary import summarize
from servelab.pool import TaskLost, TaskPool
from servelab.renames import upgraded
from servelab.targets.deployment import Deployment
from servelab.targets.http import HttpTarget
from servelab.targets.server_process import ServerProcess, ServerStartError, free_port, group_alive
from servelab.tune.errors import TuneError
from servelab.tune.objectives import Objective, key_metrics, run_summary
from servelab.schemas.tune import Stage2Row
from servelab.tune.space import Candidate, gpu_count
from servelab.tune.workload import TuneWorkload

STAGE2_DIR = "stage2"
RESULT = "stage2.json"
LIVE_SERVER = "live-server.json"
PLACEHOLDERS = frozenset({"engine_args", "port", "host"})


@dataclass(frozen=True)
class ServerCommand:
    """`--server-cmd`: a command template with `{engine_args}` (and optionally `{port}`, `{host}`).

    Without `{port}` the command gets `--host H --port P` appended, which is
    what vLLM's OpenAI server (and SGLang's) take.
    """

    template: str
    env: Mapping[str, str] = field(default_factory=dict)
    """Set on top of this process's environment (e.g. VLLM_CPU_KVCACHE_SPACE)."""
    host: str = "127.0.0.1"
    startup_timeout: float = 300.0
    stop_timeout: float = 20.0
    port: int | None = None
    """Where every server listens (they run one at a time); None picks a free port per server."""

    def __post_init__(self) -> None:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
            shlex.split(self.template)
        except ValueError as exc:
            raise TuneError(f"--server-cmd cannot be parsed: {exc}") from None
        if "engine_args" not in names:
            raise TuneError("--server-cmd must contain {engine_args}, where each configuration's flags go")
        unknown = names - PLACEHOLDERS
        if unknown:
            raise TuneError(f"--server-cmd has unknown placeholders {sorted(unknown)}; use {sorted(PLACEHOLDERS)}")
        if self.startup_timeout <= 0:
            raise TuneError("--startup-timeout must be positive")

    def argv(self, engine_args: str, port: int) -> list[str]:
        line = self.template.format(engine_args=engine_args, port=port, host=self.host)
        argv = shlex.split(line)
        if "{port}" not in self.template:
            argv += ["--host", self.host, "--port", str(port)]
        return argv

    def launch_line(self, engine_args: str) -> str:
        """What the user pastes: the template with the flags filled in and no servelab-chosen port."""
        return " ".join(
            self.template.replace("{port}", "PORT").replace("{host}", self.host).format(engine_args=engine_args).split()
        )


@dataclass(frozen=True)
class Stage2Config:
    label: str
    """`baseline` or `trial-N` (the stage-1 trial it came from)."""
    params: Candidate
    engine_args: str
    deployment: Deployment
    """The simulated deployment, for the prediction."""


ServerCheck = Callable[[str, "Stage2Config", Path], list[str]]
"""Called with a started server's base URL, its configuration and a directory for its runs; returns warnings."""


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_result(path: Path, result: Stage2Row) -> None:
    """A configuration's stage2.json (docs/schemas/stage2.json): the row, led by the results schema version its
    statistics are named by."""
    _write_json(path, {"schema_version": SCHEMA_VERSION, **result.model_dump()})


def read_result(path: Path) -> Stage2Row:
    """A stage2.json `--resume` finds, as this release names its statistics: one written before they took vLLM's
    names (results schema 1, no schema_version) is read through servelab.renames like every older file. The row
    is the file less its version (tune.json's rows carry none)."""
    stored = upgraded(json.loads(path.read_text(encoding="utf-8")), SCHEMA_VERSION)
    return Stage2Row.model_validate({k: v for k, v in stored.items() if k in Stage2Row.model_fields})


def reap_orphaned_server(directory: Path, grace: float = 10.0) -> list[int]:
    """Stop any server a killed tune left running; returns the process groups it stopped.

    The marker holds the exact argv (its port makes it unique), written before
    the server starts, so even a tune killed during the server's startup is
    cleaned up: every process whose command line is that argv has its group stopped.
    """
    marker = directory / STAGE2_DIR / LIVE_SERVER
    if not marker.exists():
        return []
    live = json.loads(marker.read_text(encoding="utf-8"))
    argvs = [[str(a) for a in argv] for argv in live.get("argvs", [live["argv"]])]  # a fleet's: one per replica
    pids = [pid for argv in argvs for pid in _pids_running(argv)]
    groups = sorted({pgid for pgid in map(_group_of, pids) if pgid is not None})
    for pgid in groups:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and group_alive(pgid):
                time.sleep(0.1)
            if not group_alive(pgid):
                break
    marker.unlink()
    return groups


def _pids_running(argv: list[str]) -> list[int]:
    wanted = "\0".join(argv).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().rstrip(b"\0")
            except OSError:
                continue
            if cmdline == wanted:
                pids.append(int(entry.name))
    return pids


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def predict(config: Stage2Config, workload: TuneWorkload, objective: Objective) -> tuple[Json, float, float]:
    summary = run_summary(config.deployment.sim_target(), workload, objective)
    gpus = gpu_count(config.deployment)
    return summary, objective.score_point(summary, config.deployment.hardware.name, gpus), objective.violation(summary)


def confirm(
    configs: Sequence[Stage2Config],
    command: ServerCommand,
    workload: TuneWorkload,
    objective: Objective,
    directory: Path,
    *,
    resume: bool = False,
    on_start: Callable[[Stage2Config], None] | None = None,
    on_result: Callable[[Stage2Row], None] | None = None,
    check_server: ServerCheck | None = None,
    pool: TaskPool | None = None,
    gpu_resource: str = "GPU",
) -> list[Stage2Row]:
    """Measure each configuration in turn; a configuration whose server will not start is reported, not fatal.

    With a `pool` (Ray, `--ray-address`) the configurations run side by side, each as a task holding
    `gpu_resource` x its GPU count on the node it lands on (see `confirm_on_pool`).

    `check_server(base_url, config, directory)` runs on each server once it is up, before the
    measurement; the lines it returns are the result's warnings.

    A Ctrl-C (during startup or the bench) stops the server and propagates;
    `resume` skips configurations whose stage2.json is already written.
    """
    root = directory / STAGE2_DIR
    root.mkdir(parents=True, exist_ok=True)
    if pool is not None:
        job = _Stage2Job(command, workload, objective, check_server)
        return confirm_on_pool(
            configs, job, root, pool, gpu_resource, resume=resume, on_start=on_start, on_result=on_result
        )
    reap_orphaned_server(directory)
    results = []
    for config in configs:
        done = root / config.label / RESULT
        if resume and done.exists():
            result = read_result(done)
        else:
            if on_start:
                on_start(config)
            result = _timed(config, command, workload, objective, root / config.label, check_server)
            write_result(done, result)
        results.append(result)
        if on_result:
            on_result(result)
    return results


def _timed(*args: Any) -> Stage2Row:
    """`_measure(*args)`, or a fleet's measurement (fleet_stage2.py) for a configuration of several replicas behind
    a searched router, with when and where it ran."""
    from servelab.tune.fleet_stage2 import is_fleet, measure_fleet  # it builds on this module

    return _stamped(lambda: measure_fleet(*args) if is_fleet(args[0]) else _measure(*args))


def _stamped(measure: Callable[[], Stage2Row]) -> Stage2Row:
    """`measure()`'s row, with when it ran and the host that ran it (a fleet's: the driver, which sent its load)."""
    began = time.time()
    result = measure()
    result.started_at, result.ended_at, result.host = began, time.time(), socket.gethostname()
    return result


@dataclass(frozen=True)
class _Stage2Job:
    """Everything a remote trial needs besides its configuration (pickled to the worker once per trial)."""

    command: ServerCommand
    workload: TuneWorkload
    objective: Objective
    check_server: ServerCheck | None

    def __call__(self, config: Stage2Config) -> tuple[Stage2Row, dict[str, bytes], str]:
        """Run on the worker's node: measure into a scratch directory; return the result, that directory's files
        and its path (which the driver replaces with its own copy's wherever the result names it).

        The server is this task's child (in its own process group, with its watchdog): a cancelled task, or a
        worker killed with its node, takes the server down with it.
        """
        with tempfile.TemporaryDirectory(prefix="servelab-trial-") as scratch:
            out = Path(scratch) / config.label
            result = _timed(config, self.command, self.workload, self.objective, out, self.check_server)
            files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        return result, files, str(out)


def confirm_on_pool(
    configs: Sequence[Stage2Config],
    job: _Stage2Job,
    root: Path,
    pool: TaskPool,
    gpu_resource: str,
    *,
    resume: bool,
    on_start: Callable[[Stage2Config], None] | None,
    on_result: Callable[[Stage2Row], None] | None,
) -> list[Stage2Row]:
    """Every configuration at once, each a task holding its GPUs; results written as they come back.

    The files a trial wrote on its node land in `stage2/<label>/` here, as a sequential trial's would. A trial
    whose worker or node was lost is a failed trial with the reason, like a server that would not start;
    a Ctrl-C cancels every trial still running (their servers stop with their workers) and propagates.
    """
    from servelab.tune.fleet_stage2 import is_fleet  # it builds on this module

    results: dict[str, Stage2Row] = {}
    tasks: dict[int, Stage2Config] = {}
    fleets: list[Stage2Config] = []

    def record(config: Stage2Config, result: Stage2Row) -> None:
        results[config.label] = result
        if on_result:
            on_result(result)

    try:
        for config in configs:
            done = root / config.label / RESULT
            if resume and done.exists():
                record(config, read_result(done))
            elif is_fleet(config):  # its replicas are placed one by one, and the driver sends its workload
                fleets.append(config)
            else:
                if on_start:
                    on_start(config)
                # A trial holds its GPUs; the CPU its server and client use is the node's to share, as on one machine.
                tasks[pool.submit(job, config, {gpu_resource: gpu_count(config.deployment), "CPU": 0})] = config
        for config in fleets:  # measured here while the single servers' trials run on their nodes
            if on_start:
                on_start(config)
            record(config, _fleet_on_pool(config, job, root / config.label, pool, gpu_resource))
        while tasks:
            task, value = pool.next_done()
            config = tasks.pop(task)
            record(config, _returned(config, job, value, root / config.label))
    except BaseException:
        pool.cancel_all()
        raise
    return [results[c.label] for c in configs]


def _fleet_on_pool(config: Stage2Config, job: _Stage2Job, out: Path, pool: TaskPool, gpu_resource: str) -> Stage2Row:
    """A fleet configuration measured from the driver, its replicas placed on the pool; its result written."""
    from servelab.tune.fleet_stage2 import measure_fleet  # it builds on this module

    args = (config, job.command, job.workload, job.objective, out, job.check_server)
    result = _stamped(partial(measure_fleet, *args, pool=pool, gpu_resource=gpu_resource))
    write_result(out / RESULT, result)
    return result


def _returned(
    config: Stage2Config, job: _Stage2Job, value: tuple[Stage2Row, dict[str, bytes], str] | BaseException, out: Path
) -> Stage2Row:
    """A trial's result as its task returned it, with the files its node wrote copied into `out` (a lost worker or
    node: a failed trial with the reason); written as a sequential trial's would be."""
    if isinstance(value, BaseException):
        result = _lost(config, job, value, out)
    else:
        result, files, scratch = value
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
        result.directory = str(out)
        if result.error:  # it names the server's log where the node wrote it; the copy is here
            result.error = result.error.replace(scratch, str(out))
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / RESULT, result)
    return result


def _lost(config: Stage2Config, job: _Stage2Job, error: BaseException, out: Path) -> Stage2Row:
    """The record of a trial that never reported back: its prediction, and why it has no measurement."""
    predicted, score, violation = predict(config, job.workload, job.objective)
    reason = str(error) if isinstance(error, TaskLost) else f"{type(error).__name__}: {error}"
    return _row(
        config,
        job.command,
        predicted,
        score,
        violation,
        directory=str(out),
        error=f"the trial was lost on the cluster: {reason}",
    )


def _row(
    config: Stage2Config, command: ServerCommand, predicted: Json, score: float, violation: float, **measurement: Any
) -> Stage2Row:
    """A configuration's stage-2 row: what it is and what the simulator predicts for it, and so far of its
    measurement only what `measurement` says."""
    return Stage2Row(
        label=config.label,
        params=config.params,
        engine_args=config.engine_args,
        launch_line=command.launch_line(config.engine_args),
        predicted=key_metrics(predicted),
        predicted_score=score,
        predicted_violation=violation,
        **measurement,
    )


def _measure(
    config: Stage2Config,
    command: ServerCommand,
    workload: TuneWorkload,
    objective: Objective,
    out: Path,
    check_server: ServerCheck | None,
) -> Stage2Row:
    """One configuration on a real server: started, checked, sent the workload, stopped, scored. A server that will
    not start is the row's error, not an exception; a marker names the live server so a killed study's is reaped."""
    out.mkdir(parents=True, exist_ok=True)
    predicted, predicted_score, predicted_violation = predict(config, workload, objective)
    result = _row(config, command, predicted, predicted_score, predicted_violation, directory=str(out))
    server, argv = _server_process(command, config.engine_args, out)
    marker = out.parent / LIVE_SERVER
    _write_json(marker, {"argv": argv})
    try:
        try:
            server.start()
        except ServerStartError as exc:
            result.error = str(exc)
            return result
        result.server_pid = server.pid
        result.startup_s = server.startup_seconds
        if check_server is not None:
            result.warnings = check_server(server.base_url, config, out / "server-check")
        began = time.monotonic()
        writer = _bench(server.base_url, config, argv, workload, out)
        result.bench_s = time.monotonic() - began
        exit_code = server.exit_code()  # before stop(), which would make any server exit
    finally:
        server.stop()
        marker.unlink(missing_ok=True)
    summary = summarize(writer.records.records, slo=objective.slo, percentiles=objective.percentiles)
    writer.write_summary(summary)
    result.error = _disturbed(exit_code, disturbances(summary.errors_by_kind), server)
    _score_measured(result, summary, config, objective)
    return result


def _server_process(command: ServerCommand, engine_args: str, out: Path) -> tuple[ServerProcess, list[str]]:
    """The configuration's server (not yet started) and its command line, its log in `out`."""
    port = command.port or free_port(command.host)
    argv = command.argv(engine_args, port)
    server = ServerProcess(
        argv,
        host=command.host,
        port=port,
        log_path=out / "server.log",
        env={**os.environ, **command.env},
        startup_timeout=command.startup_timeout,
        stop_timeout=command.stop_timeout,
    )
    return server, argv


def _bench(base_url: str, config: Stage2Config, argv: list[str], workload: TuneWorkload, out: Path) -> ResultWriter:
    """The workload sent to the server, its records and timeline written into `out` as bench writes them; a
    Ctrl-C during it propagates once what was measured is on disk."""
    run_info = RunInfo.begun(
        kind="tune-stage2",
        source="http",
        label=config.label,
        engine_args=config.engine_args,
        argv=argv,
        workload=workload.describe(),
        base_url=base_url,
    )
    writer = ResultWriter(out, run_info)
    try:
        run = HttpTarget(base_url, ignore_eos=True).run(workload.plan(), writer.records, writer.write_sample)
        writer.update_run_info(server_info=run.server_info, client_stats=run.client_stats, interrupted=run.interrupted)
    finally:
        writer.close()
    if run.interrupted:
        raise KeyboardInterrupt
    return writer


def _score_measured(result: Stage2Row, summary: Summary, config: Stage2Config, objective: Objective) -> None:
    """The measured run scored as stage 1 scored the prediction: its key metrics, score and SLO violation."""
    measured = summary.model_dump(exclude_unset=True)
    result.measured = key_metrics(measured)
    gpus = gpu_count(config.deployment)
    result.measured_score = objective.score_point(measured, config.deployment.hardware.name, gpus)
    result.measured_violation = objective.violation(measured)


def _disturbed(exit_code: int | None, failures: Mapping[str, int], server: ServerProcess) -> str | None:
    """Why a measurement does not describe its configuration (the server died or dropped connections), with
    the server's log tail; None when it does."""
    if exit_code is None and not failures:
        return None
    died = "server running" if exit_code is None else f"server exited with code {exit_code}"
    failed = ", ".join(f"{n} {kind}" for kind, n in sorted(failures.items())) or "no request failed"
    return f"{died} during the measurement ({failed}; {server.log_path}):\n{server.log_tail()}"
