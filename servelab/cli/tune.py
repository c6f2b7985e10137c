"""`servelab tune`: the best configuration under an SLO, found on the simulator and confirmed on real servers."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from servelab.cli import app
from servelab.flags.checks import MAX_INT, real, shell_words
from servelab.cli.cluster import RayAddress, RayGpuResource, ray_pool
from servelab.cli.report import ReportFlag, report_into
from servelab.flags.options import (
    CalibrationFlag,
    EngineArgsFlag,
    EngineFlag,
    GpuFlag,
    LoadFlags,
    ModelFlag,
    deployment_from_flags,
    flag_block,
    load_options,
)
from servelab.errors import RunInterrupted
from servelab.report.console import make_console
from servelab.schemas.vocabulary import LABELS, VLLM, RecommendationSource
from servelab.tune.errors import TuneError

if TYPE_CHECKING:
    from servelab.schemas.profile import CalibrationProfile
    from servelab.schemas.tune import Stage2Row, Trial, TuneDeployment, TuneDocument
    from servelab.tune.confirm import ServerCheck, ServerCommand, Stage2Config
    from servelab.tune.objectives import Objective
    from servelab.tune.space import SearchSpace, Value
    from servelab.tune.study import SearchSettings
    from servelab.tune.tuner import TuneProgress, TuneRequest
    from servelab.tune.workload import TuneWorkload

RANKED_ROWS = 10
STAGE2_PROMPTS = 200
"""Requests per stage-2 server when neither --num-prompts nor --duration is given: a short, honest measurement."""


def parse_prices(text: str | None) -> dict[str, float]:
    """`2.5` (any GPU) or `H100-SXM=2.5,A100-80GB-SXM=1.6` -> {name or '*': $/GPU-hour}."""
    if not text:
        return {}
    from servelab.perf.hardware import get_gpu

    prices: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise TuneError(f"bad --gpu-cost-per-hour item {item!r}: expected DOLLARS or GPU=DOLLARS") from None
        if not (price > 0 and math.isfinite(price)):
            raise TuneError(f"bad --gpu-cost-per-hour item {item!r}: the price must be a finite number > 0")
        if sep:
            name = get_gpu(name).name
        prices[name if sep else "*"] = price
    return prices


def parse_env(items: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TuneError(f"bad --server-env item {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


@dataclass(frozen=True)
class SearchFlags:
    """tune's stage-1 flags: what is searched, for what, and how hard (each declared once, with its help)."""

    sim_args: Annotated[
        str,
        typer.Option(
            callback=shell_words,
            help="Flags only the simulator sees, e.g. '--block-size 128 --kv-cache-memory-bytes 1G' for vLLM CPU.",
        ),
    ] = ""
    space: Annotated[
        Optional[list[str]],
        typer.Option(
            help="KNOB=V1,V2 (or KNOB for built-in values; 'default' = the engine's). "
            "Another --engine's knobs are its flags: max_running_requests, max_batch_size... Repeatable."
        ),
    ] = None
    space_file: Annotated[Optional[Path], typer.Option(help="YAML/JSON mapping knob -> list of values.")] = None
    objective: Annotated[
        str, typer.Option(help="goodput (max rate under the SLO), throughput (under p-limits), or cost.")
    ] = "goodput"
    slo_percentile: Annotated[
        float, typer.Option(callback=real(gt=0, le=100), help="The percentile each --goodput bound applies to.")
    ] = 99.0
    gpu_cost_per_hour: Annotated[
        Optional[str], typer.Option(help="$/GPU-hour: 2.5, or H100-SXM=2.5,A100-80GB-SXM=1.6.")
    ] = None
    n_trials: Annotated[
        int,
        typer.Option(min=1, max=MAX_INT, help="Distinct configurations to simulate (all, if the space is smaller)."),
    ] = 100
    sampler: Annotated[
        str, typer.Option(help="auto (grid when the space fits in --n-trials, else TPE), grid, tpe.")
    ] = "auto"
    search_seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Seed of the TPE sampler.")] = 0
    sim_prompts: Annotated[int, typer.Option(min=1, max=MAX_INT, help="Requests per simulated run in stage 1.")] = 200
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the study in --result-dir without repeating finished trials.")
    ] = False

    def checked_space(self, load: LoadFlags, engine: str) -> SearchSpace:
        """The search space, once the load flags are known to fit a study (tune searches the rate itself)."""
        from servelab.tune.space import SearchSpace

        load.check(resume=self.resume)
        if load.sweep is not None:
            raise TuneError("--sweep does not apply to tune: the goodput objective searches the rate itself")
        if load.ramp_up_strategy is not None:
            raise TuneError("--ramp-up-strategy does not apply to tune: the goodput objective searches the rate itself")
        if self.resume and load.result_dir is None:
            raise TuneError("--resume needs the --result-dir of the study to continue")
        space = (
            SearchSpace.from_file(self.space_file, engine)
            if self.space_file
            else SearchSpace.from_items(self.space or [], engine)
        )
        if self.space_file and self.space:
            raise TuneError("--space and --space-file both define the search space; give one")
        return space

    def goal(self, load: LoadFlags) -> Objective:
        """--objective with its SLO (--goodput at --slo-percentile), the rate a cost must sustain, and the prices."""
        from servelab.tune.objectives import Objective, kind_named

        arrival = load.arrival()
        return Objective(
            kind_named(self.objective),
            load.slo(),
            self.slo_percentile,
            target_rate=arrival.request_rate if arrival.open_loop else None,
            gpu_cost_per_hour=parse_prices(self.gpu_cost_per_hour),
        )

    def workloads(self, load: LoadFlags) -> tuple[TuneWorkload, TuneWorkload]:
        """Stage 1's (--sim-prompts of the workload per simulated run) and stage 2's (--num-prompts, default 200, or
        --duration per server): the same requests, arrivals and seed."""
        from servelab.tune.workload import TuneWorkload
        from servelab.workload.plan import Amount

        arrival = load.arrival()
        sim_amount = Amount(
            num_prompts=self.sim_prompts, max_plan_tokens=load.max_plan_tokens, count_flag="--sim-prompts"
        )
        bench_amount = (
            load.amount() if load.num_prompts or load.duration else Amount(STAGE2_PROMPTS, warmup=load.warmup)
        )
        return TuneWorkload(load.workload(), arrival, sim_amount), TuneWorkload(load.workload(), arrival, bench_amount)

    def settings(self) -> SearchSettings:
        from servelab.tune.study import SearchSettings

        return SearchSettings(self.n_trials, self.sampler, self.search_seed)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Stage2Flags:
    """tune's stage-2 flags: how a real server is started for each configuration measured."""

    server_cmd: Annotated[
        Optional[str], typer.Option(help="Stage 2: command template with {engine_args} (and optional {port}).")
    ] = None
    server_env: Annotated[
        Optional[list[str]], typer.Option(help="KEY=VALUE for the server's environment. Repeatable.")
    ] = None
    server_port: Annotated[
        Optional[int],
        typer.Option(min=1, max=65535, help="Stage 2: the port servers listen on (default: a free one each)."),
    ] = None
    top_k: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_INT, help="Stage 2: how many of the simulator's best to measure (plus the baseline)."
        ),
    ] = 3
    startup_timeout: Annotated[
        float, typer.Option(callback=real(gt=0), help="Stage 2: seconds to wait for /health.")
    ] = 300.0

    def server(self) -> ServerCommand | None:
        """Stage 2's server command; None (no stage 2) without --server-cmd."""
        from servelab.tune.confirm import ServerCommand

        if not self.server_cmd:
            return None
        env = parse_env(self.server_env)
        return ServerCommand(self.server_cmd, env, startup_timeout=self.startup_timeout, port=self.server_port)


