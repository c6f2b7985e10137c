"""Engine rankings: the simulator against published runs of one workload on two or three engines (docs/engines.md).

Each run of servelab/perf/data/engine_runs.yaml is replayed on every engine it
names, with that engine's flags, through the library path `servelab compare`
uses (build_engine_deployment -> sim_target().run -> summarize). Printed per
run: measured and predicted output throughput per engine, whether the predicted
ranking matches the measured one, and for each engine against the slowest
measured one the throughput ratio, measured vs predicted, with the error of the
predicted ratio; a three-engine run adds its third pair (the two faster engines),
so every pair's ratio is scored. Entries with an `excluded` reason are listed,
not scored.
Markdown; deterministic.

    PYTHONPATH=. .venv/bin/python benchmarks/engine_ranking.py
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.sim.engines import LABELS, VLLM
from servelab.targets.deployment import build_deployment
from servelab.targets.engine_deployment import build_engine_deployment
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan, RequestSpec

DATA = Path(__file__).resolve().parent.parent / "servelab" / "perf" / "data"
RUNS = DATA / "engine_runs.yaml"
LENGTHS = DATA / "published_lengths.yaml"
SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL, SHAREGPT_MIN = 1024, 2048, 4
"""vLLM's ShareGPT sampler (benchmark_serving / `vllm bench serve`) skips a conversation whose prompt is over 1,024
tokens, whose prompt + output is over 2,048, or either under 4: the drawn lengths go through the same filter, so the
lognormal's tail does not invent a 5,000-token straggler that no ShareGPT run sends."""


def _sharegpt_ok(spec: RequestSpec) -> bool:
    prompt = len(spec.prompt_ids)
    return (
        SHAREGPT_MIN <= prompt <= SHAREGPT_MAX_PROMPT
        and spec.max_tokens >= SHAREGPT_MIN
        and prompt + spec.max_tokens <= SHAREGPT_MAX_TOTAL
    )


def load_plan(run: dict[str, Any], vocab: int, max_prompts: int | None = None) -> LoadPlan:
    """The run's requests (the first `max_prompts`): the source's own lengths where servelab holds them, else drawn
    as the entry says."""
    w = run["workload"]
    arrival = ArrivalConfig(max_concurrency=w.get("max_concurrency"))
    n = min(w["num_prompts"], max_prompts or w["num_prompts"])
    if run.get("lengths"):
        # Each request as the source sent it; a resent prompt (same_prompt_as) sends the same tokens again.
        lens = yaml.safe_load(LENGTHS.read_text())[run["lengths"]]
        same = lens.get("same_prompt_as") or range(len(lens["input_lens"]))
        rng = np.random.default_rng(0)
        prompts: dict[int, np.ndarray] = {}
        specs = [
            RequestSpec(i, prompts.setdefault(s, rng.integers(0, vocab, p, dtype=np.int32)), max(1, o))
            for i, (p, o, s) in enumerate(zip(lens["input_lens"][:n], lens["output_lens"][:n], same))
        ]
        return LoadPlan(specs, max_concurrency=arrival.max_concurrency)
    if w.get("sharegpt"):
        workload = WorkloadConfig(
            "random",
            input_len=w["input_len"],
            output_len=w["output_len"],
            length_distribution="lognormal",
            range_ratio=1.0,
        )
        drawn = build_plan(workload, arrival, Amount(num_prompts=4 * n)).requests
        kept = [spec for spec in drawn if _sharegpt_ok(spec)][:n]
        return LoadPlan(
            [replace(spec, index=i) for i, spec in enumerate(kept)], max_concurrency=arrival.max_concurrency
        )
    workload = WorkloadConfig(
        "random", input_len=w["input_len"], output_len=w["output_len"], range_ratio=w.get("input_range_ratio", 0.0)
    )
    plan = build_plan(workload, arrival, Amount(num_prompts=n))
    # The spread is the prompts' only: each output is the client's fixed --max-tokens (EOS ignored).
    plan.requests = [replace(spec, max_tokens=w["output_len"]) for spec in plan.requests]
    return plan


