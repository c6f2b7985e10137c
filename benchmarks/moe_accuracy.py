"""The simulator against published real-GPU vLLM runs of mixture-of-experts models (docs/accuracy.md, MoE class).

The runs are in servelab/perf/data/published_moe.yaml (Mixtral-8x7B, gpt-oss-20b/120b and Qwen3-235B-A22B on
H100 and A100, tensor- and expert-parallel); each is replayed and scored exactly as benchmarks/gpu_accuracy.py
scores the dense runs (same replay, held-out rules, classes, floors and tiers: specs only, as a user predicts a
deployment before running it, and calibrated from one other run of the same source and GPU, as `calibrate --from`
a user's own benchmark grounds it), from the model's config.json in tests/fixtures/moe_configs. Run it from the
repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/moe_accuracy.py [--only ID ...] [--max-prompts N]

Its residuals are not written into the intervals every simulated summary carries (those come from the dense runs).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import gpu_accuracy  # noqa: E402  (the sibling benchmark whose scoring this shares)

from servelab.metrics.intervals import Tier  # noqa: E402
from servelab.perf.published import PUBLISHED_MOE  # noqa: E402


GROUP_METRICS = (("req/s", "request_throughput"), ("mean TTFT", "mean_ttft_ms"), ("mean TPOT", "mean_tpot_ms"))


def workload_kind(entry: dict[str, Any]) -> str:
    """The load a run belongs to for the group table: ShareGPT, short (128-token) or long (2K-32K) random prompts."""
    w = entry["workload"]
    if w["dataset"] != "random":
        return f"{w['dataset']} {'burst' if str(w.get('request_rate')) == 'inf' else 'open loop'}"
    return (
        "random 128 burst" if w.get("client_counted_input_len", w["mean_input_len"]) < 1000 else "random 2K-32K burst"
    )


def group_table(rows: list[gpu_accuracy.Replay]) -> str:
    """Median signed error per model, GPU and workload kind: where the misses sit."""
    groups: dict[tuple[str, str, str], list[gpu_accuracy.Replay]] = defaultdict(list)
    for r in rows:
        if r.scored:
            groups[(Path(r.entry["model"]).name, r.entry["gpu"], workload_kind(r.entry))].append(r)
    lines = ["| model | GPU | workload | runs | " + " | ".join(name for name, _ in GROUP_METRICS) + " |"]
    lines.append("|---|---|---|---:|" + "---:|" * len(GROUP_METRICS))
    for (model, gpu, kind), group in sorted(groups.items()):
        cells = []
        for _, metric in GROUP_METRICS:
            errors = [e for r in group if (e := r.scored_error(metric)) is not None]
            cells.append(f"{np.median(errors):+.0%}" if errors else "(offered rate)")
        lines.append(f"| {model} | {gpu} | {kind} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="entry ids to run")
    ap.add_argument("--max-prompts", type=int, help="replay at most N requests per run (a quick look; not the table)")
    args = ap.parse_args()
    gpu_accuracy.use_published(PUBLISHED_MOE)
    rows, skipped = gpu_accuracy.run_tiers(set(args.only) if args.only else None, args.max_prompts)
    print(gpu_accuracy.report(rows, skipped))
    print("\n### Median signed error by model, GPU and workload (specs only, scored runs)\n")
    print(group_table([row for row in rows if row.tier == Tier.SPECS_ONLY]))


if __name__ == "__main__":
    main()
