"""What one concurrency cap shared by `bench --clients N` costs: the round trip to the slot broker, per request.

Every request of a capped run from several clients asks the broker (an async
Ray actor on the driver's node, servelab/cluster/slot_broker.py) for a slot
before it is sent; the time that call takes beyond its wait for a free slot
is send lag the shared cap adds to that request. Each client records it
(`client_stats.clients[i].slot_broker`: median, p99, max round trip); this
script runs the same closed loop against a real vLLM CPU server (the tiny
model the tests use) from one client (its own local cap) and from N clients
sharing the cap, and prints the round trips beside the run's schedule lag and
its median inter-token gap and request latency: the figures the round trip
would distort. A Ray lease (a client keeping a few slots to save round trips)
is worth adding only if the round trip is material next to those.

Without --ray-address it starts a one-node Ray on this machine.

    flock /tmp/servelab-heavy.lock timeout 900 .venv/bin/python benchmarks/slot_broker_cost.py \\
        --vllm-python ~/.cache/servelab/vllm-venv/bin/python --model ~/.cache/servelab/tiny-model [--clients 3] \\
        [--max-concurrency 4] [--num-prompts 200] [--ray-address ADDR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from servelab.targets.server_process import vllm_cpu_server


def bench(base_url: str, model: str, clients: int, cap: int, prompts: int, address: str, out: Path) -> dict[str, Any]:
    """One `servelab bench` run; its summary."""
    argv = [
        str(Path(sys.executable).parent / "servelab"),
        "bench",
        "--base-url",
        base_url,
        "--model",
        model,
        "--ignore-eos",
        "--random-input-len",
        "64",
        "--random-output-len",
        "32",
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(cap),
        "--ray-address",
        address,
        "--clients",
        str(clients),
        "--result-dir",
        str(out),
        "--json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def row(summary: dict[str, Any]) -> dict[str, Any]:
    """What the round trip is measured against, and each client's round trips (ms)."""
    stats = summary["client_stats"]
    clients = stats.get("clients") or [stats]
    return {
        "completed": summary["completed"],
        "median_itl_ms": summary["median_itl_ms"],
        "median_e2el_ms": summary["median_e2el_ms"],
        "median_schedule_lag_ms": [c.get("median_schedule_lag_ms") for c in clients],
        "slot_broker": [c.get("slot_broker") for c in clients],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", required=True, help="the model directory the vLLM CPU server loads")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--ray-address")
    parser.add_argument("--json")
    args = parser.parse_args()

    import ray

    if args.ray_address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
        address = ray.get_runtime_context().gcs_address
    else:
        address = args.ray_address
    work = Path(tempfile.mkdtemp(prefix="slot-broker-"))
    with vllm_cpu_server(
        args.vllm_python,
        args.model,
        log_path=work / "vllm.log",
        served_model_name="tiny",
        extra_args=("--max-model-len", "4096", "--max-num-seqs", "32"),
    ) as server:
        result = {
            n: row(
                bench(
                    server.base_url, "tiny", n, args.max_concurrency, args.num_prompts, address, work / f"clients-{n}"
                )
            )
            for n in (1, args.clients)
        }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
