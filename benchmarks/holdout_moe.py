"""The simulator against published mixture-of-experts runs that nothing in servelab was fitted to.

benchmarks/moe_accuracy.py scores the MoE runs of servelab/perf/data/published_moe.yaml, the runs the MoE step
price is developed against. This scores the runs of benchmarks/data/holdout_moe.yaml instead: other publishers,
other models (DeepSeek-R1/V3 with MLA, Qwen3-30B-A3B, DeepSeek-V2-Lite), other GPUs (B200, H200, H20, A800) and
SGLang as well as vLLM. It replays each on `servelab simulate`'s library path (gpu_accuracy.replay, specs only, from the
model's config.json): a vLLM run as moe_accuracy.py does, an SGLang run on SGLang's engine model (`simulate --engine
sglang`: its launch flags as published, SGLang's defaults for the chip, its scheduler). A ShareGPT run is sent as
lengths the benchmark clients' ShareGPT filter would keep (gpu_accuracy.sharegpt_stand_in). It prints one line per
run with the measured and predicted request and output throughput, mean TTFT and
mean TPOT and the signed error of each, then the median |error| per group: the V1 vLLM runs (the MoE class's own
kind), the SGLang runs, independent publishers and GPUStack's sibling blocks apart. V0-era runs are shown, not in the
medians. Its numbers are a check, never a target: a constant read off one of these runs would make it worthless.

    PYTHONPATH=. .venv/bin/python benchmarks/holdout_moe.py [--code-dir DIR ...] [--only ID ...] [--max-prompts N]

`--code-dir DIR` replays with another checkout's servelab and benchmarks/gpu_accuracy.py (a subprocess with
PYTHONPATH=DIR), the data and config.json files still read from this checkout, so several commits are scored on the
same runs in one call; give it more than once for a table per checkout and a side-by-side summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from servelab.targets.deployment import Deployment

ROOT = Path(__file__).resolve().parent.parent
HOLDOUT = ROOT / "benchmarks" / "data" / "holdout_moe.yaml"
METRICS = {
    "request_throughput": "req/s",
    "output_throughput": "out tok/s",
    "mean_ttft_ms": "TTFT ms",
    "mean_tpot_ms": "TPOT ms",
}
THROUGHPUTS = ("request_throughput", "output_throughput")
BLACKWELL = ("B200", "GB200", "B300", "RTX-PRO-6000")
GROUPS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "V1, vLLM": lambda e: e["era"] == "v1" and e["engine"] == "vllm",
    "V1, SGLang": lambda e: e["era"] == "v1" and e["engine"] == "sglang",
    "V1, independent publishers": lambda e: e["era"] == "v1" and e["relation"] == "independent",
    "V1, GPUStack sibling blocks": lambda e: e["era"] == "v1" and e["relation"] == "gpustack-sibling",
    "V1, Blackwell": lambda e: e["era"] == "v1" and e["gpu"] in BLACKWELL,
    "V1, SemiAnalysis InferenceMAX": lambda e: e["era"] == "v1" and "github.com/SemiAnalysisAI/" in e["source"]["url"],
    "V1, all": lambda e: e["era"] == "v1",
}
"""The groups the median |error| is given for (V0-era runs are in none)."""


def holdout_entries(only: set[str] | None = None) -> list[dict[str, Any]]:
    """The held-out runs, each model path made absolute so that another checkout's code reads this checkout's files."""
    entries: list[dict[str, Any]] = yaml.safe_load(HOLDOUT.read_text())
    for entry in entries:
        entry["model"] = str(ROOT / entry["model"])
    return [e for e in entries if not only or e["id"] in only]


def servelab_dir() -> Path:
    """The servelab package this process imports (PYTHONPATH decides)."""
    import servelab

    return Path(servelab.__file__).resolve().parent


def replay_all(entries: list[dict[str, Any]], max_prompts: int | None) -> list[dict[str, Any]]:
    """Each run replayed with the servelab importable here: its predicted metrics and regime, or why it was not."""
    sys.path.insert(0, str(servelab_dir().parent / "benchmarks"))
    import gpu_accuracy  # the replay and its conventions, of the checkout under test

    from servelab.perf.errors import PerfConfigError

    results = []
    for entry in entries:
        try:
            row = gpu_accuracy.replay(entry, {}, max_prompts, engine_deployment(entry))
        except PerfConfigError as refused:
            results.append({"id": entry["id"], "refused": str(refused)})
            continue
        predicted = {m: row.predicted.get(m) for m in (*METRICS, "mean_e2el_ms")}
        results.append({"id": entry["id"], "predicted": predicted, "regime": str(row.regime), "prompts": row.prompts})
    return results


def engine_deployment(entry: dict[str, Any]) -> Deployment | None:
    """An SGLang run as `simulate --engine sglang --engine-args FLAGS` builds it (its own flags, SGLang's defaults for
    the chip and its scheduler); None for a vLLM run, which gpu_accuracy builds at its stated release's defaults."""
    if entry["engine"] == "vllm":
        return None
    from servelab.targets.engine_deployment import build_engine_deployment

    return build_engine_deployment(entry["engine"], entry["gpu"], entry["model"], entry.get("engine_args") or "")


