"""`servelab diagnose`: why this deployment is slow, with the numbers, and what to change.

The verb is servelab.diagnose.request.diagnose; this face parses the flags into its request and renders the
document. Heavy imports stay inside the function (`servelab --help` imports none of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from servelab.cli import app
from servelab.flags.checks import MAX_INT, real
from servelab.cli.report import ReportFlag, report_into
from servelab.flags.options import (
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
    flag_block,
)
from servelab.schemas.vocabulary import Goal
from servelab.diagnose.regions import Region
from servelab.diagnose.text_tokens import Script
from servelab.errors import InputError
from servelab.metrics.engines import AUTO
from servelab.schemas.vocabulary import ENGINES
from servelab.schemas.vocabulary import DISTRIBUTIONS

if TYPE_CHECKING:
    from servelab.diagnose.request import DeploymentWords, DiagnoseRequest
    from servelab.schemas.diagnosis import Diagnosis
    from servelab.targets.deployment import Deployment

DIAGNOSIS = "diagnosis.json"


def _results_dir(value: Path | None) -> Path | None:
    """RESULTS must be a directory; a word in square brackets is an optional flag pasted from an example."""
    if value is not None and not value.is_dir():
        hint = (
            ": square brackets in an example mark an optional flag; type it without them"
            if str(value).startswith("[")
            else ""
        )
        raise typer.BadParameter(f"{str(value)!r} is not a directory{hint}")
    return value


# diagnose's own flags, each declared once with its help (the shared deployment flags are in cli/options.py).
ResultsFlag = Annotated[
    Optional[Path],
    typer.Argument(
        callback=_results_dir,
        metavar="RESULTS",
        help="A results directory from `servelab bench` (or simulate: its run.json names "
        "the deployment, so --gpu/--model may be left out).",
    ),
]
InputLenFlag = Annotated[
    Optional[int], typer.Option(min=1, max=MAX_INT, help="Described deployment: prompt tokens per request.")
]
InputCharsFlag = Annotated[
    Optional[int],
    typer.Option(
        min=1,
        max=MAX_INT,
        help=(
            "Described deployment: prompt length in characters instead of tokens, turned into tokens by --script (the "
            "ratio is printed)."
        ),
    ),
]
ScriptFlag = Annotated[
    Optional[Script],
    typer.Option(
        help=(
            "The script --input-chars are written in: latin (~4 characters per token) or cjk (Chinese, Japanese, "
            "Korean: "
            "~1.5). Default: latin, said as an assumption."
        )
    ),
]
OutputLenFlag = Annotated[
    Optional[int],
    typer.Option(
        min=1,
        max=MAX_INT,
        help=(
            "Described deployment: output tokens per request (not given: 200 is assumed, and the answer is shown for "
            "50, "
            "200 and 500)."
        ),
    ),
]
RequestRateFlag = Annotated[
    Optional[float], typer.Option(callback=real(gt=0), help="Described deployment: offered req/s (Poisson).")
]
MaxConcurrencyFlag = Annotated[
    Optional[int], typer.Option(min=1, max=MAX_INT, help="Described deployment: closed-loop concurrency.")
]
ObservedQpsFlag = Annotated[
    Optional[float], typer.Option(callback=real(gt=0), help="What you see in production, req/s.")
]
ObservedTtftMsFlag = Annotated[
    Optional[float], typer.Option(callback=real(gt=0), help="What you see in production, TTFT ms.")
]
ObservedGpuUtilFlag = Annotated[
    Optional[float], typer.Option(callback=real(ge=0, le=1), help="nvidia-smi's utilisation, 0-1.")
]
ObservedE2eMsFlag = Annotated[
    Optional[float], typer.Option(callback=real(gt=0), help="What you see in production: whole-answer latency, ms.")
]
ObservedTpotMsFlag = Annotated[
    Optional[float], typer.Option(callback=real(gt=0), help="What you see in production: time per output token, ms.")
]
TriedFlag = Annotated[
    Optional[list[str]],
    typer.Option(
        help="A change you already made and what it did, CHANGE:RESULT (repeatable): CHANGE an engine flag as typed "
        "after `vllm serve`, a quantization (awq, gptq, fp8, int8, w8a8), a GPU name or 'replica'; RESULT "
        'no-effect, helped or hurt. E.g. --tried "--max-num-batched-tokens 512:no-effect" --tried awq:no-effect'
    ),
]
GoalFlag = Annotated[
    Optional[Goal],
    typer.Option(
        help="The question to answer first: latency (how long answers take) or throughput (how far QPS can go). "
        "Default: latency when --observed-e2e-ms/--observed-ttft-ms/--observed-tpot-ms is given, throughput "
        "when --observed-qps or --observed-gpu-util is."
    ),
]
OutputLenDistributionFlag = Annotated[
    str,
    typer.Option(
        help="Described deployment: how output lengths vary, SHAPE[:SPREAD] with SHAPE one of "
        f"{', '.join(DISTRIBUTIONS)} (spread as --random-range-ratio): answers that end at EOS vary, "
        "e.g. lognormal:0.5. Default: every answer exactly --output-len."
    ),
]
PrefixLenFlag = Annotated[
    int,
    typer.Option(min=0, max=MAX_INT, help="Described deployment: tokens of a system prompt every request starts with."),
]
TurnsFlag = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_INT,
        help="Described deployment: turns per conversation; each turn resends the "
        "system prompt, every earlier turn and every earlier answer (a chat client).",
    ),
]
RegionFlag = Annotated[
    Optional[Region],
    typer.Option(
        help=(
            "Where you buy or rent GPUs: global, or china (H20, L20 new; H800, A800 rented) — the chips the "
            "alternatives may name. Default: global, said as an assumption."
        )
    ),
]
GpuCostPerHourFlag = Annotated[
    Optional[float],
    typer.Option(
        callback=real(gt=0),
        help="$ per GPU-hour of --gpu (default: documented prices in servelab/diagnose/pricing.py); prices the "
        "options.",
    ),
]
PriceOptionsFlag = Annotated[
    bool,
    typer.Option(
        "--price-options",
        help="Price the common options (token budget, quantized "
        "weights, FP8 KV, a replica, TP=2, a bigger GPU) at this load.",
    ),
]
EngineFlag = Annotated[
    str,
    typer.Option(
        help=f"Which engine served the deployment: {', '.join(ENGINES)}, or auto (the one the run's run.json recorded; "
        "vLLM when none is, or for a described deployment). --engine-args are then in that engine's spelling.",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
CompareEnginesFlag = Annotated[
    bool,
    typer.Option(
        "--compare-engines",
        help="Also run this workload at this load on the other engines (at their defaults, same "
        "GPU, model, TP and replicas) and say what switching would buy.",
    ),
]
EnginesFlag = Annotated[
    Optional[str],
    typer.Option(
        help=f"With --compare-engines: which engines, comma-separated (default all: {','.join(ENGINES)}), as "
        "`servelab compare --engines` takes them."
    ),
]
SloAttainmentFlag = Annotated[
    float, typer.Option(callback=real(gt=0, le=1), help="Share of requests that must meet the SLO.")
]
CheckAdviceFlag = Annotated[bool, typer.Option("--check-advice", help="Also evaluate 25 common tuning tips.")]
JsonOutFlag = Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON.")]
DetailsFlag = Annotated[
    bool,
    typer.Option(
        "--details",
        help="Print every finding's evidence, every option priced, the "
        "ceilings and the notes (default: a ~40-line summary).",
    ),
]
MarkdownFlag = Annotated[bool, typer.Option("--markdown", help="Print the diagnosis as Markdown.")]
SaveFlag = Annotated[Optional[Path], typer.Option(help=f"Write the JSON here (default: {DIAGNOSIS} in RESULTS).")]
WarmupFlag = Annotated[float, typer.Option(callback=real(ge=0), help="Seconds at the start of the run to ignore.")]


@dataclass(frozen=True)
class DiagnoseFlags:
    """diagnose's flags besides RESULTS, each declared once (the aliases above carry the help): the deployment, the
    described workload, what was seen in production, the question, and how the answer is shown."""

    gpu: GpuFlag = None
    model: ModelFlag = None
    engine_args: EngineArgsFlag = ""
    tp: TpFlag = None
    replicas: ReplicasFlag = None
    gpu_file: GpuFileFlag = None
    calibration: CalibrationFlag = None
    input_len: InputLenFlag = None
    input_chars: InputCharsFlag = None
    script: ScriptFlag = None
    output_len: OutputLenFlag = None
    request_rate: RequestRateFlag = None
    max_concurrency: MaxConcurrencyFlag = None
    observed_qps: ObservedQpsFlag = None
    observed_ttft_ms: ObservedTtftMsFlag = None
    observed_gpu_util: ObservedGpuUtilFlag = None
    observed_e2e_ms: ObservedE2eMsFlag = None
    observed_tpot_ms: ObservedTpotMsFlag = None
    tried: TriedFlag = None
    goal: GoalFlag = None
    output_len_distribution: OutputLenDistributionFlag = "fixed"
    prefix_len: PrefixLenFlag = 0
    turns: TurnsFlag = 1
    region: RegionFlag = None
    gpu_cost_per_hour: GpuCostPerHourFlag = None
    price_options: PriceOptionsFlag = False
    vllm_version: VllmVersionFlag = None
    engine: EngineFlag = AUTO
    compare_engines: CompareEnginesFlag = False
    engines: EnginesFlag = None
    goodput: GoodputFlag = None
    slo_attainment: SloAttainmentFlag = 0.9
    check_advice: CheckAdviceFlag = False
    json_out: JsonOutFlag = False
    details: DetailsFlag = False
    markdown: MarkdownFlag = False
    save: SaveFlag = None
    warmup: WarmupFlag = 0.0
    report: ReportFlag = False

    def check(self, results: Path | None) -> None:
        """The clashes between flags that no single flag's type can refuse."""
        if self.engines is not None and not self.compare_engines:
            raise InputError("--engines chooses the engines --compare-engines runs: add --compare-engines")
        if self.report and results is None:
            raise InputError(
                "--report draws a results directory: give RESULTS (a described deployment has no records to plot)"
            )
        if self.json_out and self.markdown:
            raise InputError("--json and --markdown both choose the output format; pick one")

    def request(self, results: Path | None) -> DiagnoseRequest:
        """The verb's request: the flags grouped as servelab.diagnose.request reads them."""
        from servelab.cli.compare import parse_engines
        from servelab.diagnose.analysis import Observed
        from servelab.diagnose.request import Described, DeploymentWords, DiagnoseRequest

        words = DeploymentWords(
            gpu=self.gpu,
            model=self.model,
            engine_args=self.engine_args,
            tp=self.tp,
            replicas=self.replicas,
            gpu_file=self.gpu_file,
            calibration=self.calibration,
            vllm_version=self.vllm_version,
            engine=self.engine,
        )
        described = Described(
            input_len=self.input_len,
            input_chars=self.input_chars,
            script=self.script,
            output_len=self.output_len,
            request_rate=self.request_rate,
            max_concurrency=self.max_concurrency,
            output_len_distribution=self.output_len_distribution,
            prefix_len=self.prefix_len,
            turns=self.turns,
        )
        observed = Observed(
            qps=self.observed_qps,
            ttft_ms=self.observed_ttft_ms,
            gpu_util=self.observed_gpu_util,
            e2e_ms=self.observed_e2e_ms,
            tpot_ms=self.observed_tpot_ms,
            goal=self.goal,
        )
        return DiagnoseRequest(
            words,
            results,
            described,
            observed,
            tried=tuple(self.tried or ()),
            region=self.region,
            goodput=self.goodput,
            slo_attainment=self.slo_attainment,
            warmup=self.warmup,
            price_options=self.price_options,
            gpu_cost_per_hour=self.gpu_cost_per_hour,
            check_advice=self.check_advice,
            compare_engines=parse_engines(self.engines or ",".join(ENGINES)) if self.compare_engines else [],
        )

    @property
    def form(self) -> str:
        """How the diagnosis is printed: json, markdown or the terminal's summary."""
        return "json" if self.json_out else "markdown" if self.markdown else "terminal"


