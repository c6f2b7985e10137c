"""The search space: which engine knobs (and optionally which hardware) to try, with which values.

A space is declarative: `max_num_seqs=default,32,128` names the knob as vLLM
spells its field and lists the values to try, `default` meaning "leave the flag
out and let vLLM choose" (so a candidate can also *remove* a flag the current
launch line sets). A knob named without values gets the built-in candidates
below, each list starting with vLLM's own default so the baseline's neighbours
are always in the space. Values are typed and checked here, before any trial,
so a typo is one error message rather than a hundred failed trials.

SGLang's and TensorRT-LLM's knobs are named as their own flags
(`max_running_requests`, `max_batch_size`) and read by the converter of that
engine's flag table (perf/sglang_args.py, perf/trtllm_args.py), so a value the
space accepts is one the engine's parser accepts; servelab/tune/engine_lines.py
writes a candidate into the engine's launch line.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path
from typing import Any

import yaml

from servelab.perf import sglang_args, trtllm_args
from servelab.perf.engine_flags import FlagTable, choice, fraction
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.schemas.vocabulary import RouterPolicy
from servelab.sim.engines import LABELS, SGLANG, TRTLLM, VLLM
from servelab.targets.deployment import Deployment
from servelab.targets.engine_deployment import EngineDeployment
from servelab.tune.engine_lines import TABLES, engine_line, flag_of
from servelab.tune.errors import TuneError

Value = int | float | bool | str | None
Candidate = dict[str, Value]
"""One point of the space: knob name -> value (None = the engine's default)."""

DEFAULT = "default"
GPU = "gpu"
"""The hardware knob: a GPU name from the catalogue (the count is tensor_parallel_size x data_parallel_size)."""
ROUTER = "router"
"""The fleet knob: the router in front of the replicas (not an engine flag: the simulator's --router)."""


def _int(text: str) -> int:
    number = int(text)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def _non_negative_int(text: str) -> int:
    number = int(text)
    if number < 0:
        raise ValueError("must be >= 0")
    return number


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "on", "yes", "1"):
        return True
    if lowered in ("false", "off", "no", "0"):
        return False
    raise ValueError("must be true or false")


def _kv_dtype(text: str) -> str:
    allowed = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
    if text not in allowed:
        raise ValueError(f"must be one of {', '.join(allowed)}")
    return text


def _quantization(text: str) -> str | None:
    return None if text.lower() == "none" else text.lower()


def _gpu(text: str) -> str:
    try:
        return get_gpu(text).name
    except PerfConfigError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Knob:
    """One searchable setting: how its values are read and which ones to try when the user lists none."""

    name: str
    parse: Callable[[str], Value]
    candidates: tuple[Value, ...]
    nullable: bool
    """Whether `default` (None: the engine chooses) is a value."""
    help: str


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("max_num_seqs", _int, (None, 16, 32, 64, 128, 256, 512), True, "requests in one batch"),
        Knob("max_num_batched_tokens", _int, (None, 1024, 2048, 4096, 8192, 16384), True, "token budget per step"),
        Knob("enable_prefix_caching", _bool, (True, False), False, "hash-based KV reuse of shared prefixes"),
        Knob("enable_chunked_prefill", _bool, (True, False), False, "split long prompts over steps"),
        Knob(
            "long_prefill_token_threshold",
            _non_negative_int,
            (0, 256, 1024, 4096),
            False,
            "prompts longer than this are chunked to it (0 = off)",
        ),
        Knob("gpu_memory_utilization", fraction, (0.8, 0.9, 0.95), False, "share of GPU memory vLLM may use"),
        Knob(
            "api_server_count",
            _int,
            (None, 2, 4),
            True,
            "API-server processes (HTTP, tokenizing, streaming); default: one per data-parallel rank",
        ),
        Knob("max_model_len", _int, (None,), True, "longest prompt + output accepted"),
        Knob("kv_cache_dtype", _kv_dtype, ("auto", "fp8"), False, "KV-cache element type"),
        Knob("quantization", _quantization, (None,), True, "weight quantization (name the variants you have)"),
        Knob("tensor_parallel_size", _int, (1, 2, 4, 8), False, "GPUs per replica"),
        Knob(
            "data_parallel_size",
            _int,
            (1, 2, 4),
            False,
            "replicas behind a router (with expert parallelism: data-parallel attention ranks sharing the experts)",
        ),
        Knob(
            "enable_expert_parallel",
            _bool,
            (False, True),
            False,
            "mixture-of-experts: whole experts per GPU across TP x DP instead of every expert sliced over TP",
        ),
        Knob(
            ROUTER,
            choice(*RouterPolicy),
            tuple(RouterPolicy),
            False,
            "how requests are spread over the replicas (docs/fleets.md); with data_parallel_size > 1",
        ),
        Knob(GPU, _gpu, (), False, "GPU kind from the catalogue"),
    )
}
ALIASES = {
    "replicas": "data_parallel_size",
    "tp": "tensor_parallel_size",
    "ep": "enable_expert_parallel",
    "expert_parallel": "enable_expert_parallel",
    "dp": "data_parallel_size",
    "prefix_caching": "enable_prefix_caching",
    "chunked_prefill": "enable_chunked_prefill",
    "hardware": GPU,
}
DEFAULT_KNOBS = ("max_num_seqs", "max_num_batched_tokens")
"""Searched when the user names no knob: the two that decide batching, vLLM's biggest lever."""


