"""`servelab compare`: the same deployment and workload simulated on vLLM, SGLang and TensorRT-LLM."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from servelab.cli import app
from servelab.flags.checks import MAX_GPUS, shell_words
from servelab.flags.options import DEPLOYMENT_PANEL, LoadFlags, flag_block, load_options
from servelab.cli.report import report_beside
from servelab.errors import InputError
from servelab.report.console import make_console
from servelab.schemas.vocabulary import ENGINES, SGLANG, TRTLLM, VLLM

if TYPE_CHECKING:
    from servelab.compare.compare import CompareRequest
    from servelab.metrics.slo import SLO
    from servelab.schemas.compare import EngineComparison
    from servelab.workload.spec import LoadPlan


def parse_engines(text: str, flag: str = "--engines") -> list[str]:
    """A comma-separated list of modelled engines (compare's --engines, diagnose's --compare-engines)."""
    names = [e.strip().lower() for e in text.split(",") if e.strip()]
    bad = [e for e in names if e not in ENGINES]
    if bad or not names:
        raise InputError(f"{flag} {text!r}: give a comma-separated subset of {', '.join(ENGINES)}")
    if len(set(names)) != len(names):
        raise InputError(f"{flag} {text!r}: an engine is repeated")
    return names


def _show(result: EngineComparison, out: Console) -> None:
    from servelab.report.compare_results import POINT_COLUMNS, point_rows  # beside the report's plotly figures

    table = Table(
        title=f"{result.model} on {result.gpu}: {result.mean_prompt_tokens:,.0f} prompt + "
        f"{result.mean_output_tokens:,.0f} output tokens per request (simulated)"
    )
    for column in POINT_COLUMNS:
        table.add_column(column, justify="left" if column in ("engine", "point") else "right")
    for row in point_rows(result):
        table.add_row(*row)
    out.print(table)
    for line in result.explanations:
        out.print(f"- {line}", highlight=False, soft_wrap=True)
    for r in result.engines:
        for warning in r.warnings:
            out.print(f"[yellow]warning ({r.label}):[/] {warning}", highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class CompareFlags:
    """compare's own flags: one GPU and model, the engines to run them on (each with its own launch line), and
    where the comparison goes."""

    gpu: Annotated[str, typer.Option(help="GPU from the catalogue, e.g. h100-sxm.", rich_help_panel=DEPLOYMENT_PANEL)]
    model: Annotated[
        str,
        typer.Option(
            help="Built-in model or a Hugging Face model dir with config.json.", rich_help_panel=DEPLOYMENT_PANEL
        ),
    ]
    engines: Annotated[
        str,
        typer.Option(
            help=f"The engines to run this deployment and load on, comma-separated: {', '.join(ENGINES)} (each with "
            f"its own "
            "flags: --vllm-args, --sglang-args, --trtllm-args).",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = ",".join(ENGINES)
    vllm_args: Annotated[
        str,
        typer.Option(
            callback=shell_words, help="`vllm serve` flags for the vLLM run.", rich_help_panel=DEPLOYMENT_PANEL
        ),
    ] = ""
    sglang_args: Annotated[
        str,
        typer.Option(
            callback=shell_words,
            help="`python -m sglang.launch_server` flags for the SGLang run.",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = ""
    trtllm_args: Annotated[
        str,
        typer.Option(
            callback=shell_words,
            help="`trtllm-serve` flags for the TensorRT-LLM run.",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = ""
    tp: Annotated[
        Optional[int],
        typer.Option(
            "--tp", min=1, max=MAX_GPUS, help="Tensor-parallel size for every engine.", rich_help_panel=DEPLOYMENT_PANEL
        ),
    ] = None
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="Write the comparison as JSON (docs/schemas/compare.json); or give "
            "--result-dir to get DIR/compare.json.",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = None
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="Also write the HTML report (curves overlaid, opens offline) beside the JSON, named as it with .html.",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = False

    def request(self, points: Sequence[tuple[str, Callable[[], LoadPlan]]], slo: SLO | None) -> CompareRequest:
        from servelab.compare.compare import CompareRequest

        return CompareRequest(
            self.gpu,
            self.model,
            points,
            engines=parse_engines(self.engines),
            launch_flags={VLLM: self.vllm_args, SGLANG: self.sglang_args, TRTLLM: self.trtllm_args},
            tensor_parallel_size=self.tp,
            slo=slo,
        )


@app.command()
@load_options
@flag_block("flags", CompareFlags)  # innermost: its Deployment panel leads the help, as the flags that matter most
def compare(*, load: LoadFlags, flags: CompareFlags) -> None:
    """Would another engine serve this workload better? The same load simulated on each engine, and why they differ."""
    from servelab.compare import compare as verb  # the simulator and the sweeps: not for --help
    from servelab.report.inputs import COMPARE

    console = make_console(stderr=load.json)
    points = _points(load, flags)
    result = verb.run(flags.request(points, load.slo()))
    out = load.output_dir("compare") / COMPARE if load.result_dir is not None else flags.out
    if out is not None:
        verb.save(result, out)
    if load.json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        _show(result, console)
    if flags.report and out is not None:
        report_beside(out, console)


def _points(load: LoadFlags, flags: CompareFlags) -> list[tuple[str, Callable[[], LoadPlan]]]:
    """The load points every engine serves (the load as given, or each value of a listed --sweep), once the flags
    are known to agree on where the comparison goes."""
    from servelab.experiment.auto_sweep import AutoSweep

    load.check()
    out = flags.out
    if out is not None and load.result_dir is not None:
        raise InputError("--out and --result-dir both say where the comparison goes; give one of them")
    if flags.report and (out or load.result_dir) is None or out is not None and out.suffix == ".html":
        raise InputError(
            "--report draws the comparison's JSON into the same name with .html: give --out FILE.json "
            "or --result-dir DIR"
        )
    sweep = load.parsed_sweep()
    if isinstance(sweep, AutoSweep):
        raise InputError(
            "compare takes the load points you list (--sweep request-rate=4,16,inf); --sweep auto is bench's "
            "and simulate's"
        )
    if sweep is None:
        return [("as given", load.make_plan)]
    return [(sweep.label(v), partial(load.make_plan, sweep.arrival(load.arrival(), v))) for v in sweep.values]