@app.command()
@flag_block("stage2", Stage2Flags)
@flag_block("search", SearchFlags)
@load_options
def tune(
    gpu: GpuFlag = None,
    model: ModelFlag = None,
    calibration: CalibrationFlag = None,
    engine_args: EngineArgsFlag = "",
    engine: EngineFlag = VLLM,
    report: ReportFlag = False,
    ray_address: RayAddress = None,
    ray_gpu_resource: RayGpuResource = "GPU",
    *,
    load: LoadFlags,
    search: SearchFlags,
    stage2: Stage2Flags,
) -> None:
    """Search the launch flags on the simulator, confirm the best on real servers, print the line to run.

    The workload flags are bench's: stage 1 simulates --sim-prompts of them per
    run; stage 2 sends --num-prompts (default 200) or --duration to each server.
    """
    # The optimiser, the simulator and the server launcher: imported when a study runs, not for --help.
    from servelab.perf.calibration import load_profile
    from servelab.tune.tuner import TuneRequest

    space, goal, server = search.checked_space(load, engine), search.goal(load), stage2.server()
    sim_workload, bench_workload = search.workloads(load)
    simulated_line = f"{engine_args} {search.sim_args}".strip()
    simulated = deployment_from_flags(gpu, model, simulated_line, calibration=calibration, engine=engine)
    launch = deployment_from_flags(gpu, model, engine_args, calibration=calibration, engine=engine)
    output = load.output_dir("tune", resume=search.resume)  # emptied with --overwrite, now every flag is read
    request = TuneRequest(
        simulated=simulated,
        launch=launch,
        sim_args=search.sim_args,
        calibration=None if calibration is None else str(calibration),
        space=space,
        objective=goal,
        sim_workload=sim_workload,
        bench_workload=bench_workload,
        search=search.settings(),
        output=output,
        resume=search.resume,
        server=server,
        top_k=stage2.top_k,
        server_check=None if calibration is None or server is None else _speed_check(load_profile(calibration)),
        pool=ray_pool(ray_address),
        gpu_resource=ray_gpu_resource,
    )
    _show(request, load.json, report, engine)