def _flag_knob(
    table: FlagTable,
    name: str,
    candidates: tuple[Value, ...],
    nullable: bool,
    help: str,
    parse: Callable[[str], Value] | None = None,
) -> Knob:
    """A knob named as the engine's flag, read by that flag's own converter unless `parse` narrows it (or reads
    a switch's or a YAML-only setting's value)."""
    convert = parse or table.modelled[flag_of(name)].convert
    assert convert is not None, f"{name} needs a parse: its flag is a switch"
    return Knob(name, convert, candidates, nullable, help)


_SGL, _TRT = sglang_args.FLAGS, trtllm_args.FLAGS
_GPU_KNOB = KNOBS[GPU]
ENGINE_KNOBS: dict[str, dict[str, Knob]] = {
    VLLM: KNOBS,
    SGLANG: {
        k.name: k
        for k in (
            _flag_knob(_SGL, "max_running_requests", (None, 16, 32, 64, 128, 256, 512), True, "requests in one batch"),
            _flag_knob(
                _SGL,
                "chunked_prefill_size",
                (None, 2048, 4096, 8192, 16384),
                True,
                "prefill tokens per batch (-1: prompts go whole)",
            ),
            _flag_knob(
                _SGL,
                "schedule_policy",
                sglang_args.MODELLED_POLICIES,
                False,
                "admission order (lpm: longest cached prefix first)",
                choice(*sglang_args.MODELLED_POLICIES),
            ),
            _flag_knob(
                _SGL, "mem_fraction_static", (None, 0.8, 0.85, 0.9), True, "share of GPU memory for weights + KV"
            ),
            _flag_knob(_SGL, "tp_size", (1, 2, 4, 8), False, "GPUs per replica"),
            _flag_knob(_SGL, "ep_size", (1, 2, 4, 8), False, "mixture-of-experts: expert-parallel GPUs (1 or tp_size)"),
            _GPU_KNOB,
        )
    },
    TRTLLM: {
        k.name: k
        for k in (
            _flag_knob(_TRT, "max_batch_size", (None, 16, 32, 64, 128, 256, 512), True, "requests in one batch"),
            _flag_knob(_TRT, "max_num_tokens", (None, 2048, 4096, 16384), True, "token budget per iteration"),
            _flag_knob(
                _TRT,
                "capacity_scheduler_policy",
                trtllm_args.CAPACITY_POLICIES,
                False,
                "admission: reserve whole requests, or fill and pause",
                choice(*trtllm_args.CAPACITY_POLICIES),
            ),
            _flag_knob(_TRT, "enable_chunked_prefill", (False, True), False, "chunked context", _bool),
            _flag_knob(
                _TRT,
                "kv_cache_free_gpu_memory_fraction",
                (None, 0.8, 0.95),
                True,
                "share of the free memory for the KV cache",
            ),
            _flag_knob(_TRT, "tp_size", (1, 2, 4, 8), False, "GPUs per replica"),
            _GPU_KNOB,
        )
    },
}
"""Each engine's knobs; SGLang's and TensorRT-LLM's under their own flag names."""
ENGINE_ALIASES: dict[str, dict[str, str]] = {
    VLLM: ALIASES,
    **{
        engine: {
            alias.replace("-", "_"): flag.replace("-", "_")
            for alias, flag in TABLES[engine].aliases.items()
            if flag.replace("-", "_") in ENGINE_KNOBS[engine]
        }
        | {"hardware": GPU}
        for engine in (SGLANG, TRTLLM)
    },
}
ENGINE_DEFAULT_KNOBS = {
    VLLM: DEFAULT_KNOBS,
    SGLANG: ("max_running_requests", "chunked_prefill_size"),
    TRTLLM: ("max_batch_size", "max_num_tokens"),
}


def _known(engine: str) -> str:
    if engine not in ENGINE_KNOBS:
        raise TuneError(f"--engine {engine!r}: choose one of {', '.join(ENGINE_KNOBS)}")
    return engine


def knob_named(name: str, engine: str = VLLM) -> Knob:
    key = name.strip().lstrip("-").replace("-", "_")
    aliases, knobs = ENGINE_ALIASES[_known(engine)], ENGINE_KNOBS[engine]
    key = aliases.get(key, key)
    if key not in knobs:
        known = ", ".join([*knobs, *aliases])
        what = "" if engine == VLLM else f" of --engine {engine}"
        raise TuneError(f"unknown knob {name!r}{what} in the search space; known: {known}")
    return knobs[key]


def _parse_value(knob: Knob, raw: object, engine: str) -> Value:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() == DEFAULT):
        if not knob.nullable:
            raise TuneError(f"{knob.name} has no {LABELS[engine]} default to fall back on; list explicit values")
        return None
    try:
        return knob.parse(str(raw).strip())
    except ValueError as exc:
        raise TuneError(f"bad value {raw!r} for {knob.name} in the search space: {exc}") from None


