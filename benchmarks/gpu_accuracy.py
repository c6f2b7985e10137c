"""The simulator against published real-GPU vLLM runs (servelab/perf/data/published.yaml).

Each run is replayed the way a user would replay it with `servelab simulate`:
the same `--gpu/--model/--engine-args` (plus `--no-async-scheduling` for
engines older than 0.14, which ran the synchronous loop by default; vLLM's defaults for everything the
source leaves at default, the default cost model, no calibration) and the
same workload flags through the same library path (`build_plan` ->
`Deployment.sim_target().run` -> `summarize`):

- `random`: `--dataset-name random` with the published lengths (fixed, or
  uniform within `range_ratio`);
- `prefix`: `--dataset-name prefix --prefix-len P --num-prefixes G` with the
  rest of the published mean prompt as each request's own tokens;
- `sharegpt`: no ShareGPT file ships here, so `--dataset-name random
  --length-distribution lognormal --random-range-ratio 1` with the published
  means;
- `prompt_pool` (inference-perf's shared-prefix load): that many prompts made once, with the
  prefix groups above, resent whole in one fixed cycle;
- where the source published every request's lengths (published_lengths.yaml),
  those requests as they are (a JSONL dataset of token ids), a resent prompt
  with the same tokens;
- arrival: `--request-rate` (inf, or req/s with `--burstiness`) and
  `--max-concurrency`, `--num-prompts` as published.

Errors are predicted / measured - 1 per metric; the summary gives, per metric,
the number of runs, MAPE, median |error| and the signed mean (MPE), in the
form of inference-sim's sim-to-real study, for V1-era and V0-era runs
separately. Runs whose GPU the source does not name, and runs an entry marks
`in_summary: false` (a flag the simulator does not model), are shown but left
out of the summary. Prints Markdown (docs/accuracy.md); deterministic.

    .venv/bin/python benchmarks/gpu_accuracy.py [--only ID ...] [--max-prompts N]
"""

from __future__ import annotations

import argparse
import statistics
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.perf.published import LENGTHS, published_entries
from servelab.targets.deployment import build_deployment
from servelab.workload.arrival import ArrivalConfig, schedule
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan, RequestSpec

REPLAYED_DATASETS = ("random", "prefix", "sharegpt")

METRICS = (
    "request_throughput", "output_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms",
    "mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms",
)
SHORT = {m: m.replace("_ms", "").replace("request_throughput", "req/s").replace("output_throughput", "out tok/s")
         .replace("median_", "p50_") for m in METRICS}
FLOORS = {"request_throughput": 0.15, "mean_ttft_ms": 0.25, "mean_tpot_ms": 0.10}
"""Issue 11's floors on the V1 table's median |error|."""


def not_replayable(entry: dict[str, Any]) -> str | None:
    """Why the entry cannot be replayed, or None."""
    w = entry["workload"]
    if entry.get("lengths"):
        return None
    if w["dataset"] not in REPLAYED_DATASETS or not (w.get("mean_input_len") and w.get("mean_output_len")):
        return "the source gives no request lengths"
    return None


def _plan(entry: dict[str, Any], published: dict[str, Any], vocab: int, max_prompts: int | None) -> LoadPlan:
    """The entry's load, built as `servelab simulate`'s flags would build it."""
    w = entry["workload"]
    n = min(w["num_prompts"], max_prompts or w["num_prompts"])
    rate = float(w.get("request_rate", "inf"))
    arrival = ArrivalConfig(request_rate=rate, burstiness=float(w.get("burstiness", 1.0)),
                            max_concurrency=w.get("max_concurrency"))
    if entry.get("lengths"):
        # The source's own per-request lengths, all released at t=0 (its request rate is inf); a request
        # that resent an earlier prompt sends that prompt's tokens again, as a JSONL dataset of token ids would.
        lens = published[entry["lengths"]]
        same = lens.get("same_prompt_as") or range(len(lens["input_lens"]))
        rng = np.random.default_rng(0)
        prompts: dict[int, np.ndarray] = {}
        specs = [RequestSpec(i, prompts.setdefault(s, rng.integers(0, vocab, p, dtype=np.int32)), max(1, o), 0.0)
                 for i, (p, o, s) in enumerate(zip(lens["input_lens"][:n], lens["output_lens"][:n], same))]
        return LoadPlan(specs, max_concurrency=arrival.max_concurrency)
    inp, out = round(w["mean_input_len"]), round(w["mean_output_len"])
    if w.get("prompt_pool"):
        return LoadPlan(schedule(_pooled_prompts(w, inp, out, vocab, n), arrival, np.random.default_rng(1), count=n))
    if w["dataset"] == "prefix":
        workload = WorkloadConfig("prefix", input_len=inp - w["prefix_len"], output_len=out, length_distribution="fixed",
                                  prefix_len=w["prefix_len"], num_prefixes=w["num_prefixes"])
    elif w["dataset"] == "sharegpt":
        workload = WorkloadConfig("random", input_len=inp, output_len=out, length_distribution="lognormal", range_ratio=1.0)
    else:
        workload = WorkloadConfig("random", input_len=inp, output_len=out, range_ratio=float(w.get("range_ratio", 0.0)))
    return build_plan(workload, arrival, Amount(num_prompts=n))


