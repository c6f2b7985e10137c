"""`calibrate --from` on the real vLLM CPU server: calibrate from one measured run, predict the others.

A benchmark, not a test: its figures depend on what else the host runs, so
it takes the machine-wide heavy-run lock and prints the host's load beside
them. It starts the tiny model's vLLM CPU server, measures a few runs of
different shapes with `servelab bench` and one with the vLLM venv's own
`vllm bench serve --save-result`, then for each run in turn: calibrates from
that run alone (servelab.calibrate.calibrate_from.fit_from_runs) and
predicts every other run, specs-only and calibrated. It prints the median
|error| per metric for both (the table in docs/validation.md).

    .venv/bin/python benchmarks/calibrate_from_accuracy.py [--out DIR] [--reuse]

Needs the vLLM venv and the tiny model that scripts/test builds ($SERVELAB_VLLM_PYTHON, $SERVELAB_TINY_MODEL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from servelab.calibrate.calibrate_from import fit_from_runs, simulated
from servelab.targets.profile import profile_deployment
from servelab.metrics.host import HostWatch
from servelab.metrics.imports import MeasuredRun, read_measured_runs
from servelab.targets.deployment import build_deployment
from servelab.targets.server_process import vllm_cpu_server

from heavy_run import TINY_MODEL, VLLM_PYTHON, heavy_lock

SERVER_ARGS = ("--max-model-len", "4096", "--max-num-seqs", "32")
ENGINE_ARGS = (
    "--max-model-len 4096 --max-num-seqs 32 --block-size 128 --kv-cache-memory-bytes 1073741824 --enforce-eager"
)
"""The server's flags as the simulator reads them: the CPU backend's 128-token blocks, its 1 GiB KV space, and no
CUDA graphs (every step's ops are dispatched one by one from Python, as `--enforce-eager` runs a GPU)."""
BENCH_RUNS = {
    "closed-c4-p128-o64": (
        "--max-concurrency",
        "4",
        "--num-prompts",
        "32",
        "--random-input-len",
        "128",
        "--random-output-len",
        "64",
    ),
    "burst-n48-p256-o32": ("--num-prompts", "48", "--random-input-len", "256", "--random-output-len", "32"),
    "poisson-r4-p512-o48": (
        "--request-rate",
        "4",
        "--num-prompts",
        "40",
        "--random-input-len",
        "512",
        "--random-output-len",
        "48",
    ),
    "closed-c16-p64-o96": (
        "--max-concurrency",
        "16",
        "--num-prompts",
        "48",
        "--random-input-len",
        "64",
        "--random-output-len",
        "96",
    ),
}
VLLM_BENCH = (
    "--dataset-name",
    "random",
    "--random-input-len",
    "192",
    "--random-output-len",
    "48",
    "--num-prompts",
    "32",
    "--max-concurrency",
    "8",
    "--ignore-eos",
    "--seed",
    "3",
)
METRICS = ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; parser = FlexibleArgumentParser(); "
    "add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)
"""What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), called as the vLLM venv's python: that
venv's `vllm` script stops at its version lookup, as the CPU build is installed without package metadata."""


def servelab_bench(base_url: str, directory: Path, args: tuple[str, ...]) -> None:
    cmd = [
        sys.executable,
        "-c",
        "from servelab.cli import main; main()",
        "bench",
        "--base-url",
        base_url,
        "--model",
        "tiny-qwen",
        "--ignore-eos",
        "--result-dir",
        str(directory),
        *args,
    ]
    subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL)


def vllm_bench_serve(base_url: str, directory: Path, detailed: bool = True) -> Path:
    """`vllm bench serve --save-result` from the vLLM venv against the server; the JSON it wrote."""
    name = "vllm-bench.json"
    cmd = [
        str(VLLM_PYTHON),
        "-c",
        VLLM_BENCH_SERVE,
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--model",
        "tiny-qwen",
        "--tokenizer",
        str(TINY_MODEL),
        *VLLM_BENCH,
        "--save-result",
        "--result-dir",
        str(directory),
        "--result-filename",
        name,
        *(["--save-detailed"] if detailed else []),
    ]
    subprocess.run(
        cmd, check=True, timeout=600, stdout=subprocess.DEVNULL, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    )
    return directory / name


