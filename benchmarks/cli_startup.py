"""CPU seconds a `servelab` command spends before it can answer: `--help`, `--version`, every verb's `--help`,
`schema --help` and `schema NAME` for every published schema.

Each command runs as its own process (`python -c` calling servelab.cli.main with this interpreter), RUNS times after
one warm-up; the CPU is the operating system's account of the finished child (user + system, from getrusage of the
reaped child), so start-up, imports and exit are all counted, and a busy machine moves it far less than wall time.
With `--before DIR` (a copy of an older servelab, e.g. `git archive COMMIT servelab | tar -x -C DIR`) each command
also runs with that copy, interleaved run by run with the current one, so both see the same machine.
Prints a Markdown table: median CPU seconds (min-max).

    cd /tmp && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONPATH=REPO \\
        REPO/.venv/bin/python REPO/benchmarks/cli_startup.py [--runs 5] [--before DIR] [--out rows.json]

Run it outside the repository, PYTHONPATH naming the copy to measure: `python -c` puts the current directory first
on the path. docs/benchmarks.md has the table and the environment it was measured in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from servelab.cli import VERBS
from servelab.cli.schema import SCHEMAS

COMMANDS = [
    ["--help"],
    ["--version"],
    *([verb, "--help"] for verb in VERBS),
    *(["schema", name] for name in SCHEMAS),
]
ENTRY = "import sys; from servelab.cli import main; sys.argv[0] = 'servelab'; main()"


def cpu_seconds(argv: list[str], path: str) -> float:
    """User + system CPU of one finished `servelab ARGV` process, servelab imported from `path`."""
    env = {**os.environ, "PYTHONPATH": path}
    process = subprocess.Popen(
        [sys.executable, "-c", ENTRY, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if process.returncode != 0:
        raise SystemExit(f"servelab {' '.join(argv)} failed (exit {process.returncode}) with PYTHONPATH={path}")
    return usage.ru_utime + usage.ru_stime


def spread(runs: list[float]) -> str:
    return f"{statistics.median(runs):.2f} ({min(runs):.2f}–{max(runs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", type=Path, help="A copy of an older servelab (the directory holding servelab/).")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    copies = {"now": os.environ.get("PYTHONPATH", "")} | ({"before": str(args.before.resolve())} if args.before else {})
    print("| command |" + "".join(f" {name}, s CPU |" for name in reversed(copies)))
    print("|---|" + "---:|" * len(copies), flush=True)
    rows = []
    for argv in COMMANDS:
        runs: dict[str, list[float]] = {name: [] for name in copies}
        for path in copies.values():
            cpu_seconds(argv, path)  # warm-up: file cache, .pyc
        for _ in range(args.runs):
            for name, path in copies.items():
                runs[name].append(cpu_seconds(argv, path))
        command = "servelab " + " ".join(argv)
        rows.append(
            {
                "command": command,
                **{
                    name: {"median_cpu_s": statistics.median(r), "min_cpu_s": min(r), "max_cpu_s": max(r)}
                    for name, r in runs.items()
                },
            }
        )
        print(f"| `{command}` |" + "".join(f" {spread(runs[name])} |" for name in reversed(copies)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
