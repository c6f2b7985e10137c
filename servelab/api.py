"""servelab from Python: run a benchmark or a simulation, diagnose it, read any results directory as DataFrames.

    import servelab
    run = servelab.simulate("a100-80gb", "qwen2.5-7b", input_len=1500, output_len=200, request_rate=10,
                            result_dir="results/a100")
    run.summary.median_ttft_ms, run.summary.p99_ttft_ms  # typed: servelab.schemas.results.Summary
    run.records()            # pandas DataFrame, one row per request (records.jsonl), with ttft_s and e2el_s
    dx = servelab.diagnosis(run, "a100-80gb", "qwen2.5-7b")
    dx.bottleneck, [f.title for f in dx.findings]          # typed: servelab.schemas.diagnosis.Diagnosis

The functions write the same results directory as the CLI verbs (`bench`,
`simulate`) and return what the CLI would print as typed models (the models
docs/schemas is generated from). Errors are the CLI's: `servelab.errors`.
A smaller surface than the CLI on purpose: the common load shapes (random
prompts of fixed lengths, Poisson or closed loop); anything else through
the CLI's results directories and `load_results`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.flags.options import LoadFlags
from servelab.errors import InputError
from servelab.metrics.engines import AUTO
from servelab.metrics.slo import SLO
from servelab.schemas.profile import CalibrationProfile
from servelab.results_dir import clear_result_dir, result_dir_refusal
from servelab.runs import bench as bench_verb, simulate as simulate_verb
from servelab.runs.request import BenchRequest, DeploymentFlags, ServerFlags, SimulateRequest
from servelab.runs.results import Results, SweepResults, load_results
from servelab.schemas.compare import EngineComparison
from servelab.schemas.diagnosis import Diagnosis
from servelab.schemas.validation import ValidationReport
from servelab.schemas.vocabulary import ENGINES
from servelab.targets.deployment import build_deployment
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan

if TYPE_CHECKING:
    from servelab.schemas.tune import TuneDocument

__all__ = [
    "Results",
    "load_results",
    "simulate",
    "bench",
    "diagnosis",
    "calibrate_from",
    "calibration",
    "validation",
    "comparison",
    "tune",
]


def _load(
    result_dir: str | Path,
    overwrite: bool,
    input_len: int,
    output_len: int,
    request_rate: float,
    max_concurrency: int | None,
    num_prompts: int,
    seed: int,
    goodput: dict[str, float] | None,
) -> LoadFlags:
    """The API's load arguments as the CLI's flags: random prompts of fixed lengths, Poisson or closed loop."""
    return LoadFlags(
        random_input_len=input_len,
        random_output_len=output_len,
        request_rate=None if math.isinf(request_rate) else request_rate,
        max_concurrency=max_concurrency,
        num_prompts=num_prompts,
        seed=seed,
        goodput=[f"{k}:{v:g}" for k, v in (goodput or {}).items()] or None,
        result_dir=Path(result_dir),
        overwrite=overwrite,
    )


def _plan(
    input_len: int, output_len: int, request_rate: float, max_concurrency: int | None, num_prompts: int, seed: int
) -> Any:
    return build_plan(
        WorkloadConfig(input_len=input_len, output_len=output_len, seed=seed),
        ArrivalConfig(request_rate=request_rate, max_concurrency=max_concurrency),
        Amount(num_prompts=num_prompts),
    )


def _checked_dir(result_dir: str | Path, overwrite: bool) -> Path:
    """`result_dir` as the CLI's --result-dir takes it: an earlier result there is replaced only when asked."""
    directory = Path(result_dir)
    result_dir_refusal(directory, overwrite)
    return directory


def _point(result: Results | SweepResults) -> Results:
    assert isinstance(result, Results), "the API's load is one point, never a sweep"
    return result


def simulate(
    gpu: str,
    model: str,
    *,
    result_dir: str | Path,
    engine_args: str = "",
    input_len: int = 1024,
    output_len: int = 128,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    num_prompts: int = 200,
    seed: int = 0,
    goodput: dict[str, float] | None = None,
    overwrite: bool = False,
    replicas: int | None = None,
    router: str | None = None,
    router_weights: str | None = None,
) -> Results:
    """`servelab simulate`: the load served by the simulated deployment; `goodput` as {"ttft": ms, "tpot": ms}.
    `replicas`, `router` and `router_weights` as `--replicas`, `--router` and `--router-weights` (a fleet).
    A `result_dir` holding an earlier result is refused unless `overwrite` (then emptied first)."""
    load = _load(
        result_dir, overwrite, input_len, output_len, request_rate, max_concurrency, num_prompts, seed, goodput
    )
    flags = DeploymentFlags(
        gpu=gpu, model=model, engine_args=engine_args, replicas=replicas, router=router, router_weights=router_weights
    )
    return _point(simulate_verb.run(SimulateRequest(flags, load)))