@app.command()
@flag_block("flags", DiagnoseFlags)
def diagnose(results: ResultsFlag = None, *, flags: DiagnoseFlags) -> None:
    """Find what limits the deployment, the ceiling it implies, and the change that lifts it.

    With no arguments: the built-in example (Qwen2.5-7B on an A100 at ~10 req/s of 1,500-token prompts).
    """
    from servelab.diagnose import run

    flags.check(results)
    request = flags.request(results)
    dx = run(request, _deployment, _warn)
    target = flags.save or (results / DIAGNOSIS if results is not None else None)
    if target is not None:
        target.write_text(dx.model_dump_json(indent=2) + "\n", encoding="utf-8")
    _show(request, dx, flags.form, flags.details or flags.check_advice or flags.compare_engines)
    if flags.report and results is not None:
        from servelab.report.console import make_console

        report_into(results, make_console(stderr=flags.form != "terminal"))


def _deployment(w: DeploymentWords) -> Deployment:
    """The deployment the words name, calibration profiles included (the library's default reads catalogues only)."""
    from servelab.flags.options import deployment_from_flags

    return deployment_from_flags(
        w.gpu,
        w.model,
        w.engine_args,
        calibration=w.calibration,
        tp=w.tp,
        replicas=w.replicas,
        router=w.router,
        gpu_file=w.gpu_file,
        vllm_version=w.vllm_version,
        engine=w.engine,
        router_weights=w.router_weights,
    )


def _warn(text: str) -> None:
    from servelab.report.console import make_console

    make_console(stderr=True).print(f"[yellow]warning:[/] {text}", highlight=False, soft_wrap=True)


def _show(request: DiagnoseRequest, dx: Diagnosis, form: str, details: bool) -> None:
    """The diagnosis on stdout as JSON, Markdown or the terminal's summary (every detail with `details`)."""
    from servelab.diagnose.request import EXAMPLE_COMMAND, is_example
    from servelab.report.console import make_console
    from servelab.report.diagnosis_view import render_markdown, render_terminal

    if form == "json":
        typer.echo(dx.model_dump_json(indent=2))
    elif form == "markdown":
        typer.echo(render_markdown(dx))
    else:
        console = make_console()
        if is_example(request):
            console.print(
                f"[dim]No deployment given: diagnosing the built-in example, {EXAMPLE_COMMAND} "
                "(servelab diagnose --help for your own).[/]",
                highlight=False,
            )
        render_terminal(dx, console, details)
