"""The `diagnose` verb: one request in, one Diagnosis out, for the CLI and the Python API alike.

Everything between the words a user gives (a results directory or a described
deployment, what they saw, what they tried, the question they ask) and the
typed document lives here, so `servelab diagnose` and `servelab.diagnosis()`
cannot drift apart: each face only builds a `DiagnoseRequest` and renders the
result. Building the deployment is the one step a face may supply (the CLI
also reads calibration profiles); the default builds from the catalogues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from servelab.diagnose import analysis
from servelab.diagnose.analysis import Observed
from servelab.targets.engine_terms import check_engine, served_engine
from servelab.diagnose.regions import Region
from servelab.diagnose.scenario import synthetic
from servelab.schemas.diagnosis import Diagnosis
from servelab.schemas.results import RunFlags
from servelab.diagnose.sensitivity import ASSUMED_OUTPUT, Assumed
from servelab.diagnose.server_config import engine_args_from_server
from servelab.metrics.scrape import CACHE_CONFIG
from servelab.diagnose.text_tokens import Script, tokens_from_characters
from servelab.diagnose.tried import parse_tried
from servelab.schemas.vocabulary import Goal
from servelab.errors import InputError
from servelab.metrics.engines import AUTO
from servelab.metrics.host import condition_changes
from servelab.metrics.results import RunResult, load_run
from servelab.metrics.slo import SLO
from servelab.perf.calibration import load_profile
from servelab.sim.engines import LABELS, VLLM
from servelab.sim.router import weights_for
from servelab.targets.deployment import Deployment, build_deployment
from servelab.targets.engine_deployment import build_engine_deployment
from servelab.workload.lengths import DISTRIBUTIONS, LengthDistribution


@dataclass(frozen=True)
class DeploymentWords:
    """The deployment as the user names it: catalogue names and a launch line, or a calibration profile."""

    gpu: str | None = None
    model: str | None = None
    engine_args: str = ""
    tp: int | None = None
    replicas: int | None = None
    gpu_file: Path | None = None
    calibration: Path | None = None
    vllm_version: str | None = None
    engine: str = VLLM
    """The engine served (resolved from `auto` before the deployment is built)."""
    router: str | None = None
    """How the replicas are picked (a simulated fleet's --router); None: the server's own (own_router)."""
    router_weights: str | None = None
    """llm-d's scorer weights for that router (a simulated fleet's --router-weights); None: the router's own."""


DeploymentBuilder = Callable[[DeploymentWords], Deployment]


def from_catalogue(w: DeploymentWords) -> Deployment:
    """The deployment from the GPU and model catalogues (calibration profiles need the CLI's builder)."""
    if w.calibration is not None:
        raise InputError(
            "a calibration profile is read by `servelab diagnose --calibration`; from Python, give gpu and model"
        )
    if w.gpu is None or w.model is None:
        raise InputError("give the GPU and the model the deployment runs")
    weights = weights_for(w.router_weights, w.router)
    deployment = _catalogue_deployment(w, w.gpu, w.model)
    return replace(deployment, router_weights=weights) if weights is not None else deployment


def _catalogue_deployment(w: DeploymentWords, gpu: str, model: str) -> Deployment:
    if w.engine == VLLM:
        return build_deployment(
            gpu,
            model,
            w.engine_args,
            tensor_parallel_size=w.tp,
            replicas=w.replicas,
            router=w.router,
            gpu_file=w.gpu_file,
            vllm_version=w.vllm_version,
        )
    return build_engine_deployment(
        w.engine,
        gpu,
        model,
        w.engine_args,
        tensor_parallel_size=w.tp,
        replicas=w.replicas,
        router=w.router,
        gpu_file=w.gpu_file,
    )


@dataclass(frozen=True)
class Described:
    """A deployment's workload as the user describes it, when there is no results directory."""

    input_len: int | None = None
    input_chars: int | None = None
    """Prompt length in characters (what a log of the text gives); turned into tokens by `script`, the ratio said."""
    script: Script | None = None
    output_len: int | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None
    output_len_distribution: str = "fixed"
    prefix_len: int = 0
    turns: int = 1

    @property
    def given(self) -> bool:
        return any(
            v is not None
            for v in (self.input_len, self.input_chars, self.output_len, self.request_rate, self.max_concurrency)
        )

    @property
    def shaped(self) -> bool:
        return self.output_len_distribution != "fixed" or bool(self.prefix_len) or self.turns != 1


@dataclass(frozen=True)
class DiagnoseRequest:
    """Everything `diagnose` takes; `results` or `described` says what the workload is."""

    deployment: DeploymentWords = field(default_factory=DeploymentWords)
    results: Path | None = None
    described: Described = field(default_factory=Described)
    observed: Observed = field(default_factory=Observed)
    tried: tuple[str, ...] = ()
    """CHANGE:RESULT, as `--tried` takes them."""
    region: Region | None = None
    """Where the user buys hardware: which GPUs the alternatives may name (None: assumed unrestricted, and said)."""
    goodput: list[str] | None = None
    slo_attainment: float = 0.9
    warmup: float = 0.0
    price_options: bool = False
    gpu_cost_per_hour: float | None = None
    check_advice: bool = False
    compare_engines: list[str] = field(default_factory=list)
    """Other engines to run this workload on (empty: none)."""


