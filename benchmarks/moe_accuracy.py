"""The simulator against published real-GPU vLLM runs of mixture-of-experts models (docs/accuracy.md, MoE class).

The runs are in servelab/perf/data/published_moe.yaml (Mixtral-8x7B, gpt-oss-20b/120b and Qwen3-235B-A22B on
H100 and A100, tensor- and expert-parallel); each is replayed and scored exactly as benchmarks/gpu_accuracy.py
scores the dense runs (same replay, held-out rules, classes and floors; the specs-only tier, as a user
predicts a deployment before running it), from the model's config.json in
tests/fixtures/moe_configs. Run it from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/moe_accuracy.py [--only ID ...] [--max-prompts N]

Its residuals are not written into the intervals every simulated summary carries (those come from the dense runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import gpu_accuracy  # noqa: E402  (the sibling benchmark whose scoring this shares)

from servelab.metrics.intervals import Tier  # noqa: E402
from servelab.perf.published import PUBLISHED_MOE  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="entry ids to run")
    ap.add_argument("--max-prompts", type=int, help="replay at most N requests per run (a quick look; not the table)")
    args = ap.parse_args()
    gpu_accuracy.use_published(PUBLISHED_MOE)
    rows, skipped = gpu_accuracy.run(set(args.only) if args.only else None, args.max_prompts, Tier.SPECS_ONLY)
    print(gpu_accuracy.report(rows, skipped))


if __name__ == "__main__":
    main()
