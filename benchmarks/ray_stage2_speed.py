"""Stage 2 of `tune` on a two-node Ray cluster against the same stage 2 one trial after another (docs/cluster.md).

The study is tests/test_cluster.py's three-servers one: the tiny Qwen2 on the
real vLLM CPU server, `--max-model-len 4096 --max-num-seqs 2` as the baseline,
space max_num_seqs=2,8,32, top-k 2, so stage 2 measures three candidates
(max_num_seqs 2, 8, 32), each on its own server. `servelab.tune.run` runs it twice:
without a pool (as `servelab tune` runs without --ray-address) and with the
Ray pool on a local two-node cluster (`ray.cluster_utils.Cluster`, trial GPUs
2 + 1 as the custom resource `trial_gpu`, so all three trials fit at once).

Each trial's bench workload is open loop: 40 requests (256 prompt tokens, 32
output tokens) at 2 req/s Poisson, a rate the tiny server keeps up with even
while sharing the host, so a trial's measurement lasts about as long as its
arrival schedule (last arrival at 24.6 s) whatever else runs: the comparison
measures the orchestration (servers starting, measuring and stopping side by
side instead of in turn), not how fast the server computes. The score is
tune's goodput (requests/s within TTFT 500 ms), which the schedule also
bounds: the three candidates score within a fraction of a percent, so the
printed score spread says how much their order can be trusted.

What bounds the speed-up on 2 cores: a vLLM server's start-up (imports,
model load, compile, warm-up; ~30 s here) is CPU-bound and keeps both cores
busy, so three starting at once take about as long as three in turn; only the
measurements overlap. The parallel stage 2 then lasts about the sum of the
start-ups plus one measurement, against the sum of both sequentially:
(3S + 3B) / (3S + B) ~ 1.45x for S ~ 29 s, B ~ 25 s. The 3x of k+1 = 3 trials
needs each trial's own CPUs (a node each, as on a real cluster).

Stage 2's wall time runs from the first trial's start (`on_server_start`) to
`servelab.tune.run`'s return; stage 1 (three simulations) and the cluster's start-up are
outside it. Needs Ray (`servelab[ray]`) and the vLLM CPU build:

    flock /tmp/servelab-heavy.lock timeout 1500 env PYTHONPATH=. .venv/bin/python benchmarks/ray_stage2_speed.py \\
        [--vllm-python $SERVELAB_VLLM_PYTHON] [--model $SERVELAB_TINY_MODEL] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servelab.metrics.slo import SLO
from servelab.pool import TaskPool
from servelab.targets.deployment import build_deployment
from servelab.schemas.tune import BASELINE
from servelab.tune.confirm import ServerCommand, Stage2Config
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace
from servelab.tune.study import SearchSettings
from servelab.tune.tuner import TuneProgress, TuneRequest, run
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

LINE = "--max-model-len 4096 --max-num-seqs 2"
SIM_ARGS = "--block-size 128 --kv-cache-memory-bytes 1G"
SPACE = ["max_num_seqs=2,8,32"]
TRIAL_GPU = "trial_gpu"
RATE = 2.0
PROMPTS = 40
TIE = 0.05
"""Two candidates whose goodputs are within 5% of each other are tied: their order is the runs' noise."""


def request(model: Path, vllm_python: Path, output: Path, pool: TaskPool | None, rate: float = RATE) -> TuneRequest:
    """The study both runs share; only `pool` differs."""
    workload = WorkloadConfig(input_len=256, output_len=32)
    server = ServerCommand(
        f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {model} "
        "--served-model-name tiny-qwen {engine_args}",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout=900,
    )
    return TuneRequest(
        simulated=build_deployment("cpu", model, f"{LINE} {SIM_ARGS}"),
        launch=build_deployment("cpu", model, LINE),
        sim_args=SIM_ARGS,
        space=SearchSpace.from_items(SPACE),
        objective=Objective("goodput", SLO.parse("ttft:500")),
        sim_workload=TuneWorkload(workload, ArrivalConfig(max_concurrency=32), Amount(num_prompts=120)),
        bench_workload=TuneWorkload(workload, ArrivalConfig(request_rate=rate), Amount(num_prompts=PROMPTS)),
        search=SearchSettings(n_trials=100, sampler="grid"),
        output=output,
        server=server,
        top_k=2,
        pool=pool,
        gpu_resource=TRIAL_GPU,
    )


def stage2(req: TuneRequest) -> tuple[float, list[dict[str, Any]]]:
    """Run the study; returns stage 2's wall time and its results (tune.json's `stage2.results`)."""
    began: list[float] = []

    def first_start(_: Stage2Config) -> None:
        if not began:
            began.append(time.perf_counter())

    doc = run(req, TuneProgress(on_server_start=first_start)).model_dump(mode="json")
    results: list[dict[str, Any]] = doc["stage2"]["results"]
    failed = [f"{r['label']}: {r['error']}" for r in results if r["error"] is not None]
    if failed:
        raise SystemExit("a trial failed, so the runs compare nothing:\n" + "\n".join(failed))
    return time.perf_counter() - began[0], results


def ranking(results: Sequence[dict[str, Any]]) -> list[str]:
    """Labels best first, as tune's recommendation picks (goodput: higher is better): measured trials within the
    SLO first, then by score; the baseline loses a tie; trials without a score last."""

    def key(r: dict[str, Any]) -> tuple[bool, bool, float, bool]:
        score = r["measured_score"]
        return (score is None, (r["measured_violation"] or 0) > 0, -(score or 0.0), r["label"] == BASELINE)

    return [r["label"] for r in sorted(results, key=key)]


