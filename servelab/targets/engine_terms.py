"""How a diagnosis names a knob, a launch line and a metric on the engine it diagnoses.

A finding or a what-if is reasoned in the simulator's common knobs
(EngineConfig's fields: max_num_seqs, max_num_batched_tokens, ...), but
advice a user can act on must be in their engine's spelling: SGLang's
`--max-running-requests`, TensorRT-LLM's `--max_batch_size` or a key of its
`--extra_llm_api_options` YAML. `Terms` turns one into the other, from the
tables the deployments themselves use (targets/deployment.py for vLLM,
targets/engine_deployment.py KNOBS for the others), so advice and the
launch line a what-if prints cannot disagree.

The engine a run was served by is what run.json recorded: the server's own
identity for a `bench` run (targets/engine_identity.py), `flags.engine` for
a `simulate` run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.errors import InputError
from servelab.perf.engine_args import split_environment
from servelab.metrics import engines as metric_names
from servelab.metrics import timeline as tl
from servelab.schemas.results import RunInfo
from servelab.sim.engines import ENGINES, LABELS, SGLANG, TRTLLM, VLLM
from servelab.targets.deployment import VLLM_FLAGS, VLLM_SWITCHES
from servelab.targets.engine_deployment import KNOBS, config_line

LAUNCH = {
    VLLM: "vllm serve MODEL",
    SGLANG: "python -m sglang.launch_server --model-path MODEL",
    TRTLLM: "trtllm-serve MODEL",
}
"""The start of each engine's launch line, as a confirm step tells the user to restart the server."""


@dataclass(frozen=True)
class Terms:
    """One engine's words for the common knobs."""

    engine: str

    @property
    def label(self) -> str:
        return LABELS[self.engine]

    @property
    def vllm(self) -> bool:
        return self.engine == VLLM

    def name(self, knob: str) -> str:
        """The flag (or YAML key) that sets `knob` on this engine: `--max-num-seqs`, `--max-running-requests`, ..."""
        if self.vllm:
            return VLLM_FLAGS.get(knob) or f"--{VLLM_SWITCHES[knob]}"
        own = KNOBS[self.engine][knob]
        return own.flag or f"{own.config_key} (--extra_llm_api_options YAML)"

    def knob(self, knob: str) -> str:
        """The word evidence uses for `knob`: vLLM's own field name (max_num_seqs), another engine's flag."""
        return knob if self.vllm else self.name(knob)

    def setting(self, knob: str, value: Any) -> str:
        """`knob` set to `value`, as the user would write it on this engine."""
        if self.vllm:
            if knob in VLLM_SWITCHES:
                return ("--" if value else "--no-") + VLLM_SWITCHES[knob]
            return f"{VLLM_FLAGS[knob]} {value}"
        own = KNOBS[self.engine][knob]
        converted = own.convert(value)
        if own.flag is None:
            return f"{config_line(own, converted)} in the --extra_llm_api_options YAML"
        if isinstance(converted, bool):
            return own.flag if converted else f"without {own.flag}"
        return f"{own.flag} {converted}"

    def knows(self, knob: str) -> bool:
        """Whether this engine has a counterpart of the common `knob` (TensorRT-LLM has no data_parallel_size flag)."""
        return (knob in VLLM_FLAGS or knob in VLLM_SWITCHES) if self.vllm else knob in KNOBS[self.engine]

    @property
    def preemptions(self) -> str:
        """What the engine calls sending a running request back to recompute: SGLang retracts."""
        return "retractions" if self.engine == SGLANG else "preemptions"

    @property
    def launch(self) -> str:
        return LAUNCH[self.engine]

    def launch_command(self, engine_args: str) -> str:
        """The command to paste: the launcher with `engine_args` after it, and the line's leading environment
        assignments (`VLLM_MXFP4_USE_MARLIN=1`) before it, where a shell reads them."""
        environment, flags = split_environment(engine_args.split())
        return " ".join([*environment, self.launch, *flags])

    @property
    def token_counters(self) -> str:
        """The engine's own /metrics counters of prompt tokens and of finished requests, as it names them."""
        if self.vllm:
            return "vllm:prompt_tokens_total and vllm:request_success_total"
        own = metric_names.ENGINES[self.engine]
        names = [
            next(n for n in own.common if c in metric_names.common_names(own, n))
            for c in (tl.PROMPT_TOKENS, tl.E2E_COUNT)
        ]
        return " and ".join(names)

    def metrics(self, *common: str) -> str:
        """The engine's own /metrics names for these common timeline names (servelab/metrics/timeline.py)."""
        own = metric_names.ENGINES[self.engine]
        return " and ".join(next((n for n in own.common if c in metric_names.common_names(own, n)), c) for c in common)


def recorded_engine(run_info: RunInfo | None) -> str | None:
    """The engine run.json says served the run: the server's reported identity (bench), `flags.engine` (simulate),
    or the simulated deployment's engine. None: no run, or one that records none."""
    if run_info is None:
        return None
    server = run_info.server_info
    if server is not None and server.engine is not None and server.engine.name:
        return server.engine.name
    flagged = (run_info.flags.engine if run_info.flags is not None else None) or (
        run_info.deployment.engine if run_info.deployment is not None else None
    )
    return str(flagged) if flagged else None


def check_engine(flag: str) -> None:
    """--engine names a modelled engine or auto; InputError otherwise (before any run is read)."""
    if flag not in (*ENGINES, metric_names.AUTO):
        raise InputError(f"--engine {flag!r}: choose one of {', '.join(ENGINES)} or {metric_names.AUTO}")


def served_engine(flag: str, run_info: RunInfo | None) -> tuple[str, str | None]:
    """The engine to diagnose, and a warning when --engine and run.json disagree (or the recorded one is not modelled).

    `auto` takes what the run recorded (the server's reported identity, or a simulated run's --engine), vLLM when
    nothing is; an explicit --engine wins over the record, since the user may know better (an old run.json, a proxy
    in front of the server), but the contradiction is said, naming both.
    """
    check_engine(flag)
    recorded = recorded_engine(run_info)
    if flag == metric_names.AUTO:
        if recorded is None or recorded in ENGINES:
            return recorded or VLLM, None
        return VLLM, (
            f"run.json records the engine {recorded!r}, which servelab does not model; diagnosed as vLLM "
            f"(give --engine {'|'.join(ENGINES)} to choose)"
        )
    if recorded is not None and recorded != flag:
        return flag, (
            f"--engine {flag} but run.json records the run as served by {recorded}: diagnosing it as "
            f"{LABELS[flag]}, with --engine-args read as {LABELS[flag]}'s flags"
        )
    return flag, None
