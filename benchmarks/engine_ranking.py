"""Engine rankings: the simulator against published runs of one workload on two or three engines (docs/engines.md).

Each run of servelab/perf/data/engine_runs.yaml is replayed on every engine it
names, with that engine's flags, through the library path `servelab compare`
uses (build_engine_deployment -> sim_target().run -> summarize). Printed per
run: measured and predicted output throughput per engine, whether the predicted
ranking matches the measured one, and for each engine against the slowest
measured one the throughput ratio, measured vs predicted, with the error of the
predicted ratio. Markdown; deterministic.

    PYTHONPATH=. .venv/bin/python benchmarks/engine_ranking.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.sim.engines import LABELS
from servelab.targets.engine_deployment import build_engine_deployment
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan

RUNS = Path(__file__).resolve().parent.parent / "servelab" / "perf" / "data" / "engine_runs.yaml"


def predict(run: dict[str, Any], engine: str, scratch: Path) -> float:
    flags = run["flags"][engine]
    options = run["flags"].get(f"{engine}_options")
    if options:
        path = scratch / f"{run['id']}-{engine}.yaml"
        path.write_text(yaml.safe_dump(options))
        flags = f"{flags} --extra_llm_api_options {path}"
    deployment = build_engine_deployment(engine, run["gpu"], run["model"], flags)
    w = run["workload"]
    workload = (WorkloadConfig("random", input_len=w["input_len"], output_len=w["output_len"], length_distribution="lognormal",
                               range_ratio=1.0) if w.get("sharegpt") else
                WorkloadConfig("random", input_len=w["input_len"], output_len=w["output_len"]))
    plan = build_plan(workload, ArrivalConfig(max_concurrency=w.get("max_concurrency")), Amount(num_prompts=w["num_prompts"]))
    sink = MemorySink()
    result = deployment.sim_target().run(plan, sink)
    return float(summarize(sink.records, duration=result.duration)["output_throughput"])


def main() -> None:
    runs = yaml.safe_load(RUNS.read_text())
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
                if e != base:
                    errors.append(abs(error))
                print(f"| {run['id']} | {LABELS[e]} | {measured[e]:,.0f} | {predicted[e]:,.0f} | {m_ratio:.3f} | {p_ratio:.3f} | "
                      f"{'—' if e == base else f'{error:+.1%}'} |")
            ranked_m = sorted(measured, key=lambda e: -measured[e])
            ranked_p = sorted(predicted, key=lambda e: -predicted[e])
            ok = ranked_m == ranked_p
            matches += ok
            print(f"| {run['id']} | ranking | {' > '.join(LABELS[e] for e in ranked_m)} | {' > '.join(LABELS[e] for e in ranked_p)} | "
                  f"{'matches' if ok else 'differs'} | | |")
    print()
    print(f"Rankings matched: {matches} of {len(runs)}; predicted ratios within 15%: "
          f"{sum(e <= 0.15 for e in errors)} of {len(errors)} (worst {max(errors):.1%}).")


if __name__ == "__main__":
    main()