def _show(request: TuneRequest, json_out: bool, report: bool, engine: str) -> None:
    """Run the study, live progress on the terminal (none for --json), then tune.json printed or its tables."""
    from servelab.tune.outcome import TUNE_JSON, document_text

    console = make_console()
    doc = _run(request, None if json_out else _live_progress(console, request.objective, engine))
    if json_out:
        print(document_text(doc))
    else:
        render(console, doc)
        console.print(f"all trials: {request.output / TUNE_JSON}")
    if report:
        report_into(request.output, make_console(stderr=True) if json_out else console)


def _run(request: TuneRequest, progress: TuneProgress | None) -> TuneDocument:
    """The study, with SIGTERM taken as Ctrl-C: either stops it with the finished trials kept."""
    from servelab.tune.tuner import run

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(request, progress)
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"finished trials are kept; continue with --resume --result-dir {request.output}"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _speed_check(profile: CalibrationProfile) -> ServerCheck:
    """Each stage-2 server re-times the profile's reference step: predictions hold for the calibrated speed."""
    from servelab.calibrate.probes import PROBE_EXTRA_BODY
    from servelab.calibrate.reference import speed_check
    from servelab.targets.http import HttpTarget

    def check(base_url: str, config: Stage2Config, directory: Path) -> list[str]:
        target = HttpTarget(base_url, ignore_eos=True, extra_body=PROBE_EXTRA_BODY)
        target.preflight()
        deployment = config.deployment
        return speed_check(
            profile.reference, target, deployment.config.max_num_seqs, deployment.model.vocab_size, directory
        )

    return check


def _defaults(engine: str) -> str:
    """What an empty launch line means, in words."""
    return f"({LABELS[engine]} defaults)"


def _live_progress(console: Console, goal: Objective, engine: str) -> TuneProgress:
    from servelab.tune.fleet_stage2 import is_fleet
    from servelab.tune.space import ROUTER
    from servelab.tune.tuner import TuneProgress

    def on_trial(trial: Trial, evaluated: int, budget: int) -> None:
        score = (
            "cannot run"
            if trial.score is None
            else f"{trial.score:,.4g} {goal.unit}{'' if trial.feasible else ' (SLO missed)'}"
        )
        console.print(f"[dim]trial {evaluated}/{budget}[/] {_knobs(trial.params)}: {score}")

    def on_start(config: Stage2Config) -> None:
        servers = (
            f"{config.deployment.config.data_parallel_size} servers behind servelab's {config.params[ROUTER]} route"
            if is_fleet(config)
            else "the server"
        )
        console.print(
            f"[bold]stage 2[/] {config.label}: starting {servers} with {config.engine_args or _defaults(engine)}"
        )

    def on_result(result: Stage2Row) -> None:
        for warning in result.warnings:
            console.print(f"  [yellow]warning[/]: {warning}")
        if result.error:
            console.print(f"  [red]failed[/]: {result.error.splitlines()[0]}")
        else:
            console.print(
                f"  measured {result.measured_score:,.4g} {goal.unit} (predicted {result.predicted_score:,.4g}); "
                f"server up in {result.startup_s:.0f} s, bench {result.bench_s:.0f} s"
            )
        if result.replicas:
            served = " / ".join(_num(load.requests_served, "d") for load in result.replicas)
            hits = " / ".join(_num(load.prefix_cache_hit_rate, ".0%") for load in result.replicas)
            console.print(f"  per replica: requests served {served}; prefix-cache hits {hits}")

    return TuneProgress(on_trial, on_start, on_result)


def _knobs(params: Mapping[str, Value]) -> str:
    return " ".join(f"{k}={'default' if v is None else v}" for k, v in params.items()) or "(baseline)"


def _num(value: float | None, fmt: str = ",.4g") -> str:
    return "-" if value is None else format(value, fmt)


def _simulator(deployment: TuneDeployment, gpus: list[object] | None = None) -> str:
    """Which simulator the predictions come from: a calibrated one is worth naming, an uncalibrated one worth
    flagging; `gpus`, the GPUs the search tried where it varied them (each on its own catalogue rates)."""
    profile = deployment.calibration
    engine = "" if deployment.engine == VLLM else f" {LABELS[deployment.engine]}"
    if profile:
        return f"simulated{engine}, calibrated by {profile}"
    chips = ", ".join(map(str, gpus)) if gpus and len(gpus) > 1 else deployment.gpu
    return f"simulated{engine} on catalogue rates of {chips}"