def stated_version(text: str) -> str | None:
    """The vLLM release a source states ("0.9.0 (V1)" is 0.9); None: not stated (the modelled release)."""
    found = re.search(r"(\d+)\.(\d+)", text)
    return f"{found[1]}.{found[2]}" if found else None


def predict(run: dict[str, Any], engine: str, scratch: Path, max_prompts: int | None = None) -> float:
    """Predicted output throughput (tokens/s) of `engine` on the run, with the entry's flags."""
    flags = run["flags"][engine]
    options = run["flags"].get(f"{engine}_options")
    if options:
        path = scratch / f"{run['id']}-{engine}.yaml"
        path.write_text(yaml.safe_dump(options))
        flags = f"{flags} --extra_llm_api_options {path}"
    if engine == VLLM:
        # vLLM's side runs the stated release's defaults and CPU costs (synchronous scheduling before 0.14), as
        # benchmarks/gpu_accuracy.py replays it.
        version = stated_version(str(run.get("versions", {}).get(VLLM, "")))
        deployment = build_deployment(run["gpu"], run["model"], flags, vllm_version=version)
    else:
        deployment = build_engine_deployment(engine, run["gpu"], run["model"], flags)
    plan = load_plan(run, deployment.model.vocab_size, max_prompts)
    sink = MemorySink()
    result = deployment.sim_target().run(plan, sink)
    return float(summarize(sink.records, duration=result.duration).output_throughput)


def pair_errors(measured: dict[str, float], predicted: dict[str, float]) -> list[tuple[str, str, float]]:
    """Every pair of the run's engines, the measured faster first, with the error of the predicted throughput ratio
    against the measured one. The must-show names the ratio between engines, so a three-engine run is scored on all
    three pairs, not only on each engine against the slowest (two ratios within 15% can leave the third outside)."""
    order = sorted(measured, key=lambda e: -measured[e])
    return [
        (a, b, (predicted[a] / predicted[b]) / (measured[a] / measured[b]) - 1)
        for i, a in enumerate(order)
        for b in order[i + 1 :]
    ]


def main() -> None:
    entries = yaml.safe_load(RUNS.read_text())
    runs = [run for run in entries if not run.get("excluded")]
    print("| run | engine | measured tok/s | predicted tok/s | ratio to slowest, measured | predicted | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    matches, errors = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            measured = run["measured"]
            predicted = {e: predict(run, e, Path(tmp)) for e in measured}
            base = min(measured, key=lambda e: measured[e])
            for e in sorted(measured, key=lambda e: -measured[e]):
                m_ratio, p_ratio = measured[e] / measured[base], predicted[e] / predicted[base]
                error = p_ratio / m_ratio - 1
                print(
                    f"| {run['id']} | {LABELS[e]} | {measured[e]:,.0f} | {predicted[e]:,.0f} | {m_ratio:.3f} | "
                    f"{p_ratio:.3f} | "
                    f"{'—' if e == base else f'{error:+.1%}'} |"
                )
            for a, b, error in pair_errors(measured, predicted):
                errors.append(abs(error))
                if b != base:  # the pair the rows above leave out (a three-engine run's two faster engines)
                    print(
                        f"| {run['id']} | {LABELS[a]} / {LABELS[b]} | | | {measured[a] / measured[b]:.3f} | "
                        f"{predicted[a] / predicted[b]:.3f} | {error:+.1%} |"
                    )
            ranked_m = sorted(measured, key=lambda e: -measured[e])
            ranked_p = sorted(predicted, key=lambda e: -predicted[e])
            ok = ranked_m == ranked_p
            matches += ok
            measured_order = " > ".join(LABELS[e] for e in ranked_m)
            predicted_order = " > ".join(LABELS[e] for e in ranked_p)
            print(
                f"| {run['id']} | ranking | {measured_order} | {predicted_order} "
                f"| {'matches' if ok else 'differs'} | | |"
            )
    print()
    for run in entries:
        if run.get("excluded"):
            print(f"Excluded {run['id']}: {run['excluded']}")
            print()
    print(
        f"Rankings matched: {matches} of {len(runs)}; predicted pairwise ratios within 15%: "
        f"{sum(e <= 0.15 for e in errors)} of {len(errors)} (worst {max(errors):.1%})."
    )


if __name__ == "__main__":
    main()
