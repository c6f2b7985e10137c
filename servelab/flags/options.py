"""The flags several verbs share: the load flags, the deployment (or calibration profile) flags, the server flags.

`@load_options` adds every load flag (workload, arrival, amount, SLO, sweep,
output) to a typer command and hands the command one `LoadFlags`, so `bench`,
`simulate` and `tune` take exactly the same flags with the same names as
`vllm bench serve`, and validate them the same way: every impossible
combination is one error naming both flags, before any load.
The deployment flags (GpuFlag, ModelFlag, EngineArgsFlag, ...) and the live
server's (BaseUrlFlag, ServedModelFlag, ApiKeyFlag) are typer annotations declared
here once: a verb writes `gpu: GpuFlag = None`, so the flag's name, type and
help are the same in simulate, diagnose, tune, calibrate and validate.
`deployment_from_flags` is the one reading of --gpu/--model/--engine-args or
--calibration, for every verb that simulates.

The flags' names, choices and defaults come from light vocabulary modules;
what the flags are turned into (plans, deployments, sweeps) is imported where
it is built, so `servelab VERB --help` imports neither numpy nor the layers.
"""

from __future__ import annotations

import functools
import inspect
import re
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from servelab.flags.checks import MAX_GPUS, MAX_INT, real, shell_words
from servelab.metrics.slo import SLO
from servelab.schemas.vocabulary import DEFAULT_PERCENTILES
from servelab.perf.errors import PerfConfigError
from servelab.schemas.vocabulary import ENGINES, POLICIES, VLLM
from servelab.workload.errors import WorkloadError
from servelab.schemas.vocabulary import (
    DATASETS,
    DISTRIBUTIONS,
    DURATION_REQUEST_CAP,
    FILE_DATASETS,
    PLAN_TOKEN_LIMIT,
    RAMPS,
)

if TYPE_CHECKING:
    from servelab.experiment.auto_sweep import AutoSweep
    from servelab.experiment.sweep import Sweep
    from servelab.targets.deployment import Deployment
    from servelab.workload.arrival import ArrivalConfig, Ramp
    from servelab.workload.datasets import WorkloadConfig
    from servelab.workload.plan import Amount
    from servelab.workload.spec import LoadPlan

_WORKLOAD, _ARRIVAL, _AMOUNT, _SLO = "Workload", "Arrival", "Amount", "SLO"
OUTPUT_PANEL = "Sweep and output"
DEPLOYMENT_PANEL, SERVER_PANEL = "Deployment", "Target"