def separated_pairs(one: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(pairs of candidates both runs separate by more than TIE, of those the pairs both order alike): the part
    of the two rankings that is not a tie in either run."""
    a = {r["label"]: r["measured_score"] or 0.0 for r in one}
    b = {r["label"]: r["measured_score"] or 0.0 for r in other}

    def apart(s: dict[str, float], x: str, y: str) -> bool:
        return abs(s[x] - s[y]) > TIE * max(s[x], s[y], 1e-12)

    labels = sorted(set(a) & set(b))
    pairs = [(x, y) for i, x in enumerate(labels) for y in labels[i + 1 :] if apart(a, x, y) and apart(b, x, y)]
    return len(pairs), sum((a[x] > a[y]) == (b[x] > b[y]) for x, y in pairs)


def on_two_nodes(
    model: Path, vllm_python: Path, output: Path, rate: float
) -> tuple[float, list[dict[str, Any]], float]:
    """The parallel run on a fresh local cluster (a head running nothing, two nodes with trial GPUs 2 + 1);
    returns its stage 2 and how long the cluster took to start."""
    import ray
    from ray.cluster_utils import Cluster

    from servelab.cluster.ray_pool import RayPool

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # Ray's head replaces them
    began = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for gpus in (2, 1):
            cluster.add_node(num_cpus=1, resources={TRIAL_GPU: gpus})
        cluster.wait_for_nodes()
        pool = RayPool(cluster.address)
        startup = time.perf_counter() - began
        wall, results = stage2(request(model, vllm_python, output, pool, rate))
    finally:
        ray.shutdown()
        cluster.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return wall, results, startup


def trial_rows(name: str, results: Sequence[dict[str, Any]]) -> list[str]:
    """One table row per trial: its phases (the rest of its span is the prediction, the server's stop and the
    summary), its score and its p99 TTFT (which the schedule does not bound)."""
    rows = []
    for r in results:
        span = r["ended_at"] - r["started_at"]
        rest = span - r["startup_s"] - r["bench_s"]
        rows.append(
            f"| {name} | {r['label']} | `{r['engine_args']}` | {r['startup_s']:.1f} s | {r['bench_s']:.1f} s "
            f"| {rest:.1f} s | {span:.1f} s | {r['measured_score']:.3f} | {r['measured']['p99_ttft_ms']:.0f} ms |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", type=Path, default=os.environ.get("SERVELAB_VLLM_PYTHON"))
    ap.add_argument("--model", type=Path, default=os.environ.get("SERVELAB_TINY_MODEL"))
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--rate",
        type=float,
        default=RATE,
        help="each trial's request rate (req/s); one past max_num_seqs 2's capacity separates the candidates",
    )
    args = ap.parse_args()
    if args.vllm_python is None or args.model is None:
        ap.error("give --vllm-python and --model (or set SERVELAB_VLLM_PYTHON and SERVELAB_TINY_MODEL)")

    with tempfile.TemporaryDirectory(prefix="servelab-stage2-speed-") as scratch:
        one_wall, one = stage2(request(args.model, args.vllm_python, Path(scratch) / "sequential", None, args.rate))
        ray_wall, spread, cluster_s = on_two_nodes(args.model, args.vllm_python, Path(scratch) / "ray", args.rate)
    one_rank, ray_rank = ranking(one), ranking(spread)
    scores = {
        name: {r["label"]: r["measured_score"] for r in results}
        for name, results in (("sequential", one), ("ray", spread))
    }
    # how far apart the candidates score: ranks decided by less than the runs' own differences are ties
    score_spread = {name: 1 - min(s.values()) / max(s.values()) for name, s in scores.items()}
    separated, alike = separated_pairs(one, spread)
    result = {
        "workload": f"{PROMPTS} requests, 256 in / 32 out, Poisson {args.rate:g} req/s",
        "host_cores": os.cpu_count(),
        "sequential_s": round(one_wall, 1),
        "ray_s": round(ray_wall, 1),
        "speedup": round(one_wall / ray_wall, 2),
        "ray_cluster_startup_s": round(cluster_s, 1),
        "ranking": {"sequential": one_rank, "ray": ray_rank},
        "rankings_agree": one_rank == ray_rank,
        "separated_pairs": separated,
        "separated_pairs_alike": alike,
        "scores": scores,
        "score_spread": score_spread,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "trials": {"sequential": one, "ray": spread},
    }
    print(
        "| run | trial | flags | server start | bench | rest | trial span | goodput (req/s) | p99 TTFT |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    print("\n".join(trial_rows("sequential", one) + trial_rows("ray, 2 nodes", spread)))
    print(
        f"\n| stage 2 | sequential | Ray, 2 nodes | sequential / Ray | rankings agree | score spread (seq / Ray) "
        f"| load avg |\n|---|---:|---:|---:|---|---:|---:|\n"
        f"| wall time | {one_wall:.1f} s | {ray_wall:.1f} s | {one_wall / ray_wall:.2f}x | "
        f"{'yes' if one_rank == ray_rank else 'no'} | {score_spread['sequential']:.2%} / {score_spread['ray']:.2%} "
        f"| {result['load_average_1m']} |"
    )
    print(
        f"\nranking, sequential: {' > '.join(one_rank)}\nranking, Ray:        {' > '.join(ray_rank)}\n"
        f"pairs both runs separate by more than {TIE:.0%}: {separated}, ordered alike: {alike}\n"
        f"(Ray cluster start-up, outside the timed stage 2: {cluster_s:.1f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