# The first case servelab exists for: Qwen2.5-7B on one A100, ~1,500-token prompts, max_num_seqs 256,
# ~10 req/s, "GPU utilisation 30%, memory full": why won't QPS go up?
EXAMPLE = DiagnoseRequest(
    DeploymentWords("a100-80gb", "qwen2.5-7b", "--max-num-seqs 256"),
    described=Described(input_len=1500, request_rate=10.0),
    observed=Observed(qps=10.0, gpu_util=0.3),
)
EXAMPLE_COMMAND = (
    'servelab diagnose --gpu a100-80gb --model qwen2.5-7b --engine-args "--max-num-seqs 256" '
    "--input-len 1500 --request-rate 10 --observed-qps 10 --observed-gpu-util 0.3"
)
"""The command line the example stands for (its answer length, like the user's story, not given: assumed)."""


FIGURES = ("qps", "ttft_ms", "gpu_util", "e2e_ms", "tpot_ms")
"""The figures seen in production a request may carry, as the --observed-* flags name them."""


def observed_from(figures: Mapping[str, float] | None, goal: str | None = None) -> Observed:
    """What the user saw, from a mapping of FIGURES (the Python API's words); InputError naming a figure or goal
    servelab does not know."""
    seen = dict(figures or {})
    unknown = set(seen) - set(FIGURES)
    if unknown:
        raise InputError(f"observed: unknown figures {sorted(unknown)}; give {', '.join(FIGURES)}")
    if goal is not None and goal not in tuple(Goal):
        raise InputError(f"goal {goal!r}: choose {' or '.join(Goal)}")
    get = seen.get
    return Observed(
        get("qps"),
        get("ttft_ms"),
        get("gpu_util"),
        get("e2e_ms"),
        get("tpot_ms"),
        goal=Goal(goal) if goal is not None else None,
    )


def region_named(region: str | None) -> Region | None:
    """`--region` from its word; InputError naming the choices."""
    if region is not None and region not in tuple(Region):
        raise InputError(f"region {region!r}: choose {' or '.join(Region)}")
    return Region(region) if region is not None else None


def is_example(r: DiagnoseRequest) -> bool:
    """Nothing describes a deployment: the built-in example stands in (a vLLM one)."""
    w = r.deployment
    return (
        r.results is None
        and not r.described.given
        and w.gpu is None
        and w.model is None
        and w.calibration is None
        and w.engine in (AUTO, VLLM)
    )


def check(r: DiagnoseRequest) -> None:
    """Contradictory or incomplete words: one InputError naming them, before anything is read or simulated."""
    check_engine(r.deployment.engine)
    for text in r.tried:
        parse_tried(text)
    if r.deployment.vllm_version is not None and r.deployment.engine not in (VLLM, AUTO):
        raise InputError(f"--vllm-version describes a vLLM server, not --engine {r.deployment.engine}")
    if r.results is not None and r.described.given:
        raise InputError(
            "RESULTS and --input-len/--output-len/--request-rate/--max-concurrency both describe the workload; "
            "give a results directory or a described deployment, not both"
        )
    if r.results is not None and r.described.shaped:
        raise InputError(
            "--output-len-distribution, --prefix-len and --turns describe a workload; a results directory "
            "already holds the measured one"
        )
    if r.described.input_len is not None and r.described.input_chars is not None:
        raise InputError("--input-len and --input-chars both give the prompt length; give one")
    if r.described.script is not None and r.described.input_chars is None:
        raise InputError("--script says how characters become tokens: give the prompt length with --input-chars")


