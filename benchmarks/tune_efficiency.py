"""How few simulations `tune`'s search needs: TPE against the exhaustive grid, with the simulator as ground truth.

Llama-3.1-8B on one H100-SXM, 1,024-token prompts behind a 512-token shared
prefix (8 groups), 128 output tokens; objective: the highest Poisson rate at
which p99 TTFT <= 500 ms and p99 TPOT <= 50 ms. The grid is
max_num_seqs x max_num_batched_tokens x long_prefill_token_threshold x
prefix caching = 6 x 5 x 2 x 2 = 120 configurations, every one simulated
(that is the ground truth). Then the sim-first search (TPE, as `tune` runs it)
gets 25% of the grid's evaluations, once per seed; since every evaluation is
deterministic, it reads the grid's answers instead of re-simulating.

Goal: TPE's best within 3% of the grid's best, with <= 25% of its evaluations.

    .venv/bin/python benchmarks/tune_efficiency.py [--seeds 5] [--budget 0.25] [--sim-prompts 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from servelab.metrics.slo import SLO
from servelab.targets.deployment import build_deployment
from servelab.tune.objectives import Objective
from servelab.tune.space import SearchSpace, candidate_key
from servelab.tune.study import SearchSettings, run_search
from servelab.schemas.tune import Trial
from servelab.tune.trial import SimJudge
from servelab.tune.workload import TuneWorkload
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount

SPACE = SearchSpace.from_items(
    [
        "max_num_seqs=16,32,64,128,256,512",
        "max_num_batched_tokens=512,1024,2048,4096,8192",
        "long_prefill_token_threshold=0,256",
        "enable_prefix_caching=true,false",
    ]
)
TOLERANCE = 0.03


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.25, help="share of the grid TPE may evaluate")
    ap.add_argument("--sim-prompts", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    judge = sim_judge(args.sim_prompts)
    t0 = time.perf_counter()
    grid = {candidate_key(candidate): judge.judge(candidate) for candidate in SPACE.grid()}  # the ground truth
    grid_wall = time.perf_counter() - t0
    best_key = max(grid, key=lambda k: grid[k].score or 0.0)
    best = grid[best_key].score or 0.0
    near = sum(1 for o in grid.values() if (o.score or 0.0) >= best * (1 - TOLERANCE))
    print(
        f"grid: {len(grid)} configurations simulated in {grid_wall:.0f} s; best goodput {best:.3f} req/s at {best_key}"
    )
    budget = int(SPACE.size * args.budget)
    print(
        f"{near} of {SPACE.size} configurations are within 3% of the best; "
        f"random search with {budget} draws would reach it with probability {random_reach(near, budget):.1%}"
    )
    runs = [tpe_run(grid, seed, budget, best) for seed in range(args.seeds)]
    worst = min(r["ratio"] for r in runs)
    used = max(r["evaluations"] for r in runs)
    ok = worst >= 1 - TOLERANCE and used <= SPACE.size * args.budget
    print(
        f"worst seed: {worst:.1%} of the grid's best using {used} of {SPACE.size} evaluations "
        f"({used / SPACE.size:.0%}) -> {'PASS' if ok else 'FAIL'} (goal: >= {1 - TOLERANCE:.0%} with <= "
        f"{args.budget:.0%})"
    )
    if args.json:
        result = {
            "grid_size": SPACE.size,
            "grid_best": best,
            "grid_within_3pct": near,
            "grid_best_config": json.loads(best_key),
            "grid_wall_s": grid_wall,
            "budget": budget,
            "runs": runs,
            "pass": ok,
        }
        args.json.write_text(json.dumps(result, indent=2))


def sim_judge(sim_prompts: int) -> SimJudge:
    """The simulator judging a configuration as `tune` does: goodput under the SLO on the benchmark's workload."""
    workload = TuneWorkload(
        WorkloadConfig(dataset_name="prefix", input_len=1024, output_len=128, prefix_len=512, num_prefixes=8),
        ArrivalConfig(),
        Amount(num_prompts=sim_prompts),
    )
    deployment = build_deployment("H100-SXM", "Llama-3.1-8B", "")
    return SimJudge(deployment, deployment, workload, Objective("goodput", SLO.parse("ttft:500 tpot:50")))


def random_reach(near: int, budget: int) -> float:
    """What blind luck would do with the same budget: the chance that a draw (without replacement) lands within 3%."""
    miss = 1.0
    for i in range(budget):
        miss *= max(0.0, (SPACE.size - near - i) / (SPACE.size - i))
    return 1 - miss


def tpe_run(grid: dict[str, Trial], seed: int, budget: int, best: float) -> dict[str, float | int | None]:
    """One TPE search of `budget` evaluations, each read off the grid (the simulator is deterministic)."""
    asked: list[float] = []

    def lookup(candidate: dict) -> Trial:
        outcome = grid[candidate_key(candidate)]
        asked.append(outcome.score or 0.0)
        return outcome

    with tempfile.TemporaryDirectory() as tmp:
        settings = SearchSettings(n_trials=budget, sampler="tpe", seed=seed)
        run_search(SPACE, lookup, Path(tmp), direction="maximize", settings=settings)
    running = [max(asked[: i + 1]) for i in range(len(asked))]
    reached = next((i + 1 for i, v in enumerate(running) if v >= best * (1 - TOLERANCE)), None)
    print(
        f"seed {seed}: TPE best {running[-1]:.3f} req/s = {running[-1] / best:.1%} of the grid's best "
        f"after {len(asked)} evaluations ({len(asked) / SPACE.size:.0%} of the grid); "
        f"within 3% after {reached if reached else 'never'}"
    )
    return {
        "seed": seed,
        "evaluations": len(asked),
        "best": running[-1],
        "ratio": running[-1] / best,
        "evaluations_to_within_3pct": reached,
    }


if __name__ == "__main__":
    main()
