"""What `bench` and `simulate` are asked to do: each request's flags declared once, as typed fields with their
option beside them, so the CLI's flags (`flag_block`), the Python API and the checks read the same fields.

A request is built from what the flags parse; `check()` refuses every impossible combination, naming the flags,
before a server is touched or a plan drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Optional, TypedDict

import typer

from servelab.flags.checks import MAX_INT, real
from servelab.flags.options import (
    DEPLOYMENT_PANEL,
    SERVER_PANEL,
    ApiKeyFlag,
    CalibrationFlag,
    EngineArgsFlag,
    EngineFlag,
    GpuFileFlag,
    GpuFlag,
    LoadFlags,
    ModelFlag,
    ReplicasFlag,
    RouterFlag,
    RouterWeightsFlag,
    TpFlag,
    VllmVersionFlag,
)
from servelab.errors import InputError
from servelab.metrics.engines import AUTO, ENGINE_CHOICES
from servelab.schemas.vocabulary import SESSION_HEADER, VLLM, Route
from servelab.targets.preflight import ENDPOINTS

if TYPE_CHECKING:
    from servelab.targets.deployment import Deployment

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
_CLUSTER = "Cluster"
RayAddressFlag = Annotated[
    Optional[str],
    typer.Option(
        help="Run on this Ray cluster (host:port of its head, ray://host:10001, or auto); needs `pip install "
        "'servelab\\[ray]'`.",
        rich_help_panel=_CLUSTER,
    ),
]


class HttpOptions(TypedDict):
    """HttpTarget's keyword arguments as bench's flags set them: typed, so mypy holds them to HttpTarget's own
    signature (each client actor of `--clients N` builds its target from them)."""

    base_url: list[str]
    endpoint: str
    model: str | None
    api_key: str | None
    ignore_eos: bool
    request_timeout: float
    scrape_interval: float
    send_text: bool
    workers: int
    engine: str
    abandon_after: float | None
    abandon_share: float
    route: Route
    session_header: str | None
    replica_metrics_urls: tuple[str, ...]


@dataclass(frozen=True)
class ServerFlags:
    """`bench`'s own flags: the server measured and how the client talks to it."""

    base_url: Annotated[
        Optional[list[str]],
        typer.Option(
            help="Server root, e.g. http://127.0.0.1:8000. Repeat it for replicas of one model with no router in "
            "front: "
            "the load is spread over them (--route) and each record names the URL that served it.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = None
    route: Annotated[
        Route, typer.Option(help="How requests are spread over several --base-url.", rich_help_panel=SERVER_PANEL)
    ] = Route.ROUND_ROBIN
    endpoint: Annotated[str, typer.Option(help=f"One of {', '.join(ENDPOINTS)}.", rich_help_panel=SERVER_PANEL)] = (
        "/v1/completions"
    )
    model: Annotated[
        Optional[str],
        typer.Option(help="Served model name (default: the first of /v1/models).", rich_help_panel=SERVER_PANEL),
    ] = None
    api_key: ApiKeyFlag = None
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos", help="vLLM: generate exactly max_tokens.", rich_help_panel=SERVER_PANEL)
    ] = False
    request_timeout: Annotated[
        float,
        typer.Option(callback=real(gt=0), help="Seconds a request may take in all.", rich_help_panel=SERVER_PANEL),
    ] = 600.0
    scrape_interval: Annotated[
        float, typer.Option(callback=real(gt=0), help="Seconds between /metrics scrapes.", rich_help_panel=SERVER_PANEL)
    ] = 1.0
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=1024,
            help="Client processes, one event loop each: raise it when the summary warns that the client "
            "is the bottleneck.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = 1
    gpu_metrics_url: Annotated[
        Optional[str],
        typer.Option(
            help="A DCGM exporter's /metrics (e.g. http://gpu-host:9400/metrics): the server's GPUs, sampled with "
            "/metrics "
            "into timeline.jsonl. Default: this host's GPUs through NVML, if any.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = None
    engine: Annotated[
        str,
        typer.Option(
            help=f"Whose /metrics names to read: {', '.join(ENGINE_CHOICES)} (auto: the names the server exports). "
            "The engine and its version, as the server reports them, go into run.json.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = AUTO
    abandon_after: Annotated[
        Optional[float],
        typer.Option(
            callback=real(gt=0),
            help="Seconds after which a request still streaming is abandoned (connection closed, as a user closing the "
            "tab): recorded as abandoned, not an error; the summary counts them apart.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = None
    abandon_share: Annotated[
        float,
        typer.Option(
            callback=real(gt=0, le=1),
            help="The share of requests that abandon after --abandon-after (the same ones in every run).",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = 1.0
    replica_metrics_url: Annotated[
        Optional[list[str]],
        typer.Option(
            help="A replica's /metrics behind the router at --base-url (repeat it for each): scraped alongside the "
            "run, so "
            "run.json's server_info.replicas says what each served, its queue, KV usage and prefix-cache hits. "
            "Several --base-url are scraped without it.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = None
    session_header: Annotated[
        str,
        typer.Option(
            help="The header carrying a request's conversation id (multiturn) for routers with session affinity; "
            "'' sends none.",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = SESSION_HEADER
    ray_address: RayAddressFlag = None
    clients: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_INT,
            help="With --ray-address: client actors sharing the load (spread over the nodes), each with --workers "
            "processes.",
            rich_help_panel=_CLUSTER,
        ),
    ] = 1

    @property
    def urls(self) -> list[str]:
        return self.base_url or [DEFAULT_BASE_URL]

    def target_options(self, send_text: bool) -> HttpOptions:
        """HttpTarget's keyword arguments (also what each client actor of `--clients N` builds its own from)."""
        return HttpOptions(
            base_url=self.urls,
            endpoint=self.endpoint,
            model=self.model,
            api_key=self.api_key,
            ignore_eos=self.ignore_eos,
            request_timeout=self.request_timeout,
            scrape_interval=self.scrape_interval,
            send_text=send_text,
            workers=self.workers,
            engine=self.engine,
            abandon_after=self.abandon_after,
            abandon_share=self.abandon_share,
            route=self.route,
            session_header=self.session_header or None,
            replica_metrics_urls=tuple(self.replica_metrics_url or ()),
        )


@dataclass(frozen=True)
class BenchRequest:
    """`servelab bench`: measure a running server under the load described."""

    server: ServerFlags
    load: LoadFlags
    argv: tuple[str, ...] = ()
    """The command line as typed, secrets masked (run.json's `argv`); empty from the Python API."""

    def check(self) -> None:
        s = self.server
        self.load.check()
        if s.engine not in ENGINE_CHOICES:
            raise InputError(f"--engine must be one of {', '.join(ENGINE_CHOICES)}, got {s.engine!r}")
        if s.abandon_share != 1.0 and s.abandon_after is None:
            raise InputError("--abandon-share picks the requests that abandon: it needs --abandon-after")
        if s.gpu_metrics_url is not None and not s.gpu_metrics_url.startswith(("http://", "https://")):
            raise InputError(f"--gpu-metrics-url must be an http(s) URL, got {s.gpu_metrics_url!r}")
        if len(set(s.urls)) != len(s.urls):
            raise InputError(f"--base-url: a URL is given twice ({', '.join(s.urls)})")
        if s.replica_metrics_url and len(s.urls) > 1:
            raise InputError(
                "--replica-metrics-url is for replicas behind one router URL; several --base-url are scraped themselves"
            )
        if s.clients > 1 and s.ray_address is None:
            raise InputError(
                "--clients puts client actors on a Ray cluster: give --ray-address (on one machine, --workers)"
            )
        if s.ray_address is not None and self.load.sweep is not None:
            raise InputError(
                "--sweep with --ray-address: bench's sweep points share one server and run one after "
                "another; drop one of them"
            )

    def check_text(self, text_prompts: bool) -> None:
        """The chat endpoint sends text: the plan must have it (known once the plan is drawn)."""
        if self.server.endpoint == "/v1/chat/completions" and not (self.load.tokenizer or text_prompts):
            raise InputError(
                f"--endpoint {self.server.endpoint} sends text: give --tokenizer (or a sharegpt/jsonl "
                f"dataset) with --dataset-name {self.load.dataset_name}"
            )


@dataclass(frozen=True)
class DeploymentFlags:
    """`simulate`'s own flags: the deployment simulated."""

    gpu: GpuFlag = None
    model: ModelFlag = None
    engine: EngineFlag = VLLM
    engine_args: EngineArgsFlag = ""
    tp: TpFlag = None
    replicas: ReplicasFlag = None
    router: RouterFlag = None
    router_weights: RouterWeightsFlag = None
    gpu_file: GpuFileFlag = None
    calibration: CalibrationFlag = None
    vllm_version: VllmVersionFlag = None
    scrape_interval: Annotated[
        float,
        typer.Option(
            callback=real(gt=0), help="Simulated seconds between timeline samples.", rich_help_panel=DEPLOYMENT_PANEL
        ),
    ] = 1.0
    ignore_eos: Annotated[
        bool,
        typer.Option(
            "--ignore-eos",
            help="As `bench --ignore-eos`: generate exactly max_tokens. The simulator always does (where EOS "
            "falls is the text's, not the engine's: vary --random-output-len with --random-range-ratio "
            "instead); taken so a bench line pastes as is.",
            rich_help_panel=DEPLOYMENT_PANEL,
        ),
    ] = False
    ray_address: RayAddressFlag = None

    def deployment(self) -> Deployment:
        from servelab.flags.options import deployment_from_flags

        return deployment_from_flags(
            self.gpu,
            self.model,
            self.engine_args,
            calibration=self.calibration,
            tp=self.tp,
            replicas=self.replicas,
            router=self.router,
            gpu_file=self.gpu_file,
            vllm_version=self.vllm_version,
            engine=self.engine,
            router_weights=self.router_weights,
        )


@dataclass(frozen=True)
class SimulateRequest:
    """`servelab simulate`: the load bench would send, served by a simulated deployment."""

    deployment: DeploymentFlags
    load: LoadFlags
    argv: tuple[str, ...] = ()

    def check(self) -> None:
        self.load.check()
        if self.deployment.ray_address is not None and self.load.sweep is None:
            raise InputError(
                "--ray-address spreads the points of a --sweep over the cluster; a single run has nothing to spread"
            )