def measure(out: Path) -> dict[str, MeasuredRun]:
    process = vllm_cpu_server(
        VLLM_PYTHON,
        TINY_MODEL,
        log_path=out / "vllm.log",
        served_model_name="tiny-qwen",
        kv_cache_gib=1,
        extra_args=SERVER_ARGS,
        startup_timeout=600,
    )
    runs: dict[str, MeasuredRun] = {}
    with process:
        base_url = process.base_url
        servelab_bench(base_url, out / "warmup", ("--num-prompts", "8", "--max-concurrency", "4"))
        for name, args in BENCH_RUNS.items():
            servelab_bench(base_url, out / name, args)
            runs[name] = read_measured_runs(out / name)[0]
        runs["vllm-bench-c8-p192-o48"] = read_measured_runs(vllm_bench_serve(base_url, out))[0]
    return runs


def errors(predicted: dict[str, float | None], run: MeasuredRun) -> dict[str, float | None]:
    return {
        k: None
        if (p := predicted.get(k)) is None or not run.measured.get(k)
        else 100 * (p - run.measured[k]) / run.measured[k]
        for k in METRICS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs and profiles here (default: a temp dir).")
    parser.add_argument("--reuse", action="store_true", help="Fit to the runs already in --out instead of measuring.")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="calibrate-from-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        runs = {name: read_measured_runs(out / name)[0] for name in BENCH_RUNS}
        runs["vllm-bench-c8-p192-o48"] = read_measured_runs(out / "vllm-bench.json")[0]
        conditions: dict[str, object] = {"reused": str(out)}
    else:
        with heavy_lock():
            host = HostWatch().start()
            runs = measure(out)
            conditions = host.conditions(gpus=False)
    specs = build_deployment("cpu", TINY_MODEL, ENGINE_ARGS)
    spec_errors = {name: errors(simulated(specs, run), run) for name, run in runs.items()}
    rows = []
    for source, run in runs.items():
        profile = fit_from_runs([run], specs, engine_args=ENGINE_ARGS)
        profile.save(out / f"profile-from-{source}.json")
        env = profile.environment
        assert env is not None
        fitted = profile_deployment(profile)
        for name, other in runs.items():
            if name != source:
                rows.append((source, name, spec_errors[name], errors(simulated(fitted, other), other)))
        print(
            f"from {source}: compute x{env.compute_scale:.2f}, memory x{env.memory_scale:.2f}, engine CPU "
            f"x{env.engine_cpu_factor:.2f}, "
            f"API CPU x{env.api_cpu_factor:.2f}, "
            f"outside {1e3 * env.outside_engine_s:.1f} ms; unconstrained: {', '.join(env.unconstrained) or 'none'}"
        )
    print("\n| calibrated from | predicted run | " + " | ".join(f"{m} specs-only / calibrated" for m in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for source, name, before, after in rows:
        cells = [f"{_pct(before[m])} / {_pct(after[m])}" for m in METRICS]
        print(f"| {source} | {name} | " + " | ".join(cells) + " |")
    print("\nmedian |error| over every (calibrated-from, predicted) pair:")
    for m in METRICS:
        b = [abs(e) for *_, before, _ in rows if (e := before[m]) is not None]
        a = [abs(e) for *_, after in rows if (e := after[m]) is not None]
        print(f"  {m}: specs-only {statistics.median(b):.1f}%, calibrated from one run {statistics.median(a):.1f}%")
    print("\nleave one out: calibrated from every other run, predicting the one left out")
    print(
        "\n| predicted run | " + " | ".join(f"{m} specs-only / calibrated" for m in METRICS) + " | fitted environment |"
    )
    print("|---|" + "---|" * (len(METRICS) + 1))
    left_out = []
    for name, run in runs.items():
        profile = fit_from_runs([r for n, r in runs.items() if n != name], specs, engine_args=ENGINE_ARGS)
        env = profile.environment
        assert env is not None
        after = errors(simulated(profile_deployment(profile), run), run)
        left_out.append((spec_errors[name], after))
        cells = [f"{_pct(spec_errors[name][m])} / {_pct(after[m])}" for m in METRICS]
        print(
            f"| {name} | "
            + " | ".join(cells)
            + f" | engine CPU x{env.engine_cpu_factor:.2f}, API CPU x{env.api_cpu_factor:.2f}, "
            f"outside {1e3 * env.outside_engine_s:.1f} ms |"
        )
    for m in METRICS:
        b_ = [abs(e) for before, _ in left_out if (e := before[m]) is not None]
        a_ = [abs(e) for _, after in left_out if (e := after[m]) is not None]
        print(
            f"  {m}: specs-only {statistics.median(b_):.1f}%, calibrated from the other runs "
            f"{statistics.median(a_):.1f}%"
        )
    print(f"\nhost during the runs: {json.dumps(conditions)}\nruns and profiles in {out}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f}%"


if __name__ == "__main__":
    main()
