"""servelab's memory plan beside vLLM's own start-up memory profile, as published.

Why: at saturation the KV cache decides how many requests run at once, and for a
large model on one GPU a few GiB of error in the plan halve it. This sets each
start-up of servelab/perf/data/measured_startups.yaml (vLLM's logged weights,
activation peak, non-torch memory, CUDA-graph memory, KV GiB and tokens) beside
`perf.memory.plan_memory` for the same chip, model, flags and vLLM release, with
the error of each term, and a refusal where vLLM refused to start.

The plan is made with the device total vLLM saw (`total_gib`), so the catalogue's
figure for the chip does not blur the comparison. Runs marked `fitted` had a term
of the plan read off them: they are printed but left out of the score. A start-up
servelab refuses still shows the weights and activation peak it plans.

    PYTHONPATH=. .venv/bin/python benchmarks/memory_plan_check.py
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import yaml

from servelab.perf.engine_args import parse_engine_args, resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.memory import GiB, MemoryPlan, MemoryReserve, activation_bytes, plan_memory, rank_weight_bytes
from servelab.perf.models import ModelSpec, get_model, model_from_hf_config
from servelab.perf.vllm_versions import parse_version, version_defaults

DATA = Path(__file__).resolve().parents[1] / "servelab" / "perf" / "data" / "measured_startups.yaml"
TERMS = ("weights", "activation", "non_torch", "cuda_graph", "kv")


def _model(name: str, extra: dict[str, Any]) -> ModelSpec:
    if name in extra:
        return model_from_hf_config(extra[name]["config"], name, extra[name]["source"])
    return get_model(name)


def _inputs(run: dict[str, Any], extra_models: dict[str, Any]) -> tuple[Hardware, ModelSpec, EngineConfig]:
    """The chip (with the device total vLLM saw), the model and the resolved engine config of one start-up."""
    hardware = get_gpu(run["gpu"]).model_copy(update={"memory_gib": run["total_gib"]})
    model = _model(run["model"], extra_models)
    version = parse_version(run["vllm_version"])
    config = parse_engine_args(run["flags"], base=version_defaults(version)).config
    return hardware, model, resolve(config, hardware, model, vllm_version=version)


def plan_for(run: dict[str, Any], extra_models: dict[str, Any]) -> MemoryPlan:
    """servelab's plan of this start-up, or PerfConfigError where servelab refuses it."""
    return plan_memory(*_inputs(run, extra_models))


def _refused_terms(run: dict[str, Any], extra_models: dict[str, Any]) -> dict[str, float]:
    """The weights and activation peak servelab plans for a start-up it refuses: they do not depend on the refusal,
    and a refused start-up's logged weights are still a measurement of them."""
    hardware, model, config = _inputs(run, extra_models)
    model = model.with_dtype(config.dtype)
    return {
        "weights": rank_weight_bytes(model, config, hardware) / GiB,
        "activation": activation_bytes(model, config, MemoryReserve()) / GiB,
    }


def _planned(plan: MemoryPlan) -> dict[str, float]:
    return {
        "weights": plan.weight_bytes / GiB,
        "activation": plan.activation_bytes / GiB,
        "non_torch": plan.non_torch_bytes / GiB,
        "cuda_graph": plan.cuda_graph_bytes / GiB,
        "kv": plan.kv_cache_bytes / GiB,
        "kv_tokens": float(plan.kv_token_capacity),
    }


def _cell(measured: float | None, planned: float | None, digits: int = 2) -> str:
    if measured is None and planned is None:
        return ""
    if measured is None:
        return f"– / {planned:.{digits}f}"
    if planned is None:
        return f"{measured:.{digits}f} / –"
    text = f"{measured:,.{digits}f} / {planned:,.{digits}f}"
    return f"{text} ({planned / measured - 1:+.0%})" if abs(measured) > 0.2 else text


def check(data: dict[str, Any]) -> tuple[list[str], dict[str, list[float]]]:
    """Table rows, and the relative errors of the scored runs by term."""
    rows: list[str] = []
    errors: dict[str, list[float]] = {term: [] for term in (*TERMS, "kv_tokens")}
    for run in data["startups"]:
        measured = run["measured"]
        try:
            planned = _planned(plan_for(run, data["models"]))
            started = True
            outcome = "refused by vLLM, started here" if run.get("failed") else "starts (both)"
        except PerfConfigError as refusal:
            planned = _refused_terms(run, data["models"])
            started = False
            outcome = "refused (both)" if run.get("failed") else f"refused here only: {refusal}"
        scored = not run.get("fitted")
        if started and scored and not run.get("failed"):
            for term in (*TERMS, "kv_tokens"):
                if measured.get(term) is not None and term != "cuda_graph":
                    errors[term].append(planned[term] / measured[term] - 1)
        cells = [_cell(measured.get(t), planned.get(t)) for t in TERMS]
        tokens = _cell(measured.get("kv_tokens"), planned.get("kv_tokens"), 0)
        rows.append(
            f"| {run['id']} | {run['vllm_version']} | {run['model']} | {run['flags']} | "
            + " | ".join(cells)
            + f" | {tokens} | {outcome}{'' if scored else ' (fitted: not scored)'} |"
        )
    return rows, errors


def main() -> None:
    data = yaml.safe_load(DATA.read_text())
    rows, errors = check(data)
    print(
        "Measured (vLLM log) / planned (servelab) GiB per GPU, error of the plan in brackets. cuda_graph: vLLM's "
        "log is what capturing took after the KV cache was sized; the plan's, what it takes from the KV budget.\n"
    )
    print(
        "| run | vLLM | model | flags | weights | activation peak | non-torch | CUDA graphs | KV GiB | KV tokens | "
        "outcome |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nScored runs (not fitted, started): median |error| / median signed error by term")
    for term, values in errors.items():
        if values:
            print(
                f"- {term}: {statistics.median(abs(v) for v in values):.1%} / "
                f"{statistics.median(values):+.1%} over {len(values)} runs"
            )


if __name__ == "__main__":
    main()
