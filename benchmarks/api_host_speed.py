"""How far the API server's host speed moves chosen published runs (docs/accuracy.md, "Where the model misses").

vLLM's serving code is measured on one host (servelab/perf/data/vllm_cpu_costs*.yaml); a GPU server's host runs it
faster or slower, which is the known uncertainty of the CPU side (docs/simulator.md, "Host speed"). This replays
each run as `benchmarks/gpu_accuracy.py` does (specs only), with the API server's costs for a host `factor` times
as slow as the measuring one (0.5: twice as fast), and prints the errors against what the run measured. Nothing is
fitted: it says how much of a miss host speed could explain.

    PYTHONPATH=. .venv/bin/python benchmarks/api_host_speed.py --only kvcached-h100-qwen3-0.6b-burst-seed42
"""

from __future__ import annotations

import argparse
import dataclasses

import yaml

import gpu_accuracy
from servelab.perf.vllm_cpu_costs import measured

FACTORS = (0.4, 0.55, 0.7, 1.0)
"""0.4: this workplace's other VM (docs/simulator.md, 2.5x cheaper); 1.0: the data file's host."""

METRICS = (("request_throughput", "req/s", "{:.1f}"), ("mean_ttft_ms", "mean TTFT ms", "{:.0f}"))
METRICS += (("mean_tpot_ms", "mean TPOT ms", "{:.2f}"),)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", required=True, help="entry ids of published.yaml")
    ap.add_argument("--factors", type=float, nargs="+", default=FACTORS, help="API server host speed factors")
    args = ap.parse_args()
    chosen = [e for e in gpu_accuracy.entries() if e["id"] in args.only]
    if missing := set(args.only) - {e["id"] for e in chosen}:
        raise SystemExit(f"--only: no such entry: {', '.join(sorted(missing))}")
    published = yaml.safe_load(gpu_accuracy.LENGTHS.read_text())
    print("| run | API host factor | " + " | ".join(label for _, label, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for entry in chosen:
        deployment = gpu_accuracy.specs_deployment(entry)
        version = gpu_accuracy.stated_version(str(entry.get("vllm_version", "")))
        costs = measured(tuple(map(int, version.split("."))) if version else None)
        for factor in args.factors:
            replayed = gpu_accuracy.replay(
                entry, published, None, dataclasses.replace(deployment, api=costs.api_server(factor))
            )
            cells = []
            for key, _, fmt in METRICS:
                got, real = replayed.predicted[key], entry["measured"].get(key)
                cells.append(fmt.format(got) + (f" ({got / real - 1:+.0%})" if real else ""))
            print(f"| {entry['id']} | {factor} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
