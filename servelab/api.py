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

from servelab.schemas.vocabulary import Goal
from servelab.diagnose.regions import Region
from servelab.schemas.diagnosis import Diagnosis
from servelab.errors import InputError
from servelab.experiment.calibrate_from import CalibrateFromRequest, calibrate_from as run_calibrate_from
from servelab.runs import bench as bench_verb, simulate as simulate_verb
from servelab.runs.request import BenchRequest, DeploymentFlags, ServerFlags, SimulateRequest
from servelab.runs.results import Results, SweepResults, load_results
from servelab.cli.options import LoadFlags
from servelab.metrics.engines import AUTO
from servelab.perf.calibration import CalibrationProfile

__all__ = ["Results", "load_results", "simulate", "bench", "diagnosis", "calibrate_from"]


def _load(result_dir: str | Path, overwrite: bool, input_len: int, output_len: int, request_rate: float,
          max_concurrency: int | None, num_prompts: int, seed: int, goodput: dict[str, float] | None) -> LoadFlags:
    """The API's load arguments as the CLI's flags: random prompts of fixed lengths, Poisson or closed loop."""
    return LoadFlags(random_input_len=input_len, random_output_len=output_len,
                     request_rate=None if math.isinf(request_rate) else request_rate, max_concurrency=max_concurrency,
                     num_prompts=num_prompts, seed=seed, goodput=[f"{k}:{v:g}" for k, v in (goodput or {}).items()] or None,
                     result_dir=Path(result_dir), overwrite=overwrite)


def _point(result: Results | SweepResults) -> Results:
    assert isinstance(result, Results), "the API's load is one point, never a sweep"
    return result


def simulate(gpu: str, model: str, *, result_dir: str | Path, engine_args: str = "", input_len: int = 1024,
             output_len: int = 128, request_rate: float = math.inf, max_concurrency: int | None = None,
             num_prompts: int = 200, seed: int = 0, goodput: dict[str, float] | None = None,
             overwrite: bool = False) -> Results:
    """`servelab simulate`: the load served by the simulated deployment; `goodput` as {"ttft": ms, "tpot": ms}.
    A `result_dir` holding an earlier result is refused unless `overwrite` (then emptied first)."""
    load = _load(result_dir, overwrite, input_len, output_len, request_rate, max_concurrency, num_prompts, seed, goodput)
    return _point(simulate_verb.run(SimulateRequest(DeploymentFlags(gpu=gpu, model=model, engine_args=engine_args), load)))


def bench(base_url: str, *, result_dir: str | Path, model: str | None = None, input_len: int = 1024,
          output_len: int = 128, request_rate: float = math.inf, max_concurrency: int | None = None,
          num_prompts: int = 200, seed: int = 0, ignore_eos: bool = False, api_key: str | None = None,
          goodput: dict[str, float] | None = None, overwrite: bool = False) -> Results:
    """`servelab bench`: the load sent to a running OpenAI-compatible server (pre-flight checked first). A
    `result_dir` holding an earlier result is refused unless `overwrite` (then emptied first)."""
    load = _load(result_dir, overwrite, input_len, output_len, request_rate, max_concurrency, num_prompts, seed, goodput)
    server = ServerFlags(base_url=[base_url], model=model, api_key=api_key, ignore_eos=ignore_eos)
    return _point(bench_verb.run(BenchRequest(server, load)))


def diagnosis(results: Results | str | Path, gpu: str, model: str, engine_args: str = "", engine: str = AUTO, *,
              tried: Sequence[str] = (), goal: str | None = None, region: str | None = None,
              observed: dict[str, float] | None = None, vllm_version: str | None = None) -> Diagnosis:
    """`servelab diagnose RESULTS`: what limits the deployment that produced `results`, and what to change.

    `engine` as `diagnose --engine`: auto takes the one run.json recorded (vLLM when none is); `engine_args` are in
    its spelling. `tried` as `--tried` ("CHANGE:RESULT", e.g. "--max-num-batched-tokens 512:no-effect", "awq:no-effect"),
    `goal` as `--goal` (latency or throughput), `region` as `--region`, `observed` the figures seen in production
    (keys qps, ttft_ms, gpu_util, e2e_ms, tpot_ms, as the --observed-* flags). The CLI's own verb does the work.
    Named `diagnosis`, not `diagnose`: `servelab.diagnose` is the package that does the work."""
    from servelab.diagnose.analysis import Observed
    from servelab.diagnose.request import DeploymentWords, DiagnoseRequest, diagnose

    directory = results.directory if isinstance(results, Results) else Path(results)
    figures = dict(observed or {})
    unknown = set(figures) - {"qps", "ttft_ms", "gpu_util", "e2e_ms", "tpot_ms"}
    if unknown:
        raise InputError(f"diagnosis(observed=...): unknown figures {sorted(unknown)}; give qps, ttft_ms, gpu_util, "
                         "e2e_ms or tpot_ms")
    try:
        asked = Goal(goal) if goal is not None else None
        where = Region(region) if region is not None else None
    except ValueError as exc:
        raise InputError(f"diagnosis(): {exc}") from None
    get = figures.get
    seen = Observed(get("qps"), get("ttft_ms"), get("gpu_util"), get("e2e_ms"), get("tpot_ms"), goal=asked)
    request = DiagnoseRequest(DeploymentWords(gpu, model, engine_args, vllm_version=vllm_version, engine=engine),
                              directory, observed=seen, tried=tuple(tried), region=where)
    return diagnose(request)


def calibrate_from(results: str | Path | list[str | Path], gpu: str, model: str, *, out: str | Path, engine_args: str = "",
                   vllm_version: str | None = None, overwrite: bool = False) -> CalibrationProfile:
    """`servelab calibrate --from`: the environment fitted to benchmark results you already have, written to `out`.

    `results`: servelab results directories, `vllm bench serve --save-result` JSONs, GuideLLM or AIPerf exports
    holding every request or their lengths (a file of aggregates only needs the CLI's workload flags).
    """
    sources = tuple(Path(r) for r in (results if isinstance(results, list) else [results]))
    request = CalibrateFromRequest(sources, gpu, model, Path(out), engine_args=engine_args, vllm_version=vllm_version,
                                   overwrite=overwrite)
    return run_calibrate_from(request)