def _pooled_prompts(w: dict[str, Any], inp: int, out: int, vocab: int, n: int) -> Iterator[RequestSpec]:
    """inference-perf's shared-prefix load: `prompt_pool` prompts made once (num_prefixes groups, each prompt its
    group's prefix_len tokens then its own), sent in one fixed shuffled cycle, so later requests resend earlier
    prompts whole and vLLM's prefix cache holds them (SharedPrefixDataGenerator, see published.yaml)."""
    rng = np.random.default_rng(0)
    groups, pool, prefix_len = w["num_prefixes"], w["prompt_pool"], w["prefix_len"]
    prefixes = [rng.integers(0, vocab, prefix_len, dtype=np.int32) for _ in range(groups)]
    prompts = [np.concatenate([prefixes[g % groups], rng.integers(0, vocab, inp - prefix_len, dtype=np.int32)])
               for g in range(pool)]
    order = rng.permutation(pool)
    for i in range(n):
        k = int(order[i % pool])
        yield RequestSpec(i, prompts[k], out, prefix_group=k % groups, prefix_len=prefix_len)


@dataclass(frozen=True)
class Replay:
    entry: dict[str, Any]
    predicted: dict[str, Any]
    prompts: int
    """Requests replayed (the source's num_prompts unless --max-prompts cut it)."""
    seconds: float
    """Wall time of the replay, for the benchmark's own cost."""

    @property
    def in_summary(self) -> bool:
        """False for a run whose GPU the source leaves out, or one the entry keeps out (`in_summary: false`)."""
        return bool(self.entry.get("gpu_stated", True) and self.entry.get("in_summary", True))

    def error(self, metric: str) -> float | None:
        measured = self.entry["measured"].get(metric)
        predicted = self.predicted.get(metric)
        if not measured or predicted is None:
            return None
        return float(predicted) / measured - 1


def stated_version(text: str) -> str | None:
    """The vLLM release a source states ("0.15.1"; "main, May 2025 (~0.9)" is 0.9); None: not stated.

    The replay runs that release's defaults and CPU costs (perf/vllm_versions.py,
    perf/vllm_cpu_costs.py); a run whose version is not stated keeps the modelled release's.
    A V0-era run (before 0.8, its own table) is replayed as the earliest V1 release, 0.8.
    """
    found = re.search(r"(\d+)\.(\d+)", text)
    if not found:
        return None
    return f"{found[1]}.{found[2]}" if (int(found[1]), int(found[2])) >= (0, 8) else "0.8"


def replay(entry: dict[str, Any], published: dict[str, Any], max_prompts: int | None = None) -> Replay:
    version = stated_version(str(entry.get("vllm_version", "")))
    deployment = build_deployment(entry["gpu"], entry["model"], entry.get("engine_args") or "", vllm_version=version)
    plan = _plan(entry, published, deployment.model.vocab_size, max_prompts)
    start = time.perf_counter()
    sink = MemorySink()
    deployment.sim_target().run(plan, sink)
    summary = summarize(sink.records)
    return Replay(entry, summary, int(summary["completed"]), time.perf_counter() - start)


def run(only: set[str] | None = None, max_prompts: int | None = None) -> tuple[list[Replay], list[tuple[dict[str, Any], str]]]:
    """Every selected entry replayed, and those that cannot be, with the reason."""
    published = yaml.safe_load(LENGTHS.read_text())
    done, skipped = [], []
    for entry in published_entries():
        if only and entry["id"] not in only:
            continue
        reason = not_replayable(entry)
        if reason:
            skipped.append((entry, reason))
        else:
            done.append(replay(entry, published, max_prompts))
    return done, skipped


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _load(entry: dict[str, Any]) -> str:
    w = entry["workload"]
    if w.get("max_concurrency"):
        load = f"C={w['max_concurrency']}"
    elif str(w.get("request_rate", "inf")) == "inf":
        load = "burst (rate inf)"
    else:
        kind = "Poisson" if float(w.get("burstiness", 1)) == 1 else "constant"
        load = f"{kind} {w['request_rate']:g}/s"
    return f"{w['dataset']} {w.get('mean_input_len')}/{w.get('mean_output_len')}, {load}, n={w.get('num_prompts')}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def per_run_table(rows: list[Replay]) -> str:
    """One line per run: setup, then measured / predicted (error) for every metric the source gives."""
    lines = []
    for r in rows:
        cells = [f"{SHORT[m]} {_num(r.entry['measured'][m])} / {_num(float(r.predicted[m]))} ({_pct(r.error(m))})"
                 for m in METRICS if r.entry["measured"].get(m) is not None and m in r.predicted]
        gpu = r.entry["gpu"] + ("" if r.entry.get("gpu_stated", True) else " (assumed)") \
            + ("" if r.entry.get("in_summary", True) else " (not in summary)")
        tp = r.entry.get("engine_args", "").split("--tensor-parallel-size ")[1].split()[0] \
            if "--tensor-parallel-size" in (r.entry.get("engine_args") or "") else "1"
        lines.append([r.entry["id"], gpu, f"{r.entry['model']} TP{tp}", str(r.entry["vllm_version"]), _load(r.entry),
                      "<br>".join(cells)])
    return _table(["run", "GPU", "model", "vLLM", "workload", "measured / predicted (error)"], lines)