def bench(
    base_url: str,
    *,
    result_dir: str | Path,
    model: str | None = None,
    input_len: int = 1024,
    output_len: int = 128,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    num_prompts: int = 200,
    seed: int = 0,
    ignore_eos: bool = False,
    api_key: str | None = None,
    goodput: dict[str, float] | None = None,
    overwrite: bool = False,
) -> Results:
    """`servelab bench`: the load sent to a running OpenAI-compatible server (pre-flight checked first). A
    `result_dir` holding an earlier result is refused unless `overwrite` (then emptied first)."""
    load = _load(
        result_dir, overwrite, input_len, output_len, request_rate, max_concurrency, num_prompts, seed, goodput
    )
    server = ServerFlags(base_url=[base_url], model=model, api_key=api_key, ignore_eos=ignore_eos)
    return _point(bench_verb.run(BenchRequest(server, load)))


def diagnosis(
    results: Results | str | Path,
    gpu: str,
    model: str,
    engine_args: str = "",
    engine: str = AUTO,
    *,
    tried: Sequence[str] = (),
    goal: str | None = None,
    region: str | None = None,
    observed: dict[str, float] | None = None,
    vllm_version: str | None = None,
) -> Diagnosis:
    """`servelab diagnose RESULTS`: what limits the deployment that produced `results`, and what to change.

    `engine` as `diagnose --engine`: auto takes the one run.json recorded (vLLM when none is); `engine_args` are in
    its spelling. `tried` as `--tried` ("CHANGE:RESULT", e.g. "--max-num-batched-tokens 512:no-effect",
    "awq:no-effect"), `goal` as `--goal` (latency or throughput), `region` as `--region`, `observed` the figures seen
    in production (keys qps, ttft_ms, gpu_util, e2e_ms, tpot_ms, as the --observed-* flags). servelab.diagnose.run
    does the work.
    Named `diagnosis`, not `diagnose`: `servelab.diagnose` is the package that does the work."""
    from servelab.diagnose import run
    from servelab.diagnose.request import DeploymentWords, DiagnoseRequest, observed_from, region_named

    directory = results.directory if isinstance(results, Results) else Path(results)
    request = DiagnoseRequest(
        DeploymentWords(gpu, model, engine_args, vllm_version=vllm_version, engine=engine),
        directory,
        observed=observed_from(observed, goal),
        tried=tuple(tried),
        region=region_named(region),
    )
    return run(request)


def calibrate_from(
    results: str | Path | list[str | Path],
    gpu: str,
    model: str,
    *,
    out: str | Path,
    engine_args: str = "",
    vllm_version: str | None = None,
    overwrite: bool = False,
) -> CalibrationProfile:
    """`servelab calibrate --from`: the environment fitted to benchmark results you already have, written to `out`.

    `results`: servelab results directories, `vllm bench serve --save-result` JSONs, GuideLLM or AIPerf exports
    holding every request or their lengths (a file of aggregates only needs the CLI's workload flags).
    """
    from servelab.calibrate import calibrate as verb
    from servelab.calibrate.request import CalibrateRequest

    sources = tuple(Path(r) for r in (results if isinstance(results, list) else [results]))
    return verb.run(
        CalibrateRequest(
            gpu,
            model,
            Path(out),
            sources=sources,
            engine_args=engine_args,
            vllm_version=vllm_version,
            overwrite=overwrite,
        )
    )


def calibration(
    base_url: str,
    gpu: str,
    model: str,
    *,
    out: str | Path,
    engine_args: str = "",
    budget_s: float = 300.0,
    served_model: str | None = None,
    api_key: str | None = None,
    overwrite: bool = False,
) -> CalibrationProfile:
    """`servelab calibrate --base-url`: probe the live server for `budget_s` seconds, fit, write the profile to `out`
    (the raw probe runs beside it, in `<out>.probes/`). `engine_args` are the flags the server runs with. Named
    `calibration`, as `diagnosis`: `servelab.calibrate` is the package that does the work."""
    from servelab.calibrate import calibrate as verb
    from servelab.calibrate.request import CalibrateRequest

    return verb.run(
        CalibrateRequest(
            gpu,
            model,
            Path(out),
            base_url=base_url,
            engine_args=engine_args,
            budget_s=budget_s,
            served_model=served_model,
            api_key=api_key,
            overwrite=overwrite,
        )
    )


