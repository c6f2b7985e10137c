"""CPU seconds a `servelab` command spends before it can answer: `--help`, every verb's `--help`, `schema NAME`.

Each command runs as its own process (the installed entry point, or `python -c` calling servelab.cli.main with this
interpreter), RUNS times after one warm-up; the CPU is the operating system's account of the finished child
(user + system, from getrusage of the reaped child), so start-up, imports and exit are all counted, and a busy
machine moves it far less than wall time. Prints one line per command: median, min and max CPU seconds.

    cd /tmp && PYTHONPATH=REPO REPO/.venv/bin/python REPO/benchmarks/cli_startup.py [--runs 5] [--out rows.json]

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

COMMANDS = [
    ["--help"], ["--version"], ["schema", "summary"], ["schema", "--help"],
    *([verb, "--help"] for verb in ("bench", "simulate", "diagnose", "tune", "compare", "calibrate", "validate", "report")),
]
ENTRY = "import sys; from servelab.cli import main; sys.argv[0] = 'servelab'; main()"


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU of one finished `servelab ARGV` process."""
    process = subprocess.Popen([sys.executable, "-c", ENTRY, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for argv in COMMANDS:
        cpu_seconds(argv)  # warm-up: file cache, .pyc
        runs = [cpu_seconds(argv) for _ in range(args.runs)]
        rows.append({"command": "servelab " + " ".join(argv), "median_cpu_s": statistics.median(runs),
                     "min_cpu_s": min(runs), "max_cpu_s": max(runs)})
        print(f"{rows[-1]['command']:28s} median {rows[-1]['median_cpu_s']:.2f} s CPU  (min {min(runs):.2f}, max {max(runs):.2f})",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
