"""The simulator against published vLLM measurements (servelab/perf/data/published.yaml).

Each entry is replayed on the simulator with the same GPU, model, engine flags,
number of prompts and load (request rate inf, or a concurrency cap): with the
source's own per-request lengths where it published them (published_lengths.yaml),
fixed lengths for a `random` dataset, and otherwise a ShareGPT-like spread (a
lognormal, sigma 1, with the published means, within benchmark_serving's
ShareGPT filter: prompt <= 1024, prompt + output <= 2048). Prints predicted vs
published throughput with the % error; `--markdown` prints the table for
docs/validation.md.

    .venv/bin/python benchmarks/published_validation.py [--markdown] [--only ID ...]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.perf.published import PUBLISHED, published_entries
from servelab.targets.deployment import build_deployment
from servelab.workload.spec import LoadPlan, RequestSpec

LENGTHS = PUBLISHED.with_name("published_lengths.yaml")
TOLERANCE = 0.25
SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 1024, 2048


@dataclass(frozen=True)
class Comparison:
    entry: dict[str, Any]
    lengths: str
    """Where the request lengths came from: 'published', 'fixed' or 'sharegpt-like'."""
    predicted: dict[str, float]

    def error(self, metric: str) -> float | None:
        measured = self.entry["measured"].get(metric)
        if measured is None or metric not in self.predicted:
            return None
        return self.predicted[metric] / measured - 1


def request_lengths(entry: dict[str, Any], published: dict[str, Any], seed: int = 0) -> tuple[list[int], list[int], str] | None:
    """(prompt lengths, output lengths, their origin) for the entry's prompts, or None when the source gives too little."""
    workload = entry["workload"]
    if entry.get("lengths"):
        lens = published[entry["lengths"]]
        return list(lens["input_lens"]), [max(1, n) for n in lens["output_lens"]], "published"
    n, prompt, output = workload.get("num_prompts"), workload.get("mean_input_len"), workload.get("mean_output_len")
    if not (n and prompt and output):
        return None
    if workload["dataset"] == "random":
        return [round(prompt)] * n, [round(output)] * n, "fixed"
    rng = np.random.default_rng(seed)
    sigma = 1.0
    draw = lambda mean: rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)  # noqa: E731
    prompts = np.clip(np.rint(draw(prompt)), 4, SHAREGPT_MAX_PROMPT).astype(int)
    outputs = np.clip(np.rint(draw(output)), 1, SHAREGPT_MAX_TOTAL - prompts).astype(int)
    return prompts.tolist(), outputs.tolist(), "sharegpt-like"


def simulate(entry: dict[str, Any], prompts: list[int], outputs: list[int], seed: int = 0) -> dict[str, float]:
    deployment = build_deployment(entry["gpu"], entry["model"], entry.get("engine_args") or "")
    rng = np.random.default_rng(seed)
    specs = [
        RequestSpec(i, rng.integers(0, deployment.model.vocab_size, p, dtype=np.int32), o, 0.0)
        for i, (p, o) in enumerate(zip(prompts, outputs))
    ]
    workload = entry["workload"]
    rate = workload.get("request_rate", "inf")
    if rate not in ("inf", None, float("inf")):
        raise ValueError(f"{entry['id']}: only request_rate inf is replayed, got {rate!r}")
    sink = MemorySink()
    deployment.sim_target().run(LoadPlan(specs, max_concurrency=workload.get("max_concurrency")), sink)
    s = summarize(sink.records)
    return {key: s[key] for key in ("request_throughput", "output_throughput", "median_tpot_ms", "completed")}


def compare(only: set[str] | None = None) -> tuple[list[Comparison], list[dict[str, Any]]]:
    """Every entry that can be replayed, and those that cannot (lengths unknown)."""
    published = yaml.safe_load(LENGTHS.read_text())
    done, skipped = [], []
    for entry in published_entries():
        if only and entry["id"] not in only:
            continue
        lengths = request_lengths(entry, published)
        if lengths is None:
            skipped.append(entry)
            continue
        prompts, outputs, origin = lengths
        done.append(Comparison(entry, origin, simulate(entry, prompts, outputs)))
    return done, skipped


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def _load(entry: dict[str, Any]) -> str:
    w = entry["workload"]
    load = f"C={w['max_concurrency']}" if w.get("max_concurrency") else "rate inf"
    return f"{w['dataset']} {w.get('mean_input_len')}/{w.get('mean_output_len')}, {load}, {w.get('num_prompts')} prompts"


def table(rows: list[Comparison], markdown: bool) -> str:
    head = ["id", "GPU", "load", "lengths", "measured out tok/s", "predicted", "error", "measured req/s", "predicted", "error",
            "median TPOT ms meas/pred"]
    lines = []
    for c in rows:
        m, p = c.entry["measured"], c.predicted
        tpot = f"{m['median_tpot_ms']:.1f} / {p['median_tpot_ms']:.1f}" if m.get("median_tpot_ms") else f"— / {p['median_tpot_ms']:.1f}"
        req = m.get("request_throughput")
        lines.append([
            c.entry["id"], c.entry["gpu"], _load(c.entry), c.lengths,
            f"{m['output_throughput']:,.0f}", f"{p['output_throughput']:,.0f}", _pct(c.error("output_throughput")),
            "—" if req is None else f"{req:.2f}", f"{p['request_throughput']:.2f}", _pct(c.error("request_throughput")), tpot,
        ])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(row) + " |" for row in lines]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
    return "\n".join([fmt(head), *(fmt(row) for row in lines)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/validation.md)")
    ap.add_argument("--only", nargs="*", help="entry ids to run")
    args = ap.parse_args()
    rows, skipped = compare(set(args.only) if args.only else None)
    print(table(rows, args.markdown))
    errors = [c.error("output_throughput") for c in rows]
    within = sum(1 for e in errors if e is not None and abs(e) <= TOLERANCE)
    print(f"\n{within} of {len(rows)} within ±{100 * TOLERANCE:.0f}% on output throughput")
    for entry in skipped:
        print(f"not replayed: {entry['id']} (the source gives no request lengths)")


if __name__ == "__main__":
    main()
