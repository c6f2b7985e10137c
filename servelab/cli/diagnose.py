"""`servelab diagnose`: why this deployment is slow, with the numbers, and what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from servelab.cli import app
from servelab.cli.checks import MAX_INT, real
from servelab.cli.report import ReportFlag, report_into
from servelab.cli.compare import parse_engines
from servelab.cli.options import (
    DEPLOYMENT_PANEL,
    CalibrationFlag,
    EngineArgsFlag,
    GoodputFlag,
    GpuFileFlag,
    GpuFlag,
    ModelFlag,
    ReplicasFlag,
    TpFlag,
    VllmVersionFlag,
    deployment_from_flags,
)
from servelab.errors import InputError
from servelab.diagnose.goal import Goal
from servelab.metrics.host import condition_changes
from servelab.metrics.slo import SLO
from servelab.metrics.engines import AUTO
from servelab.report.console import make_console
from servelab.sim.vocabulary import ENGINES, LABELS, VLLM
from servelab.workload.vocabulary import DISTRIBUTIONS

if TYPE_CHECKING:
    from servelab.workload.lengths import LengthDistribution

DIAGNOSIS = "diagnosis.json"

# The first case servelab exists for: Qwen2.5-7B on one A100, ~1,500-token prompts, max_num_seqs 256,
# ~10 req/s, "GPU utilisation 30%, memory full": why won't QPS go up?
EXAMPLE: dict[str, Any] = {"gpu": "a100-80gb", "model": "qwen2.5-7b", "engine_args": "--max-num-seqs 256", "input_len": 1500,
           "output_len": 200, "request_rate": 10.0, "observed_qps": 10.0, "observed_gpu_util": 0.3}
EXAMPLE_COMMAND = ("servelab diagnose --gpu a100-80gb --model qwen2.5-7b --engine-args \"--max-num-seqs 256\" "
                   "--input-len 1500 --request-rate 10 --observed-qps 10 --observed-gpu-util 0.3")
"""The command line the example stands for (its answer length, like the user's story, not given: assumed)."""


def _results_dir(value: Path | None) -> Path | None:
    """RESULTS must be a directory; a word in square brackets is an optional flag pasted from an example."""
    if value is not None and not value.is_dir():
        hint = ": square brackets in an example mark an optional flag; type it without them" if str(value).startswith("[") else ""
        raise typer.BadParameter(f"{str(value)!r} is not a directory{hint}")
    return value


@app.command()
def diagnose(
    results: Annotated[Optional[Path], typer.Argument(
        callback=_results_dir, metavar="RESULTS", help="A results directory from `servelab bench` (or simulate: its run.json names "
                                           "the deployment, so --gpu/--model may be left out).")] = None,
    gpu: GpuFlag = None,
    model: ModelFlag = None,
    engine_args: EngineArgsFlag = "",
    tp: TpFlag = None,
    replicas: ReplicasFlag = None,
    gpu_file: GpuFileFlag = None,
    calibration: CalibrationFlag = None,
    input_len: Annotated[Optional[int], typer.Option(min=1, max=MAX_INT, help="Described deployment: prompt tokens per request.")] = None,
    output_len: Annotated[Optional[int], typer.Option(min=1, max=MAX_INT, help=(
        "Described deployment: output tokens per request (not given: 200 is assumed, and the answer is shown for 50, "
        "200 and 500)."))] = None,
    request_rate: Annotated[Optional[float], typer.Option(callback=real(gt=0), help="Described deployment: offered req/s (Poisson).")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option(min=1, max=MAX_INT, help="Described deployment: closed-loop concurrency.")] = None,
    observed_qps: Annotated[Optional[float], typer.Option(callback=real(gt=0), help="What you see in production, req/s.")] = None,
    observed_ttft_ms: Annotated[Optional[float], typer.Option(callback=real(gt=0), help="What you see in production, TTFT ms.")] = None,
    observed_gpu_util: Annotated[Optional[float], typer.Option(callback=real(ge=0, le=1), help="nvidia-smi's utilisation, 0-1.")] = None,
    observed_e2e_ms: Annotated[Optional[float], typer.Option(callback=real(gt=0), help="What you see in production: whole-answer latency, ms.")] = None,
    observed_tpot_ms: Annotated[Optional[float], typer.Option(callback=real(gt=0), help="What you see in production: time per output token, ms.")] = None,
    tried: Annotated[Optional[list[str]], typer.Option(
        help="A change you already made and what it did, CHANGE:RESULT (repeatable): CHANGE an engine flag as typed "
             "after `vllm serve`, a quantization (awq, gptq, fp8, int8, w8a8), a GPU name or 'replica'; RESULT "
             "no-effect, helped or hurt. E.g. --tried \"--max-num-batched-tokens 512:no-effect\" --tried awq:no-effect")] = None,
    goal: Annotated[Optional[Goal], typer.Option(
        help="The question to answer first: latency (how long answers take) or throughput (how far QPS can go). "
             "Default: latency when --observed-e2e-ms/--observed-ttft-ms/--observed-tpot-ms is given, throughput "
             "when --observed-qps or --observed-gpu-util is.")] = None,
    output_len_distribution: Annotated[str, typer.Option(
        help="Described deployment: how output lengths vary, SHAPE[:SPREAD] with SHAPE one of "
             f"{', '.join(DISTRIBUTIONS)} (spread as --random-range-ratio): answers that end at EOS vary, "
             "e.g. lognormal:0.5. Default: every answer exactly --output-len.")] = "fixed",
    prefix_len: Annotated[int, typer.Option(min=0, max=MAX_INT, help="Described deployment: tokens of a system prompt every request starts with.")] = 0,
    turns: Annotated[int, typer.Option(min=1, max=MAX_INT, help="Described deployment: turns per conversation; each turn resends the "
                                            "system prompt, every earlier turn and every earlier answer (a chat client).")] = 1,
    gpu_cost_per_hour: Annotated[Optional[float], typer.Option(
        callback=real(gt=0),
        help="$ per GPU-hour of --gpu (default: documented prices in servelab/diagnose/pricing.py); prices the options.")] = None,
    price_options: Annotated[bool, typer.Option("--price-options", help="Price the common options (token budget, quantized "
                                                "weights, FP8 KV, a replica, TP=2, a bigger GPU) at this load.")] = False,
    vllm_version: VllmVersionFlag = None,
    engine: Annotated[str, typer.Option(
        help=f"Which engine served the deployment: {', '.join(ENGINES)}, or auto (the one the run's run.json recorded; "
             "vLLM when none is, or for a described deployment). --engine-args are then in that engine's spelling.",
        rich_help_panel=DEPLOYMENT_PANEL)] = AUTO,
    compare_engines: Annotated[bool, typer.Option(
        "--compare-engines", help="Also run this workload at this load on the other engines (at their defaults, same "
                                  "GPU, model, TP and replicas) and say what switching would buy.")] = False,
    engines: Annotated[Optional[str], typer.Option(
        help=f"With --compare-engines: which engines, comma-separated (default all: {','.join(ENGINES)}), as "
             "`servelab compare --engines` takes them.")] = None,
    goodput: GoodputFlag = None,
    slo_attainment: Annotated[float, typer.Option(callback=real(gt=0, le=1), help="Share of requests that must meet the SLO.")] = 0.9,
    check_advice: Annotated[bool, typer.Option("--check-advice", help="Also evaluate 25 common tuning tips.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON.")] = False,
    details: Annotated[bool, typer.Option("--details", help="Print every finding's evidence, every option priced, the "
                                                            "ceilings and the notes (default: a ~40-line summary).")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the diagnosis as Markdown.")] = False,
    save: Annotated[Optional[Path], typer.Option(help=f"Write the JSON here (default: {DIAGNOSIS} in RESULTS).")] = None,
    warmup: Annotated[float, typer.Option(callback=real(ge=0), help="Seconds at the start of the run to ignore.")] = 0.0,
    report: ReportFlag = False,
) -> None:
    """Find what limits the deployment, the ceiling it implies, and the change that lifts it.

    With no arguments: the built-in example (Qwen2.5-7B on an A100 at ~10 req/s of 1,500-token prompts).
    """
    # The simulator, the models and the renderers: imported when a diagnosis runs, not for --help.
    from servelab.diagnose.analysis import Observed, diagnose_described, diagnose_run
    from servelab.diagnose.engine_terms import check_engine, served_engine
    from servelab.diagnose.scenario import synthetic
    from servelab.diagnose.schema import Diagnosis
    from servelab.diagnose.sensitivity import ASSUMED_OUTPUT, Assumed
    from servelab.diagnose.server_config import CACHE_CONFIG, engine_args_from_server
    from servelab.diagnose.tried import parse_tried
    from servelab.metrics.results import load_run
    from servelab.perf.calibration import load_profile
    from servelab.report.diagnosis_view import render_markdown, render_terminal

    check_engine(engine)
    tried_changes = tuple(parse_tried(text) for text in tried or ())
    if vllm_version is not None and engine not in (VLLM, AUTO):
        raise InputError(f"--vllm-version describes a vLLM server, not --engine {engine}")
    if engines is not None and not compare_engines:
        raise InputError("--engines chooses the engines --compare-engines runs: add --compare-engines")
    switch_to = parse_engines(engines or ",".join(ENGINES)) if compare_engines else []
    if report and results is None:
        raise InputError("--report draws a results directory: give RESULTS (a described deployment has no records to plot)")
    if json_out and markdown:
        raise InputError("--json and --markdown both choose the output format; pick one")
    described = any(v is not None for v in (input_len, output_len, request_rate, max_concurrency))
    if results is not None and described:
        raise InputError("RESULTS and --input-len/--output-len/--request-rate/--max-concurrency both describe the workload; "
                         "give a results directory or a described deployment, not both")
    example = (results is None and not described and gpu is None and model is None and calibration is None
               and engine in (AUTO, VLLM))  # the example is a vLLM deployment
    assumed: tuple[Assumed, ...] = ()
    if example:
        gpu, model, engine_args = EXAMPLE["gpu"], EXAMPLE["model"], EXAMPLE["engine_args"]
        input_len, output_len, request_rate = EXAMPLE["input_len"], EXAMPLE["output_len"], EXAMPLE["request_rate"]
        observed_qps, observed_gpu_util = EXAMPLE["observed_qps"], EXAMPLE["observed_gpu_util"]
    shaped = output_len_distribution != "fixed" or prefix_len or turns != 1
    if results is not None and shaped:
        raise InputError("--output-len-distribution, --prefix-len and --turns describe a workload; a results directory "
                         "already holds the measured one")
    output_lengths = _output_lengths(output_len_distribution, output_len) if output_len is not None else None
    slo = SLO.parse(goodput)
    run = load_run(results) if results is not None else None
    served, engine_note = served_engine(engine, run.run_info if run is not None else {})
    if check_advice and served != VLLM:
        raise InputError(f"--check-advice judges vLLM's common tuning tips; the deployment is {LABELS[served]}'s")
    if run is not None and gpu is None and model is None and calibration is None:
        gpu, model, calibration, engine_args, tp, replicas, gpu_file, vllm_version = _simulated_deployment(
            run.run_info, engine_args, tp, replicas, gpu_file, vllm_version)
    server_note = None
    if run is not None and calibration is None and served == VLLM:  # the server's own KV figures beat an estimate
        engine_args, server_note = engine_args_from_server(engine_args, run.run_info.get(CACHE_CONFIG) or {})
    deployment = deployment_from_flags(gpu, model, engine_args, calibration=calibration, tp=tp, replicas=replicas,
                                       gpu_file=gpu_file, vllm_version=vllm_version, engine=served)
    if engine_note is not None:
        make_console(stderr=True).print(f"[yellow]warning:[/] {engine_note}", highlight=False, soft_wrap=True)
    observed = Observed(observed_qps, observed_ttft_ms, observed_gpu_util, observed_e2e_ms, observed_tpot_ms,
                        tried_changes, goal)
    priced = {"with_alternatives": price_options or None, "gpu_cost_per_hour": gpu_cost_per_hour, "engines": switch_to}
    partial = ""
    if run is not None and results is not None:
        partial = run.partial_note()
        dx = diagnose_run(run, deployment, slo=slo, warmup=warmup, observed=observed, slo_share=slo_attainment,
                          with_advice=check_advice, **priced)
        if calibration is not None:  # a run measured under other conditions than the profile's is not comparable
            dx.notes.extend(condition_changes(load_profile(calibration).host, run.run_info.get("client_host", {}),
                                              now_label="during this run", then_label="at calibration"))
        if server_note is not None:
            dx.notes.insert(0, server_note)
        if engine_note is not None:
            dx.notes.insert(0, engine_note)
    else:
        if input_len is None:
            raise InputError("a described deployment needs --input-len")
        if output_len is None or example:  # the example's story gives no answer length either
            output_len, assumed = output_len or ASSUMED_OUTPUT, (Assumed.OUTPUT,)
            output_lengths = _output_lengths(output_len_distribution, output_len)
        rate = request_rate if request_rate is not None else (observed_qps if max_concurrency is None else None)
        if rate is None and max_concurrency is None:
            raise InputError("a described deployment needs --request-rate, --max-concurrency or --observed-qps")
        scenario = synthetic(input_len, output_len, request_rate=rate, max_concurrency=max_concurrency,
                             prefix_len=prefix_len, turns=turns, output_lengths=output_lengths)
        if rate is not None:
            assumed += (Assumed.ARRIVALS,)
        dx = diagnose_described(deployment, scenario, slo=slo, observed=observed, slo_share=slo_attainment,
                                with_advice=check_advice, assumed=assumed, **priced)
    data = dx.as_dict()
    if partial:  # said first and kept in the JSON: every number below rests on a run cut short
        data["partial_run"] = partial
        make_console(stderr=True).print(f"[yellow]{partial}[/]", highlight=False, soft_wrap=True)
    typed = Diagnosis.model_validate_json(json.dumps(data, default=str))
    target = save or (results / DIAGNOSIS if results is not None else None)
    if target is not None:
        target.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if json_out:
        typer.echo(json.dumps(data, indent=2, default=str))
    elif markdown:
        typer.echo(render_markdown(typed))
    else:
        console = make_console()
        if example:
            console.print(f"[dim]No deployment given: diagnosing the built-in example, {EXAMPLE_COMMAND} "
                          "(servelab diagnose --help for your own).[/]", highlight=False)
        render_terminal(typed, console, details or check_advice or compare_engines)
    if report and results is not None:
        report_into(results, make_console(stderr=json_out or markdown))


def _simulated_deployment(run_info: dict[str, Any], engine_args: str, tp: int | None, replicas: int | None,
                          gpu_file: Path | None, vllm_version: str | None) -> tuple[Any, ...]:
    """The deployment a simulated run's run.json records (its simulate flags), for `diagnose RESULTS` without
    --gpu/--model/--calibration; flags given here still win. A measured run records no hardware: unchanged."""
    flags = run_info.get("flags") or {}
    if run_info.get("source") != "sim":
        return None, None, None, engine_args, tp, replicas, gpu_file, vllm_version
    path = lambda key: Path(flags[key]) if flags.get(key) else None  # noqa: E731
    return (flags.get("gpu"), flags.get("model"), path("calibration"), engine_args or flags.get("engine_args") or "",
            tp if tp is not None else flags.get("tp"), replicas if replicas is not None else flags.get("replicas"),
            gpu_file or path("gpu_file"), vllm_version or flags.get("vllm_version"))


def _output_lengths(spec: str, mean: int) -> LengthDistribution:
    """`--output-len-distribution SHAPE[:SPREAD]` around --output-len; one error naming the flag when malformed."""
    from servelab.workload.lengths import LengthDistribution

    shape, _, spread = spec.partition(":")
    try:
        return LengthDistribution(mean, shape, float(spread) if spread else (0.0 if shape == "fixed" else 0.5))
    except ValueError as exc:  # WorkloadError is one
        raise InputError(f"--output-len-distribution {spec!r}: give SHAPE[:SPREAD], SHAPE one of "
                         f"{', '.join(DISTRIBUTIONS)}, e.g. lognormal:0.5 ({exc})") from None