def replay_in(code_dir: Path, args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """Replay in a subprocess whose servelab is `code_dir`'s; (commit label, results)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--emit-json"]
    command += ["--only", *args.only] if args.only else []
    command += ["--max-prompts", str(args.max_prompts)] if args.max_prompts else []
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    done = subprocess.run(command, env=env, cwd=code_dir, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"replay with --code-dir {code_dir} failed:\n{done.stderr[-4000:]}")
    replayed = json.loads(done.stdout)
    if Path(replayed["servelab"]) != code_dir / "servelab":
        raise SystemExit(f"--code-dir {code_dir}: the replay imported {replayed['servelab']} instead")
    return commit_of(code_dir), replayed["results"]


def commit_of(code_dir: Path) -> str:
    """The checkout's commit, and whether its servelab/ has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=code_dir, capture_output=True, text=True, check=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--", "servelab")
        return f"{code_dir} @ {git('rev-parse', '--short', 'HEAD')}" + (" (servelab/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return f"{code_dir} (not a git checkout)"


def errors(entry: dict[str, Any], result: dict[str, Any]) -> dict[str, float]:
    """predicted / measured - 1 per metric the source gives; no throughput for an open loop served at its rate."""
    open_loop = str(entry["workload"].get("request_rate", "inf")) != "inf" and not entry["workload"].get(
        "max_concurrency"
    )
    out = {}
    for metric in METRICS:
        measured, predicted = entry["measured"].get(metric), (result.get("predicted") or {}).get(metric)
        if (
            measured
            and predicted is not None
            and not (open_loop and metric in THROUGHPUTS and "saturated" not in result["regime"])
        ):
            out[metric] = float(predicted) / measured - 1
    return out


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def run_table(entries: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> str:
    """One line per run: setup, then measured / predicted (signed error) per metric."""
    rows = []
    for e in entries:
        result = results[e["id"]]
        errs = errors(e, result)
        cells = [
            f"{_num(e['measured'].get(m))} / {_num((result.get('predicted') or {}).get(m))}"
            + (f" ({100 * errs[m]:+.0f}%)" if m in errs else "")
            for m in METRICS
        ]
        w = e["workload"]
        load = f"C={w['max_concurrency']}" if w.get("max_concurrency") else f"rate {w.get('request_rate', 'inf')}"
        setup = f"{e['engine']} {e['engine_version'] or '?'}, {e['gpu']}, {e['engine_args'] or 'defaults'}"
        status = result.get("regime") or f"refused: {result['refused']}"
        rows.append(
            [e["id"], setup, f"{w['dataset']} {w['mean_input_len']}/{w['mean_output_len']}, {load}", status, *cells]
        )
    head = ["run", "engine, GPU, flags", "workload", "regime"] + [
        f"{name} measured / predicted" for name in METRICS.values()
    ]
    return _table(head, rows)


def medians(entries: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Group -> cells 'median |error| (runs)' per metric."""
    out = {}
    for group, member in GROUPS.items():
        cells = []
        for metric in METRICS:
            errs = [err for e in entries if member(e) and (err := errors(e, results[e["id"]]).get(metric)) is not None]
            cells.append(f"{100 * statistics.median(map(abs, errs)):.1f}% ({len(errs)})" if errs else "—")
        out[group] = cells
    return out


def report(label: str, entries: list[dict[str, Any]], results: list[dict[str, Any]]) -> str:
    by_id = {r["id"]: r for r in results}
    groups = medians(entries, by_id)
    summary = _table(
        ["group", *(f"{n} median abs error (runs)" for n in METRICS.values())], [[g, *c] for g, c in groups.items()]
    )
    return f"### {label}\n\n{run_table(entries, by_id)}\n\n{summary}\n"


def side_by_side(reports: list[tuple[str, list[dict[str, Any]]]], entries: list[dict[str, Any]]) -> str:
    rows = []
    for label, results in reports:
        groups = medians(entries, {r["id"]: r for r in results})
        rows += [[label, g, *c] for g, c in groups.items() if g in ("V1, vLLM", "V1, all")]
    return "### Side by side\n\n" + _table(
        ["code", "group", *(f"{n} median abs error" for n in METRICS.values())], rows
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code-dir", type=Path, action="append", help="replay with this checkout's servelab (repeatable)")
    ap.add_argument("--only", nargs="*", help="run ids to replay")
    ap.add_argument("--max-prompts", type=int, help="replay at most N requests per run (a quick look; not the table)")
    ap.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for code_dir in args.code_dir or []:
        if not (code_dir / "servelab").is_dir() or not (code_dir / "benchmarks" / "gpu_accuracy.py").is_file():
            ap.error(f"--code-dir {code_dir}: not a servelab checkout (no servelab/ or benchmarks/gpu_accuracy.py)")
    entries = holdout_entries(set(args.only) if args.only else None)
    if args.emit_json:
        print(json.dumps({"servelab": str(servelab_dir()), "results": replay_all(entries, args.max_prompts)}))
        return
    if not args.code_dir:
        print(report(commit_of(ROOT), entries, replay_all(entries, args.max_prompts)))
        return
    reports = [replay_in(code_dir.resolve(), args) for code_dir in args.code_dir]
    print("\n".join(report(label, entries, results) for label, results in reports))
    print(side_by_side(reports, entries))


if __name__ == "__main__":
    main()