_GPU = typer.Option(help="GPU from the catalogue (a100-80gb, h100-sxm, ...), or cpu.", rich_help_panel=DEPLOYMENT_PANEL)
_MODEL = typer.Option(
    help="Built-in model (qwen2.5-7b, llama-3.1-8b, ...) or a Hugging Face model dir with config.json.",
    rich_help_panel=DEPLOYMENT_PANEL,
)
GpuFlag = Annotated[Optional[str], _GPU]
RequiredGpuFlag = Annotated[str, _GPU]
"""--gpu where a verb cannot do without it (calibrate: the catalogue entry the fit starts from)."""
ModelFlag = Annotated[Optional[str], _MODEL]
RequiredModelFlag = Annotated[str, _MODEL]
EngineArgsFlag = Annotated[
    str,
    typer.Option(
        callback=shell_words,
        help="The server's `vllm serve` flags, as you would paste them: \"--max-num-seqs 128 "
        '--no-enable-prefix-caching".',
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
TpFlag = Annotated[
    Optional[int],
    typer.Option(
        "--tp",
        min=1,
        max=MAX_GPUS,
        help="Tensor-parallel size (same as --tensor-parallel-size in --engine-args).",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
ReplicasFlag = Annotated[
    Optional[int],
    typer.Option(
        min=1, max=MAX_GPUS, help="Data-parallel replicas behind one router.", rich_help_panel=DEPLOYMENT_PANEL
    ),
]
RouterFlag = Annotated[
    Optional[str],
    typer.Option(
        help=f"How replicas are picked: {', '.join(POLICIES)}. Default: least-loaded (vLLM's own balancer) when "
        "--engine-args sets --data-parallel-size, round-robin for --replicas.",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
RouterWeightsFlag = Annotated[
    Optional[str],
    typer.Option(
        help="The weights of llm-d's scorers for --router prefix-aware or prefix-estimate, as an EndpointPickerConfig "
        "sets them: prefix=2,queue=0,kv=1,active=1 (a scorer left out weighs 0; prefix=0 is llm-d's scheduler "
        "without a prefix scorer); add active_until=headers for a release whose active-request scorer forgets a "
        "request at its response's headers. Default: each router's own (docs/fleets.md).",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
GpuFileFlag = Annotated[
    Optional[Path],
    typer.Option(help="YAML with your own GPUs, added to the catalogue.", rich_help_panel=DEPLOYMENT_PANEL),
]
_CALIBRATION = typer.Option(
    help="A profile from `servelab calibrate` instead of --gpu/--model: its fitted hardware, model and "
    "coefficients (--engine-args change its server's flags; --model puts another model on the "
    "same hardware and host).",
    rich_help_panel=DEPLOYMENT_PANEL,
)
CalibrationFlag = Annotated[Optional[Path], _CALIBRATION]
RequiredCalibrationFlag = Annotated[Path, _CALIBRATION]
EngineFlag = Annotated[
    str,
    typer.Option(
        help=f"Which engine's scheduler, flags and memory plan: {', '.join(ENGINES)}. --engine-args are then in that "
        f"engine's "
        "spelling (`python -m sglang.launch_server ...`, `trtllm-serve ...`).",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]
VllmVersionFlag = Annotated[
    Optional[str],
    typer.Option(
        help="The vLLM release served (e.g. 0.11.0): its defaults, its measured CPU costs. Default: 0.32.",
        rich_help_panel=DEPLOYMENT_PANEL,
    ),
]

_BASE_URL = typer.Option(help="Server root, e.g. http://127.0.0.1:8000.", rich_help_panel=SERVER_PANEL)
BaseUrlFlag = Annotated[str, _BASE_URL]
OptionalBaseUrlFlag = Annotated[Optional[str], _BASE_URL]
ServedModelFlag = Annotated[
    Optional[str],
    typer.Option(help="Model name on the server (default: the first of /v1/models).", rich_help_panel=SERVER_PANEL),
]
ApiKeyFlag = Annotated[
    Optional[str],
    typer.Option(
        envvar="OPENAI_API_KEY",
        show_envvar=True,
        help="Bearer token; never written anywhere.",
        rich_help_panel=SERVER_PANEL,
    ),
]
GoodputFlag = Annotated[
    Optional[list[str]],
    typer.Option(
        help="SLO in ms, as vLLM spells it: --goodput ttft:500 tpot:50 e2el:10000 (or quoted, or the flag repeated).",
        rich_help_panel=_SLO,
    ),
]


@dataclass(frozen=True)
class LoadFlags:
    """The shared flags as given (None = not given), so clashes can name what the user typed.

    Each field is declared once, with its typer option: `load_options` (`flag_block`) gives exactly these to bench,
    simulate, tune, compare and calibrate, so a flag's name, type, default and help live in one line."""

    dataset_name: Annotated[str, typer.Option(help=f"One of {', '.join(DATASETS)}.", rich_help_panel=_WORKLOAD)] = (
        "random"
    )
    dataset_path: Annotated[
        Optional[Path],
        typer.Option(help="ShareGPT JSON or JSONL file (for sharegpt / jsonl).", rich_help_panel=_WORKLOAD),
    ] = None
    tokenizer: Annotated[
        Optional[Path],
        typer.Option(
            "--tokenizer",
            help="Local tokenizer dir (tokenizer.json): real text, exact lengths.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    random_input_len: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            max=MAX_INT,
            help="Prompt tokens (random/prefix: the random part; multiturn: each user turn). Default 1024.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    random_output_len: Annotated[
        Optional[int],
        typer.Option(min=1, max=MAX_INT, help="Output tokens per request. Default 128.", rich_help_panel=_WORKLOAD),
    ] = None
    random_range_ratio: Annotated[
        Optional[float],
        typer.Option(
            callback=real(ge=0),
            help="Length spread: uniform in \\[len*(1-r), len*(1+r)]; std/mean for normal/lognormal. Default 0.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    length_distribution: Annotated[
        str, typer.Option(help=f"Length distribution: {', '.join(DISTRIBUTIONS)}.", rich_help_panel=_WORKLOAD)
    ] = "uniform"
    prefix_len: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            max=MAX_INT,
            help="prefix: tokens of the shared prefix (RAG context, system prompt); multiturn: of each chat's system "
            "prompt.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    num_prefixes: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            max=MAX_INT,
            help="prefix/multiturn: how many distinct prefixes (system prompts). Default 1.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    multiturn_turns: Annotated[
        Optional[int],
        typer.Option(
            min=1, max=MAX_INT, help="multiturn: turns per conversation. Default 3.", rich_help_panel=_WORKLOAD
        ),
    ] = None
    multiturn_think_time: Annotated[
        Optional[float],
        typer.Option(
            callback=real(ge=0),
            help="multiturn: seconds between a reply and the next turn. Default 0.",
            rich_help_panel=_WORKLOAD,
        ),
    ] = None
    seed: Annotated[
        int, typer.Option(min=0, help="Seed for prompts, lengths and arrivals.", rich_help_panel=_WORKLOAD)
    ] = 0
    max_concurrency: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            max=MAX_INT,
            help="Closed loop: at most N requests in flight (also caps an open loop).",
            rich_help_panel=_ARRIVAL,
        ),
    ] = None
    ramp_up_strategy: Annotated[
        Optional[str],
        typer.Option(
            help=f"Open loop whose rate rises over the run ({', '.join(RAMPS)}), from --ramp-up-start-rps to "
            f"--ramp-up-end-rps "
            "(vLLM's flags): by request index, or over --duration.",
            rich_help_panel=_ARRIVAL,
        ),
    ] = None
    ramp_up_start_rps: Annotated[
        Optional[float],
        typer.Option(callback=real(gt=0), help="A ramp's first rate (req/s).", rich_help_panel=_ARRIVAL),
    ] = None
    ramp_up_end_rps: Annotated[
        Optional[float], typer.Option(callback=real(gt=0), help="A ramp's last rate (req/s).", rich_help_panel=_ARRIVAL)
    ] = None
    request_rate: Annotated[
        Optional[float],
        typer.Option(
            callback=real(gt=0, inf=True),
            help="Open loop: requests per second (inf = all at once, the default).",
            rich_help_panel=_ARRIVAL,
        ),
    ] = None
    burstiness: Annotated[
        Optional[float],
        typer.Option(
            callback=real(gt=0),
            help="Gamma shape of the gaps (1 = Poisson, <1 burstier). Needs --request-rate.",
            rich_help_panel=_ARRIVAL,
        ),
    ] = None
    num_prompts: Annotated[
        Optional[int],
        typer.Option(min=1, max=DURATION_REQUEST_CAP, help="Requests to send. Default 1000.", rich_help_panel=_AMOUNT),
    ] = None
    duration: Annotated[
        Optional[float],
        typer.Option(
            callback=real(gt=0), help="Send requests for this many seconds instead of a count.", rich_help_panel=_AMOUNT
        ),
    ] = None
    warmup: Annotated[
        float,
        typer.Option(
            callback=real(ge=0), help="Seconds at the start excluded from statistics.", rich_help_panel=_AMOUNT
        ),
    ] = 0.0
    max_plan_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Refuse a run whose requests x (prompt + output) tokens exceed this (memory holds them all).",
            rich_help_panel=_AMOUNT,
        ),
    ] = PLAN_TOKEN_LIMIT
    goodput: GoodputFlag = None
    metric_percentiles: Annotated[
        str, typer.Option(help="Percentiles reported for TTFT/TPOT/ITL/E2EL, comma-separated.", rich_help_panel=_SLO)
    ] = ",".join(f"{p:g}" for p in DEFAULT_PERCENTILES)
    sweep: Annotated[
        Optional[str],
        typer.Option(
            "--sweep",
            help="request-rate=1,2,4,8 or max-concurrency=1,8,32: one run per value, sweep.json holds the curve. "
            "auto (or auto=N): one request at a time, then all at once, then N rates "
            "between (default 4); a rate point stops early once the server is "
            "over-saturated; sweep.json names the knee and the highest rate meeting --goodput.",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None
    result_dir: Annotated[
        Optional[Path],
        typer.Option(
            help="Where run.json, records.jsonl, timeline.jsonl, summary.json go. Default results/<verb>-<time>.",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace what --result-dir holds from an earlier run (it is "
            "emptied first); without it such a directory is refused.",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False
    json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print summary.json (sweep.json for a sweep) to stdout.", rich_help_panel=OUTPUT_PANEL
        ),
    ] = False

    def check(self, *, resume: bool = False) -> None:
        """Flag clashes the layers below cannot see (they only get resolved values), and a --result-dir that would be
        overwritten (`resume`: tune continues the study the directory holds, so it may)."""
        from servelab.experiment.auto_sweep import AutoSweep
        from servelab.experiment.sweep import Sweep, SweepError
        from servelab.results_dir import result_dir_refusal

        if self.result_dir is not None and not resume:
            result_dir_refusal(self.result_dir, self.overwrite)
        name = self.dataset_name
        only = {
            "--prefix-len": (self.prefix_len, ("prefix", "multiturn")),
            "--num-prefixes": (self.num_prefixes, ("prefix", "multiturn")),
            "--multiturn-turns": (self.multiturn_turns, ("multiturn",)),
            "--multiturn-think-time": (self.multiturn_think_time, ("multiturn",)),
        }
        for flag, (value, datasets) in only.items():
            if value is not None and name not in datasets:
                raise WorkloadError(
                    f"{flag} is only used by --dataset-name {' or '.join(datasets)}, not --dataset-name {name}"
                )
        if name in FILE_DATASETS:
            for flag, value in (
                ("--random-input-len", self.random_input_len),
                ("--random-output-len", self.random_output_len),
                ("--random-range-ratio", self.random_range_ratio),
            ):
                if value is not None:
                    raise WorkloadError(f"{flag} does not apply to --dataset-name {name}: lengths come from the file")
        sweep = self.parsed_sweep()
        if isinstance(sweep, Sweep):
            given = {"request-rate": self.request_rate, "max-concurrency": self.max_concurrency}[sweep.key]
            if given is not None:
                raise SweepError(
                    f"--sweep {sweep.key}=... and --{sweep.key} both set the {sweep.key}; give one of them"
                )
        if isinstance(sweep, AutoSweep) and self.request_rate is not None:
            raise SweepError("--sweep auto chooses the request rates itself: drop --request-rate")
        ramp_flags = (self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)
        if any(v is not None for v in ramp_flags) and not all(v is not None for v in ramp_flags):
            raise WorkloadError(
                "a ramp needs all three of --ramp-up-strategy, --ramp-up-start-rps and --ramp-up-end-rps"
            )
        if self.ramp_up_strategy is not None and sweep is not None:
            raise SweepError("--ramp-up-strategy and --sweep both vary the load over runs; give one of them")
        sweeps_rate = (
            self.ramp_up_strategy is not None
            or sweep is not None
            and (isinstance(sweep, AutoSweep) or sweep.key == "request-rate")
        )
        if self.burstiness is not None and self.request_rate is None and not sweeps_rate:
            raise WorkloadError(
                "--burstiness shapes an open loop's gaps: it needs --request-rate (or --sweep request-rate=...)"
            )
        # Each parses its own flag; called here so a bad value is refused before any load is sent.
        self.slo()
        self.percentiles()
        self.arrival()
        self.parsed_sweep()

    def workload(self) -> WorkloadConfig:
        from servelab.workload.datasets import WorkloadConfig

        defaults = WorkloadConfig()
        pick = lambda value, default: default if value is None else value  # noqa: E731
        return WorkloadConfig(
            dataset_name=self.dataset_name,
            dataset_path=self.dataset_path,
            input_len=pick(self.random_input_len, defaults.input_len),
            output_len=pick(self.random_output_len, defaults.output_len),
            range_ratio=pick(self.random_range_ratio, defaults.range_ratio),
            length_distribution=self.length_distribution,
            prefix_len=pick(self.prefix_len, defaults.prefix_len),
            num_prefixes=pick(self.num_prefixes, defaults.num_prefixes),
            turns=pick(self.multiturn_turns, defaults.turns),
            think_time=pick(self.multiturn_think_time, defaults.think_time),
            seed=self.seed,
            tokenizer=self.tokenizer,
        )

    def arrival(self) -> ArrivalConfig:
        from servelab.workload.arrival import ArrivalConfig

        return ArrivalConfig(
            request_rate=float("inf") if self.request_rate is None else self.request_rate,
            burstiness=1.0 if self.burstiness is None else self.burstiness,
            max_concurrency=self.max_concurrency,
            ramp=self.ramp(),
        )

    def ramp(self) -> Ramp | None:
        from servelab.workload.arrival import Ramp

        if self.ramp_up_strategy is None or self.ramp_up_start_rps is None or self.ramp_up_end_rps is None:
            return None
        return Ramp(self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)

    def amount(self) -> Amount:
        from servelab.workload.plan import Amount

        return Amount(
            num_prompts=self.num_prompts,
            duration=self.duration,
            warmup=self.warmup,
            max_plan_tokens=self.max_plan_tokens,
        )

    def slo(self) -> SLO | None:
        return SLO.parse([item for arg in self.goodput or [] for item in arg.split()])

    def percentiles(self) -> tuple[float, ...]:
        try:
            values = tuple(float(p) for p in self.metric_percentiles.split(",") if p.strip())
        except ValueError:
            values = ()
        if not values or not all(0 < p < 100 for p in values):
            raise WorkloadError(
                f"--metric-percentiles {self.metric_percentiles!r}: give numbers in (0, 100), e.g. 50,90,99"
            )
        return values

    def parsed_sweep(self) -> Sweep | AutoSweep | None:
        from servelab.experiment.auto_sweep import parse_sweep

        return parse_sweep(self.sweep) if self.sweep is not None else None

    def make_plan(self, arrival: ArrivalConfig | None = None) -> LoadPlan:
        from servelab.workload.plan import build_plan

        return build_plan(self.workload(), arrival or self.arrival(), self.amount())

    def output_dir(self, verb: str, *, resume: bool = False) -> Path:
        """Where the run goes; with --overwrite, emptied of the earlier result now that every flag has been checked
        (`check` refused it without --overwrite). Call it last, just before the run."""
        if self.result_dir is None:
            return Path("results") / f"{verb}-{time.strftime('%Y%m%d-%H%M%S')}"
        if self.overwrite and not resume:
            from servelab.results_dir import clear_result_dir

            clear_result_dir(self.result_dir)
        return self.result_dir


def flag_block(name: str, block: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command every field of the frozen dataclass `block` as a flag; the command receives them as one
    `name: block` argument. Each flag is declared once, as a field with its typer option (LoadFlags, bench's
    ServerFlags, simulate's DeploymentFlags), and blocks stack: `@flag_block("server", ServerFlags) @load_options`.
    A field without a default is a required flag.

    Typer reads a command's parameters from its signature, so the wrapper advertises the command's own parameters
    plus the block's.
    """
    hints = typing.get_type_hints(block, include_extras=True)
    options = {
        f.name: (hints[f.name], inspect.Parameter.empty if f.default is MISSING else f.default) for f in fields(block)
    }

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command_hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=command_hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.name != name
        ]
        added = [
            inspect.Parameter(flag, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for flag, (annotation, default) in options.items()
        ]

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = block(**{flag: kwargs.pop(flag) for flag in options})
            return command(*args, **kwargs)

        params = own + added
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must see the advertised signature, not the command's
        return wrapper

    return decorate


load_options = flag_block("load", LoadFlags)
"""Every shared load flag (bench, simulate, tune, compare, calibrate), given to the command as `load: LoadFlags`."""


def deployment_from_flags(
    gpu: str | None,
    model: str | None,
    engine_args: str = "",
    *,
    calibration: Path | None = None,
    tp: int | None = None,
    replicas: int | None = None,
    router: str | None = None,
    gpu_file: Path | None = None,
    vllm_version: str | None = None,
    engine: str = VLLM,
    router_weights: str | None = None,
) -> Deployment:
    """The deployment the flags describe: --gpu and --model from the catalogues, or a `servelab calibrate` profile.

    A profile already names the hardware (its fitted rates), so --gpu,
    --gpu-file or --vllm-version beside --calibration is an error naming both
    flags rather than a silent choice of one; --model puts another model on
    the calibrated hardware; --engine-args then override the
    calibrated server's flags one by one. Another --engine than vLLM reads
    --engine-args with that engine's parser; profiles and --vllm-version are
    vLLM's, so either beside it is an error. PerfConfigError for anything that
    cannot be modelled.
    """
    if router is not None and router not in POLICIES:
        raise PerfConfigError(f"--router {router!r}: choose one of {', '.join(POLICIES)}")
    from servelab.sim.router import weights_for

    weights = weights_for(router_weights, router)
    deployment = _deployment(gpu, model, engine_args, calibration, tp, replicas, router, gpu_file, vllm_version, engine)
    return replace(deployment, router_weights=weights) if weights is not None else deployment


def _deployment(
    gpu: str | None,
    model: str | None,
    engine_args: str,
    calibration: Path | None,
    tp: int | None,
    replicas: int | None,
    router: str | None,
    gpu_file: Path | None,
    vllm_version: str | None,
    engine: str,
) -> Deployment:
    from servelab.targets.deployment import build_deployment

    if engine != VLLM:
        return _engine_deployment(
            engine, gpu, model, engine_args, tp, replicas, gpu_file, router, calibration, vllm_version
        )
    if calibration is not None:
        for flag, value in (("--gpu", gpu), ("--gpu-file", gpu_file), ("--vllm-version", vllm_version)):
            if value is not None:
                raise PerfConfigError(
                    f"{flag} and --calibration both name the hardware: the profile already does; drop {flag}"
                )
        return _profile_deployment(calibration, model, engine_args, tp, replicas, router)
    if gpu is None or model is None:
        raise PerfConfigError("give --gpu and --model (or --calibration with a profile from `servelab calibrate`)")
    return build_deployment(
        gpu,
        model,
        engine_args,
        tensor_parallel_size=tp,
        replicas=replicas,
        gpu_file=gpu_file,
        router=router,
        vllm_version=vllm_version,
    )


def _engine_deployment(
    engine: str,
    gpu: str | None,
    model: str | None,
    engine_args: str,
    tp: int | None,
    replicas: int | None,
    gpu_file: Path | None,
    router: str | None,
    calibration: Path | None,
    vllm_version: str | None,
) -> Deployment:
    """SGLang or TensorRT-LLM on a catalogue GPU and model, --engine-args read with that engine's own parser;
    --calibration and --vllm-version describe a vLLM server, so either is refused by name."""
    from servelab.targets.engine_deployment import build_engine_deployment

    if engine not in ENGINES:
        raise PerfConfigError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if vllm_version is not None:
        raise PerfConfigError(f"--vllm-version describes a vLLM server, not --engine {engine}")
    if calibration is not None or gpu is None or model is None:
        raise PerfConfigError(f"--engine {engine} needs --gpu and --model (calibration profiles are vLLM's)")
    return build_engine_deployment(
        engine, gpu, model, engine_args, tensor_parallel_size=tp, replicas=replicas, gpu_file=gpu_file, router=router
    )


def _profile_deployment(
    calibration: Path,
    model: str | None,
    engine_args: str,
    tp: int | None,
    replicas: int | None,
    router: str | None,
) -> Deployment:
    """The calibrated server's deployment: --model puts another model on its hardware and host, --engine-args,
    --tp and --replicas change its flags; the profile's warnings are kept."""
    from servelab.targets.profile import deployment_from_profile  # its HTTP client and fits: not for --help
    from servelab.perf.calibration import load_profile
    from servelab.perf.models import get_model

    deployment = deployment_from_profile(load_profile(calibration), engine_args, get_model(model) if model else None)
    changes: dict[str, int] = {
        k: v for k, v in (("tensor_parallel_size", tp), ("data_parallel_size", replicas)) if v is not None
    }
    if changes:
        rebuilt = deployment.rebuilt(hardware=None, model=None, **changes)
        deployment = replace(rebuilt, warnings=deployment.warnings)
    return replace(deployment, router=router) if router is not None else deployment


_GOODPUT_VALUE = re.compile(r"^(ttft|tpot|e2el):\S+$")


def spread_goodput_values(argv: Sequence[str]) -> list[str]:
    """`--goodput ttft:500 tpot:50` as `vllm bench serve` takes it, rewritten as repeated flags click can parse.

    Click options take one value each; vLLM's argparse flag takes several. Only
    words that look like a goodput term count as its values, so a positional
    argument after the flag is never swallowed.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word != "--goodput":
            out.append(word)
            continue
        values = []
        while i < len(argv) and _GOODPUT_VALUE.match(argv[i]):
            values.append(argv[i])
            i += 1
        out += [part for value in values for part in ("--goodput", value)] if values else [word]
    return out