@dataclass(frozen=True)
class SearchSpace:
    """Knob -> the values to try, in the user's order (the first value is where a grid starts)."""

    dimensions: dict[str, tuple[Value, ...]]
    engine: str = VLLM
    """Whose knobs these are (servelab.sim.engines)."""

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise TuneError("the search space is empty: name at least one knob")
        for name, values in self.dimensions.items():
            if not values:
                raise TuneError(f"{name} has no values to try")
            if len(set(values)) != len(values):
                raise TuneError(f"{name} lists a value twice: {list(values)}")

    @classmethod
    def from_items(cls, items: Sequence[str], engine: str = VLLM) -> SearchSpace:
        """From CLI words: `max_num_seqs=8,32,128` or a bare knob name for its built-in candidates."""
        dims: dict[str, tuple[Value, ...]] = {}
        for item in items or ENGINE_DEFAULT_KNOBS[_known(engine)]:
            name, sep, values = item.partition("=")
            knob = knob_named(name, engine)
            if knob.name in dims:
                raise TuneError(f"{knob.name} appears twice in the search space")
            if sep:
                dims[knob.name] = tuple(_parse_value(knob, v, engine) for v in values.split(",") if v.strip())
            elif knob.candidates:
                dims[knob.name] = knob.candidates
            else:
                raise TuneError(f"{knob.name} has no built-in candidates; list them: {knob.name}=A,B")
        return cls(dims, engine)

    @classmethod
    def from_file(cls, path: Path, engine: str = VLLM) -> SearchSpace:
        """A YAML or JSON mapping knob -> list of values (or null for the built-in candidates)."""
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise TuneError(f"cannot read the search space file {path}: {exc}") from None
        if not isinstance(data, Mapping):
            raise TuneError(f"{path}: expected a mapping of knob -> list of values")
        dims: dict[str, tuple[Value, ...]] = {}
        for name, values in data.items():
            knob = knob_named(str(name), engine)
            if values is None:
                dims[knob.name] = knob.candidates
            else:
                listed = values if isinstance(values, list) else [values]
                dims[knob.name] = tuple(_parse_value(knob, v, engine) for v in listed)
        return cls(dims, engine)

    @property
    def size(self) -> int:
        return prod(len(v) for v in self.dimensions.values())

    def grid(self) -> Iterator[Candidate]:
        names = list(self.dimensions)
        for values in itertools.product(*self.dimensions.values()):
            yield dict(zip(names, values))

    def suggest(self, trial: Any) -> Candidate:
        """Ask an optuna trial for one point (every knob is categorical: the values are what users can set)."""
        return {name: trial.suggest_categorical(name, list(values)) for name, values in self.dimensions.items()}

    def describe(self) -> dict[str, list[Value]]:
        return {name: list(values) for name, values in self.dimensions.items()}


def candidate_key(candidate: Mapping[str, Value]) -> str:
    """A stable identity for a point, to recognise one already evaluated."""
    return json.dumps(dict(sorted(candidate.items())), separators=(",", ":"))


def apply(base: Deployment, candidate: Mapping[str, Value], options_dir: Path | None = None) -> Deployment:
    """The base deployment with the candidate's knobs (and hardware) changed; the engine's defaults re-resolved.

    Another engine than vLLM is started anew from its launch line with the knobs written in (`options_dir`:
    where a TensorRT-LLM candidate's own options YAML goes, see engine_lines). Raises PerfConfigError when the
    result cannot run (does not fit, inconsistent limits).
    """
    changes: dict[str, Value] = dict(candidate)
    gpu = changes.pop(GPU, None)
    router = changes.pop(ROUTER, None)
    hardware = get_gpu(str(gpu)) if gpu else None
    built: Deployment
    if isinstance(base, EngineDeployment):
        built = base.relaunched(engine_line(base.engine, base.engine_flags, changes, options_dir), hardware)
    else:
        built = base.rebuilt(hardware=hardware, model=None, **changes)
    return replace(built, router=str(router or own_balancer(base, built)))


def own_balancer(base: Deployment, built: Deployment) -> str:
    """The router of a candidate whose router is not searched: a single vLLM server given data-parallel ranks is one
    server with `--data-parallel-size N`, whose own balancer (least-loaded) spreads its requests, as stage 2 starts it
    (tune/fleet_stage2.py); otherwise the base's."""
    grew = base.config.data_parallel_size == 1 < built.config.data_parallel_size
    return RouterPolicy.LEAST_LOADED if base.engine == VLLM and grew else base.router


def candidate_flags(launch: Deployment, candidate: Mapping[str, Value], options_dir: Path | None = None) -> str:
    """The launch flags of another engine than vLLM for a candidate: the user's line (`launch`) with its knobs
    written in, whether or not that configuration can run (vLLM's come from the resolved deployment)."""
    changes = {k: v for k, v in candidate.items() if k not in (GPU, ROUTER)}
    return engine_line(launch.engine, launch.engine_flags, changes, options_dir)


def gpu_count(deployment: Deployment) -> int:
    return deployment.config.tensor_parallel_size * deployment.config.data_parallel_size
