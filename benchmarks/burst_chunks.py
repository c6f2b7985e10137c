"""Tokens per SSE chunk on the vLLM CPU server's bursts, measured against SimTarget's replay of the same requests.

vLLM's API server merges a lagging stream's tokens into one chunk only while engine steps have at most 128
outputs (docs/simulator.md, "One token a chunk above 128 streams"); the stored raw file of
`benchmarks/burst_costs.py` records chunks per request for every served load, so the replay's chunking can be
checked against it. The replay is `burst_costs.replay`'s (the engine core's in-process fit times the served
factor, the API server fitted over every load); run it on two checkouts to compare models.

    PYTHONPATH=. .venv/bin/python benchmarks/burst_chunks.py [--served-factor 1.56]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path


import burst_costs

RAW = Path(__file__).parent / "measured" / "burst_costs-cpu-2026-12-05.json.gz"


def replayed_tokens_per_chunk(row: dict, engine_fit: dict, api, served_factor: float) -> float:
    """`row`'s own requests served by SimTarget: output tokens over chunks, all requests together."""
    sink, _ = burst_costs.replay_records(row, engine_fit, api, served_factor)
    return sum(r.output_tokens for r in sink.records) / sum(len(r.chunk_times) for r in sink.records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, default=RAW, help="burst_costs.py's raw measurements")
    ap.add_argument("--served-factor", type=float, default=1.56, help="the served engine's factor (burst_costs.py)")
    args = ap.parse_args()
    with gzip.open(args.raw, "rt") as fh:
        raw = json.load(fh)
    engine_fit = burst_costs.fit_engine(raw["engine"])
    api, _ = burst_costs.fit_api(raw)
    groups: dict[tuple, list[dict]] = {}
    for row in raw["served"]:
        groups.setdefault((row["kind"], row["shape"], row["n"], row["concurrency"]), []).append(row)
    print("| load | tokens per chunk: measured (range) | replayed |")
    print("|---|---|---|")
    for (kind, shape, n, c), rows in groups.items():
        measured = [r["output_tokens"] / r["chunks_per_request"] for r in rows]
        replayed = replayed_tokens_per_chunk(rows[0], engine_fit, api, args.served_factor)
        label = f"{kind} {shape} n={n}" + (f" c={c}" if kind != "burst" else "")
        print(
            f"| {label} | {statistics.mean(measured):.2f} ({min(measured):.2f}-{max(measured):.2f}) | {replayed:.2f} |"
        )


if __name__ == "__main__":
    main()