def diagnose(
    request: DiagnoseRequest, build: DeploymentBuilder = from_catalogue, warn: Callable[[str], None] = lambda _: None
) -> Diagnosis:
    """The diagnosis `request` asks for; `warn` hears what a reader must see before the answer (the engine
    recorded elsewhere than asked, a run cut short)."""
    check(request)
    if is_example(request):
        request = replace(
            request,
            deployment=replace(EXAMPLE.deployment, engine=VLLM),
            described=EXAMPLE.described,
            observed=replace(EXAMPLE.observed, goal=request.observed.goal),
        )  # the asked options stay
    observed = replace(request.observed, tried=tuple(parse_tried(t) for t in request.tried))
    slo = SLO.parse(request.goodput)
    run = load_run(request.results) if request.results is not None else None
    served, engine_note = served_engine(request.deployment.engine, run.run_info if run is not None else None)
    if request.check_advice and served != VLLM:
        raise InputError(f"--check-advice judges vLLM's common tuning tips; the deployment is {LABELS[served]}'s")
    words, server_note = _words(request.deployment, served, run)
    deployment = build(words)
    if engine_note is not None:
        warn(engine_note)
    asked = analysis.Asked(
        slo=slo,
        observed=observed,
        slo_share=request.slo_attainment,
        with_advice=request.check_advice,
        with_alternatives=request.price_options or None,
        gpu_cost_per_hour=request.gpu_cost_per_hour,
        engines=request.compare_engines,
        region=request.region,
    )
    partial = ""
    if run is not None:
        partial = run.partial_note()
        dx = analysis.diagnose_run(run, deployment, warmup=request.warmup, **asked)
        if words.calibration is not None:  # a run measured under other conditions than the profile's is not comparable
            dx.notes.extend(
                condition_changes(
                    load_profile(words.calibration).host,
                    run.run_info.client_host or {},
                    now_label="during this run",
                    then_label="at calibration",
                )
            )
        dx.notes[:0] = [n for n in (engine_note, server_note) if n is not None]
    else:
        dx = _described(request.described, deployment, observed, asked)
    if partial:  # said first and kept in the JSON: every number below rests on a run cut short
        dx.partial_run = partial
        warn(partial)
    return dx


def _words(w: DeploymentWords, served: str, run: RunResult | None) -> tuple[DeploymentWords, str | None]:
    """The deployment's words completed from the run: a simulated run's own flags, a vLLM server's KV figures."""
    w = replace(w, engine=served)
    if run is None:
        return w, None
    if w.gpu is None and w.model is None and w.calibration is None:
        w = _simulated_deployment(run, w)
    if w.calibration is not None or served != VLLM:
        return w, None
    cache_config = (run.run_info.model_extra or {}).get(CACHE_CONFIG)  # bench's own key, which RunInfo leaves open
    engine_args, note = engine_args_from_server(w.engine_args, cache_config or {})
    return replace(w, engine_args=engine_args), note


def _simulated_deployment(run: RunResult, w: DeploymentWords) -> DeploymentWords:
    """The deployment a simulated run's run.json records (its simulate flags); words given here still win.
    A measured run records no hardware: unchanged."""
    if run.run_info.source != "sim":
        return w
    flags = run.run_info.flags or RunFlags()
    return replace(
        w,
        gpu=flags.gpu,
        model=flags.model,
        calibration=Path(flags.calibration) if flags.calibration else None,
        engine_args=w.engine_args or flags.engine_args or "",
        tp=w.tp if w.tp is not None else flags.tp,
        replicas=w.replicas if w.replicas is not None else flags.replicas,
        router=flags.router or w.router,
        router_weights=w.router_weights or flags.router_weights,
        gpu_file=w.gpu_file or (Path(flags.gpu_file) if flags.gpu_file else None),
        vllm_version=w.vllm_version or flags.vllm_version,
    )


def _described(s: Described, deployment: Deployment, observed: Observed, asked: analysis.Asked) -> Diagnosis:
    """A described deployment: what was not given is assumed, and the assumption is said."""
    assumed: tuple[Assumed, ...] = ()
    input_len = s.input_len
    if s.input_chars is not None:
        input_len = tokens_from_characters(s.input_chars, s.script)
        assumed += (Assumed.TOKENS,)
    if input_len is None:
        raise InputError("a described deployment needs --input-len (or --input-chars)")
    output_len = s.output_len
    if output_len is None:
        output_len, assumed = ASSUMED_OUTPUT, assumed + (Assumed.OUTPUT,)
    rate = s.request_rate if s.request_rate is not None else (observed.qps if s.max_concurrency is None else None)
    if rate is None and s.max_concurrency is None:
        raise InputError("a described deployment needs --request-rate, --max-concurrency or --observed-qps")
    lengths = output_lengths(s.output_len_distribution, output_len)
    scenario = synthetic(
        input_len,
        output_len,
        request_rate=rate,
        max_concurrency=s.max_concurrency,
        prefix_len=s.prefix_len,
        turns=s.turns,
        output_lengths=lengths,
    )
    if rate is not None:
        assumed += (Assumed.ARRIVALS,)
    return analysis.diagnose_described(
        deployment, scenario, **asked | analysis.Asked(assumed=assumed, characters=(s.input_chars, s.script))
    )


def output_lengths(spec: str, mean: int) -> LengthDistribution:
    """`--output-len-distribution SHAPE[:SPREAD]` around --output-len; one error naming the flag when malformed."""
    shape, _, spread = spec.partition(":")
    try:
        return LengthDistribution(mean, shape, float(spread) if spread else (0.0 if shape == "fixed" else 0.5))
    except ValueError as exc:  # WorkloadError is one
        raise InputError(
            f"--output-len-distribution {spec!r}: give SHAPE[:SPREAD], SHAPE one of "
            f"{', '.join(DISTRIBUTIONS)}, e.g. lognormal:0.5 ({exc})"
        ) from None