def validation(
    calibration: str | Path,
    base_url: str,
    *,
    out: str | Path = "validation.json",
    points: str = "default",
    engine_args: str = "",
    repeats: int = 3,
    served_model: str | None = None,
    api_key: str | None = None,
    overwrite: bool = False,
) -> ValidationReport:
    """`servelab validate`: held-out points on the live server and in the simulator with the profile at `calibration`;
    the report is written to `out` (the measured runs to `<out>.runs/`) and returned."""
    from servelab.calibrate import validate as verb

    return verb.run(
        verb.ValidateRequest(
            Path(calibration),
            base_url,
            Path(out),
            points=points,
            engine_args=engine_args,
            repeats=repeats,
            served_model=served_model,
            api_key=api_key,
            overwrite=overwrite,
        )
    )


def comparison(
    gpu: str,
    model: str,
    *,
    engines: Sequence[str] = ENGINES,
    launch_flags: dict[str, str] | None = None,
    input_len: int = 1024,
    output_len: int = 128,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    num_prompts: int = 200,
    seed: int = 0,
    goodput: dict[str, float] | None = None,
    tensor_parallel_size: int | None = None,
) -> EngineComparison:
    """`servelab compare`: the same load simulated on each engine in `engines`, and why their results differ.
    `launch_flags` maps an engine to its own flags (`{"sglang": "--chunked-prefill-size 4096"}`). Named `comparison`:
    `servelab.compare` is the package that does the work."""
    from servelab.compare import compare as verb

    def plan() -> Any:
        return _plan(input_len, output_len, request_rate, max_concurrency, num_prompts, seed)

    unknown = [e for e in [*engines, *(launch_flags or {})] if e not in ENGINES]
    if unknown or not engines:
        raise InputError(f"comparison(): engines {list(engines)}: give a non-empty subset of {', '.join(ENGINES)}")
    slo = SLO.parse([f"{k}:{v:g}" for k, v in (goodput or {}).items()])
    return verb.run(
        verb.CompareRequest(
            gpu,
            model,
            [("as given", plan)],
            engines=tuple(engines),
            launch_flags=launch_flags or {},
            tensor_parallel_size=tensor_parallel_size,
            slo=slo,
        )
    )


def tune(
    gpu: str,
    model: str,
    space: list[str],
    *,
    result_dir: str | Path,
    engine_args: str = "",
    objective: str = "goodput",
    goodput: dict[str, float] | None = None,
    input_len: int = 1024,
    output_len: int = 128,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    sim_prompts: int = 200,
    n_trials: int = 100,
    gpu_cost_per_hour: dict[str, float] | None = None,
    server_cmd: str | None = None,
    num_prompts: int = 200,
    top_k: int = 3,
    resume: bool = False,
    overwrite: bool = False,
) -> TuneDocument:
    """`servelab tune`: the launch flags of `space` (["max_num_seqs=64,256", "max_num_batched_tokens"], as
    `--space` takes them) searched on the simulator, and with `server_cmd` (a template holding {engine_args}) the
    best `top_k` and the current flags measured on real servers. Returns tune.json as written to `result_dir`; a
    `result_dir` holding an earlier result is refused unless `overwrite` or `resume` (which continues the study)."""
    from servelab.tune import TuneRequest, run
    from servelab.tune.confirm import ServerCommand
    from servelab.tune.objectives import Objective, kind_named
    from servelab.tune.space import SearchSpace
    from servelab.tune.study import SearchSettings
    from servelab.tune.workload import TuneWorkload

    directory = Path(result_dir) if resume else _checked_dir(result_dir, overwrite)
    deployment = build_deployment(gpu, model, engine_args)
    workload = WorkloadConfig(input_len=input_len, output_len=output_len, seed=seed)
    arrival = ArrivalConfig(request_rate=request_rate, max_concurrency=max_concurrency)
    goal = Objective(
        kind_named(objective),
        SLO.parse([f"{k}:{v:g}" for k, v in (goodput or {}).items()]),
        target_rate=request_rate if math.isfinite(request_rate) else None,
        gpu_cost_per_hour=gpu_cost_per_hour or {},
    )
    request = TuneRequest(
        simulated=deployment,
        launch=deployment,
        space=SearchSpace.from_items(space),
        objective=goal,
        sim_workload=TuneWorkload(workload, arrival, Amount(num_prompts=sim_prompts)),
        bench_workload=TuneWorkload(workload, arrival, Amount(num_prompts=num_prompts)),
        search=SearchSettings(n_trials=n_trials),
        output=directory,
        resume=resume,
        top_k=top_k,
        server=None if server_cmd is None else ServerCommand(server_cmd),
    )
    if overwrite and not resume:
        clear_result_dir(directory)
    return run(request)
