"""Published real-GPU vLLM runs (data/published.yaml) and a pure-roofline ceiling for each.

benchmarks/gpu_accuracy.py replays every run on the simulator (docs/accuracy.md).

The ceiling is a physical upper bound on output throughput, not a prediction:
datasheet peaks, no overhead, weights streamed once per decode step, every KV
byte read once per step it is attended. A measurement above its ceiling means
the entry's setup is wrong (or the catalogue is); one far below says how much
the simulator's efficiencies and overheads must explain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from servelab.errors import InputError
from servelab.perf.engine_args import parse_engine_args, resolve
from servelab.perf.hardware import get_gpu
from servelab.perf.memory import (
    kv_bytes_per_token_per_rank,
    plan_memory,
    weight_bytes_per_rank,
)
from servelab.perf.models import get_model
from servelab.perf.quantization import weight_format
from servelab.schemas.results import Json

PUBLISHED = Path(__file__).parent / "data" / "published.yaml"
LENGTHS = PUBLISHED.with_name("published_lengths.yaml")
PUBLISHED_MOE = PUBLISHED.with_name("published_moe.yaml")
"""The mixture-of-experts runs, scored apart (benchmarks/moe_accuracy.py)."""


@dataclass(frozen=True, slots=True)
class Ceiling:
    batch: int
    """Requests decoding together: concurrency, capped by max_num_seqs and KV capacity."""
    output_throughput: float
    bound: str
    """'compute' or 'memory': which side of the linear layers' roofline set the ceiling."""


class PublishedDataError(InputError):
    """An entry of a published-runs file with a field the replay cannot read; the message names the entry and field."""


class ThroughputFormula(StrEnum):
    """How a source turned its requests into its published throughput (an entry's `throughput` field)."""

    OVER_ELAPSED = "over_elapsed"
    """Output (or requests) over the span from the first send to the last finish: vLLM's benchmark clients."""
    CONCURRENCY_OVER_SUM_E2E = "concurrency_over_sum_e2e"
    """C x output / the sum of the requests' E2E: a closed loop of C taken as fully occupied throughout."""


WARMUP_PER_CONCURRENCY = re.compile(r"(\d+)C")
"""`client_warmup_requests: 2C`: twice the run's concurrency."""


def client_warmup_requests(entry: Json) -> int:
    """Requests the source's client ran to completion before the measured ones (0: none), as the entry's
    `client_warmup_requests` gives them: a count, or a multiple of the concurrency ("2C")."""
    value: Any = entry.get("client_warmup_requests", 0)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    multiple = WARMUP_PER_CONCURRENCY.fullmatch(str(value))
    concurrency = entry["workload"].get("max_concurrency")
    if multiple and concurrency:
        return int(multiple[1]) * int(concurrency)
    raise PublishedDataError(
        f"{entry['id']}: client_warmup_requests must be a request count or a multiple of max_concurrency "
        f"such as 2C (with max_concurrency set), got {value!r}"
    )


def throughput_formula(entry: Json) -> ThroughputFormula:
    """How the entry's measured throughputs were computed (its `throughput` field; over_elapsed by default)."""
    value = entry.get("throughput", ThroughputFormula.OVER_ELAPSED)
    try:
        formula = ThroughputFormula(value)
    except ValueError:
        known = ", ".join(ThroughputFormula)
        raise PublishedDataError(f"{entry['id']}: throughput must be one of {known}, got {value!r}") from None
    if formula is ThroughputFormula.CONCURRENCY_OVER_SUM_E2E and not entry["workload"].get("max_concurrency"):
        raise PublishedDataError(f"{entry['id']}: throughput {formula} needs the run's max_concurrency")
    return formula


def published_entries(path: Path = PUBLISHED) -> list[Json]:
    """The runs of one published-runs file (published.yaml, or published_moe.yaml), their replay fields checked."""
    result: list[Json] = yaml.safe_load(path.read_text())
    for entry in result:
        client_warmup_requests(entry)
        throughput_formula(entry)
    return result


def _resends_prompts(entry: Json) -> bool:
    """Whether some requests repeat an earlier prompt (a `prompt_pool`, or published_lengths.yaml `same_prompt_as`)."""
    if entry["workload"].get("prompt_pool"):
        return True
    if not entry.get("lengths"):
        return False
    same = yaml.safe_load(LENGTHS.read_text())[entry["lengths"]].get("same_prompt_as") or []
    return any(j != i for i, j in enumerate(same))


def roofline_ceiling(entry: Json) -> Ceiling | None:
    """Output tokens/s no engine could beat on the entry's setup; None when it cannot be bounded this way.

    None when the lengths are unknown, or when requests resend earlier prompts: the prefix cache then
    skips their prefill and shares their KV blocks, which this bound charges in full. An open-loop run's
    batch is also bounded by its arrivals, so for one the ceiling is looser still.
    """
    workload = entry["workload"]
    prompt, output = workload.get("mean_input_len"), workload.get("mean_output_len")
    if not prompt or not output or _resends_prompts(entry):
        return None
    hardware, model = get_gpu(entry["gpu"]), get_model(entry["model"])
    config = resolve(parse_engine_args(entry.get("engine_args") or "").config, hardware, model)
    model = model.with_dtype(config.dtype)
    tp = config.tensor_parallel_size
    plan = plan_memory(hardware, model, config)
    max_num_seqs = config.max_num_seqs
    assert max_num_seqs is not None  # resolve() sets every knob
    batch: int = min(
        workload.get("max_concurrency") or max_num_seqs,
        max_num_seqs,
        plan.max_concurrency(int(prompt + output)),
        workload.get("num_prompts") or max_num_seqs,
    )
    # One "cycle": `batch` requests each prefill `prompt` tokens and decode `output` tokens.
    peak = hardware.peak_flops(weight_format(config.quantization, model, hardware).compute_dtype)
    bandwidth = hardware.memory_bandwidth
    linear_flops = (
        batch * ((prompt + output) * model.linear_flops_per_token + output * model.lm_head_flops_per_token) / tp
    )
    streamed = (
        weight_bytes_per_rank(model, config.quantization, hardware, tp)
        - model.embedding_params * model.dtype_bytes / tp
    )
    linear_time = max(linear_flops / peak, output * streamed / bandwidth)
    pairs = batch * (prompt * prompt / 2 + output * (prompt + output / 2))
    attention_flops = pairs * model.attention_flops_per_pair / tp
    kv_read = batch * output * (prompt + output / 2) * kv_bytes_per_token_per_rank(model, config.kv_cache_dtype, tp)
    attention_time = max(attention_flops / hardware.peak_flops("bf16"), kv_read / bandwidth)
    cycle = linear_time + attention_time
    replicas = config.data_parallel_size
    return Ceiling(
        batch=batch,
        output_throughput=replicas * batch * output / cycle,
        bound="compute" if linear_flops / peak >= output * streamed / bandwidth else "memory",
    )