def render(console: Console, doc: TuneDocument) -> None:
    """tune.json on the terminal: stage 1's ranking and Pareto front, stage 2's measurements, the recommendation."""
    from servelab.tune.space import GPU

    simulator = _simulator(doc.deployment, doc.space.get(GPU))
    console.print(_stage1_table(doc, simulator))
    console.print(f"evaluated {doc.search.evaluated} of {doc.search.space_size} configurations ({doc.search.sampler})")
    console.print(f"Pareto front (output tok/s vs p99 TTFT): {_pareto_front(doc) or '-'}")
    if doc.stage2:
        console.print(_stage2_table(doc))
        console.print(f"predicted: {simulator}", highlight=False, soft_wrap=True)
    _recommendation(console, doc)


def _stage1_table(doc: TuneDocument, simulator: str) -> Table:
    """The baseline and the best RANKED_ROWS trials as the simulator scored them, intervals beside the statistics."""
    from servelab.metrics.intervals import interval_suffix

    objective = doc.objective
    unit = objective.unit
    trials = {t.number: t for t in doc.trials}
    slo_terms = objective.slo.model_dump(exclude_none=True) if objective.slo else None
    table = Table(
        title=f"stage 1 ({simulator}): {objective.kind} ({unit}), SLO {slo_terms} at p{objective.percentile:g}"
    )
    for column in ("#", "trial", "configuration", unit, "SLO", "req/s", "out tok/s", "p99 TTFT ms", "p99 TPOT ms"):
        table.add_column(column, justify="right" if column not in ("configuration",) else "left")
    rows = [("base", "-", doc.baseline)] + [
        (str(i + 1), str(n), trials[n]) for i, n in enumerate(doc.ranking[:RANKED_ROWS])
    ]
    for rank, number, t in rows:
        m = t.metrics
        slo = "cannot run" if not t.ran else ("met" if t.feasible else "missed")
        table.add_row(
            rank,
            number,
            _knobs(t.params) if number != "-" else (t.engine_args or _defaults(doc.deployment.engine)),
            _num(t.score),
            slo,
            _num(m.request_throughput) + interval_suffix(m.intervals, "request_throughput"),
            _num(m.output_throughput),
            _num(m.p99_ttft_ms) + interval_suffix(m.intervals, "p99_ttft_ms"),
            _num(m.p99_tpot_ms),
        )
    return table


def _pareto_front(doc: TuneDocument) -> str:
    """The trials no other beats on both output tok/s and p99 TTFT, as `#N tok/s @ ms`."""
    trials = {t.number: t for t in doc.trials}
    return ", ".join(
        f"#{n} {_num(trials[n].metrics.statistic(doc.pareto.x))} tok/s @ "
        f"{_num(trials[n].metrics.statistic(doc.pareto.y))} ms"
        for n in doc.pareto.trials
    )


def _stage2_table(doc: TuneDocument) -> Table:
    """Each configuration measured on a real server beside what the simulator predicted for it."""
    from servelab.metrics.intervals import interval_suffix
    from servelab.schemas.tune import KeyMetrics

    unit = doc.objective.unit
    measured = Table(title="stage 2: measured on the real server vs predicted")
    columns = ("config", "changes", f"predicted {unit}", f"measured {unit}", "pred p99 TTFT", "meas p99 TTFT")
    for column in (*columns, "meas req/s", "SLO"):
        measured.add_column(column)
    for r in doc.stage2.results if doc.stage2 else []:
        m = r.measured or KeyMetrics()
        slo = "-" if r.measured_violation is None else ("met" if r.measured_violation <= 0 else "missed")
        measured.add_row(
            r.label,
            _knobs(r.params),
            _num(r.predicted_score),
            "failed" if r.error else _num(r.measured_score),
            _num(r.predicted.p99_ttft_ms) + interval_suffix(r.predicted.intervals, "p99_ttft_ms"),
            _num(m.p99_ttft_ms),
            _num(m.request_throughput),
            slo,
        )
    return measured


def _recommendation(console: Console, doc: TuneDocument) -> None:
    """The configuration to run, measured where stage 2 ran, with its gain and the line to launch it."""
    rec = doc.recommendation
    if rec is None:
        console.print("[red]no configuration in the space can run[/]")
        return
    source = "measured" if rec.source == RecommendationSource.STAGE2 else "predicted"
    gain = rec.gain_over_baseline
    console.print(
        f"[bold green]recommended[/] ({source}): {rec.engine_args or _defaults(doc.deployment.engine)}"
        f"{rec.placement()}: "
        f"{_num(rec.score)} {doc.objective.unit}" + ("" if gain is None else f", {gain:.2f}x the baseline")
    )
    if rec.launch_line:
        console.print(f"launch line: {rec.launch_line}")