def summary_rows(rows: list[Replay]) -> list[tuple[str, int, float, float, float]]:
    """(metric, runs, MAPE, median |error|, MPE) over the runs in the summary, for metrics any run gives."""
    out = []
    for m in METRICS:
        errs = [e for r in rows if r.in_summary and (e := r.error(m)) is not None]
        if errs:
            out.append((m, len(errs), statistics.fmean(map(abs, errs)), statistics.median(map(abs, errs)),
                        statistics.fmean(errs)))
    return out


def summary_table(rows: list[Replay]) -> str:
    lines = [[SHORT[m], str(n), f"{100 * mape:.1f}%", f"{100 * med:.1f}%", f"{100 * mpe:+.1f}%"]
             for m, n, mape, med, mpe in summary_rows(rows)]
    return _table(["metric", "runs", "MAPE", "median abs error", "MPE (signed)"], lines)


BLIS_COLUMNS = ("mean_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "p90_tpot_ms", "p99_tpot_ms")
"""inference-sim's sim-to-real columns (experiment/report.py _METRIC_COLS), TPOT in place of its ITL."""


def blis_table(rows: list[Replay], label: str) -> str:
    """One row of MAPE per column, in the layout of inference-sim's aggregate table, so the two can sit side by side."""
    mape = {m: (v, n) for m, n, v, _, _ in summary_rows(rows)}
    cells = [f"{100 * mape[m][0]:.1f} (n={mape[m][1]})" if m in mape else "N/A" for m in BLIS_COLUMNS]
    head = ["Simulator", *(m.replace("_ms", "").replace("e2el", "e2e") for m in BLIS_COLUMNS)]
    return _table(head, [[label, *cells]])


def floors(rows: list[Replay]) -> str:
    med = {m: v for m, _, _, v, _ in summary_rows(rows)}
    parts = [f"{SHORT[m]} {100 * med[m]:.1f}% (floor {100 * f:.0f}%: {'met' if med[m] <= f else 'missed'})"
             if m in med else f"{SHORT[m]}: no run gives it" for m, f in FLOORS.items()]
    return "Issue 11's floors on median |error|: " + "; ".join(parts)


def _commit() -> str:
    """The commit the simulator ran at, and whether servelab/ had uncommitted changes (then the table is not that commit's)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    try:
        dirty = git("status", "--porcelain", "--", "servelab")
        return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes to servelab/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def report(rows: list[Replay], skipped: list[tuple[dict[str, Any], str]]) -> str:
    parts = [(f"servelab commit {_commit()}; {sum(r.prompts for r in rows):,} requests replayed in "
              f"{sum(r.seconds for r in rows):.0f} s.")]
    for era, title in (("v1", "V1 engine (vLLM >= 0.8)"), ("v0", "V0-era engines (vLLM < 0.8)")):
        group = [r for r in rows if r.entry["era"] == era]
        if not group:
            continue
        parts += [f"### {title}: summary ({sum(r.in_summary for r in group)} runs)", summary_table(group)]
        if any(m in BLIS_COLUMNS for m, *_ in summary_rows(group)):
            parts += ["MAPE (%) in inference-sim's column layout:", blis_table(group, "servelab")]
        if era == "v1":
            parts.append(floors(group))
        parts += [f"### {title}: per run", per_run_table(group)]
    parts += [f"not replayed: {e['id']} ({why})" for e, why in skipped]
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="entry ids to run")
    ap.add_argument("--max-prompts", type=int, help="replay at most N requests per run (a quick look; not the table)")
    args = ap.parse_args()
    rows, skipped = run(set(args.only) if args.only else None, args.max_prompts)
    print(report(rows, skipped))


if __name__ == "__main__":
    main()
