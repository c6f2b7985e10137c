"""`--tried "CHANGE:RESULT"`: what the user already changed, and what they saw it do.

"We lowered max_num_batched_tokens and quantized, no effect" is evidence. Each
tried change is built as a what-if of the described deployment and simulated;
where the simulator predicts the result the user saw, the explanation it was
simulated under gains weight, where it predicts another, it loses it
(diagnose/reconcile.py). The options and advice are marked "you tried this",
and a change the user saw do nothing is never the first thing recommended.

CHANGE is an engine flag as typed after `vllm serve` (`--max-num-batched-tokens
512`, `--kv-cache-dtype fp8`), a quantization (`awq`, `gptq`, `fp8`, `int8` or
`w8a8`), a GPU from the catalogue (`h100`), or a replica (`replica`, `+1
replica`); RESULT is `no-effect`, `helped` or `hurt`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

from servelab.diagnose.recommend import NO_EFFECT, Outcome, run
from servelab.diagnose.scenario import Scenario
from servelab.errors import InputError
from servelab.perf.engine_args import parse_engine_args
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import get_gpu
from servelab.targets.deployment import Deployment


class TriedResult(StrEnum):
    NO_EFFECT = NO_EFFECT
    HELPED = "helped"
    HURT = "hurt"


QUANTIZATIONS = {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "int8": "int8", "w8a8": "int8"}
"""A quantization as users name it -> the quantization the cost model prices."""
REPLICA_WORDS = ("replica", "+1 replica", "a replica", "2 replicas", "second gpu", "dp=2")


@dataclass(frozen=True)
class Tried:
    change: str
    result: TriedResult


def parse_tried(text: str) -> Tried:
    """`CHANGE:RESULT`; InputError naming --tried when malformed (the RESULT is after the last colon)."""
    change, sep, result = text.rpartition(":")
    choices = ", ".join(r.value for r in TriedResult)
    if not sep or not change.strip():
        raise InputError(
            f"--tried {text!r}: give CHANGE:RESULT, RESULT one of {choices} "
            '(e.g. --tried "--max-num-batched-tokens 512:no-effect" --tried "awq:no-effect")'
        )
    try:
        return Tried(change.strip(), TriedResult(result.strip().lower()))
    except ValueError:
        raise InputError(f"--tried {text!r}: the result {result.strip()!r} is not one of {choices}") from None


def tried_deployment(d: Deployment, change: str) -> Deployment:
    """The deployment with the tried change made; InputError naming --tried when the change is not one servelab
    knows."""
    word = change.strip().lower()
    try:
        if word.startswith("-"):
            parsed = parse_engine_args(change, base=d.requested).config
            diff = {
                f.name: getattr(parsed, f.name)
                for f in fields(EngineConfig)
                if getattr(parsed, f.name) != getattr(d.requested, f.name)
            }
            if not diff:
                raise InputError(f"--tried {change!r}: the deployment already runs with that setting")
            return d.with_changes(**diff)
        if word in QUANTIZATIONS:
            return d.with_changes(quantization=QUANTIZATIONS[word])
        if word in REPLICA_WORDS:
            return d.with_changes(data_parallel_size=2 * d.config.data_parallel_size)
        return d.rebuilt(hardware=get_gpu(word))
    except PerfConfigError as exc:
        raise InputError(
            f"--tried {change!r}: {exc} (CHANGE is an engine flag as typed after `vllm serve`, one of "
            f"{', '.join(QUANTIZATIONS)}, a GPU name or 'replica')"
        ) from None


def check_all(d: Deployment, tried: Sequence[Tried]) -> tuple[tuple[Deployment, str], ...]:
    """Every tried change built, with what the user saw it do: an unknown change is an error before any simulation."""
    return tuple((tried_deployment(d, t.change), t.result.value) for t in tried)


def predicted(
    d: Deployment, t: Tried, scenario: Scenario, figure: Callable[[Outcome], float | None], outside_ms: float = 0.0
) -> tuple[float, float]:
    """The figure before and after the tried change on `scenario`, on the simulator, with `outside_ms` the engine never
    sees added to both (a latency's time outside the engine dilutes what an engine change can do to it)."""
    before = figure(run(d, scenario, None)) or 0.0
    after = figure(run(tried_deployment(d, t.change), scenario, None)) or 0.0
    return before + outside_ms, after + outside_ms
