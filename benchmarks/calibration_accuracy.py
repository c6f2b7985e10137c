"""How well a calibration predicts held-out runs on the real vLLM CPU server: the accuracy benchmark behind
docs/validation.md.

This is a benchmark, not a test: its figures depend on what else the host
runs, so they are taken under `flock /tmp/servelab-heavy.lock` (no other
heavy run of this repository shares the machine) and printed with the
host's load and CPU steal during the run, next to the bounds the project
holds itself to (servelab.calibrate.validate.BOUNDS_PCT). The tests
(tests/test_calibrate_vllm.py) only assert what holds under any load.

It does what docs/validation.md describes: starts the tiny model's vLLM
CPU server (--max-num-seqs 32), calibrates, validates on the held-out points,
restarts the server with --max-num-seqs 8 and validates again with the same
profile. Every server is started by this script in its own process group,
in this script's session, and stopped by that group.

    .venv/bin/python benchmarks/calibration_accuracy.py [--budget 75] [--points quick] [--repeats 3] [--out DIR]

Needs the vLLM venv and the tiny model that scripts/test builds
($SERVELAB_VLLM_PYTHON, $SERVELAB_TINY_MODEL, defaults under ~/.cache/servelab).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servelab.calibrate import calibrate, validate
from servelab.calibrate.request import CalibrateRequest
from servelab.calibrate.validate import BOUNDS_PCT, METRICS, ValidateRequest, points_named
from servelab.metrics.host import HostWatch
from servelab.schemas.profile import CalibrationProfile
from servelab.targets.server_process import vllm_cpu_server

from heavy_run import TINY_MODEL, VLLM_PYTHON, heavy_lock

ENGINE_ARGS = ("--max-model-len", "4096", "--max-num-seqs", "32")


@contextmanager
def server(out: Path, *extra: str) -> Iterator[str]:
    args = (*ENGINE_ARGS, *extra)
    process = vllm_cpu_server(
        VLLM_PYTHON,
        TINY_MODEL,
        log_path=out / f"vllm{'-'.join(extra)}.log",
        served_model_name="tiny-qwen",
        kv_cache_gib=1,
        extra_args=args,
        startup_timeout=600,
    )
    with process:
        yield process.base_url


def table(title: str, report: dict[str, Any]) -> str:
    """One validation report as a markdown table: measured / predicted (error) per point and metric."""
    rows = [
        f"**{title}** (engine args: {report['engine_args']})",
        "",
        "| point | " + " | ".join(METRICS) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for point in report["points"]:
        set_aside = [f"{n} {why}" for why in ("stalled", "disturbed") if (n := point.get(f"{why}_repeats", 0))]
        cells = [
            "—"
            if point["measured"][k] is None
            else f"{point['measured'][k]:.1f} / {point['simulated'][k]:.1f} ({point['error_pct'][k]:+.0f}%)"
            for k in METRICS
        ]
        rows.append(
            f"| {point['point']}{' (' + ', '.join(set_aside) + ')' if set_aside else ''} | " + " | ".join(cells) + " |"
        )
    medians = report["median_abs_error_pct"]
    rows.append(
        "| median \\|error\\| | "
        + " | ".join(
            "—"
            if medians[k] is None
            else f"**{medians[k]:.1f}%**" + (f" (bound {BOUNDS_PCT[k]:g}%)" if k in BOUNDS_PCT else "")
            for k in METRICS
        )
        + " |"
    )
    rows += ["", *(f"- warning: {w}" for w in report["warnings"])]
    return "\n".join(rows)


def host_line(conditions: dict[str, Any]) -> str:
    shares = ", ".join(
        f"{k.removeprefix('cpu_').removesuffix('_share')} {100 * v:.0f}%"
        for k, v in conditions.items()
        if k.endswith("_share")
    )
    return (
        f"{conditions.get('cpu_count')} CPUs, load average {conditions.get('load_avg_1m', float('nan')):.2f}, CPU "
        f"{shares}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=75.0, help="calibration budget, seconds")
    parser.add_argument("--points", default="quick", help="validate's point set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=None, help="where profile, runs and reports go (default: a temp dir)"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="servelab-calibration-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    points_named(args.points)  # an unknown set fails before a server starts
    with heavy_lock():
        host = HostWatch().start()
        started = time.time()
        with server(out) as url:
            profile: CalibrationProfile = calibrate.run(
                CalibrateRequest(
                    "cpu",
                    str(TINY_MODEL),
                    out / "profile.json",
                    base_url=url,
                    engine_args=" ".join(ENGINE_ARGS),
                    budget_s=args.budget,
                    overwrite=True,
                )
            )
            same = validate.run(
                ValidateRequest(
                    out / "profile.json",
                    url,
                    out / "validate-32.json",
                    points=args.points,
                    repeats=args.repeats,
                    overwrite=True,
                )
            ).model_dump(mode="json")
        with server(out, "--max-num-seqs", "8") as url:
            other = validate.run(
                ValidateRequest(
                    out / "profile.json",
                    url,
                    out / "validate-8.json",
                    points=args.points,
                    engine_args="--max-num-seqs 8",
                    repeats=args.repeats,
                    overwrite=True,
                )
            ).model_dump(mode="json")
        conditions = host.conditions()
    ref = profile.reference
    print(f"## Calibration accuracy on the vLLM CPU server ({time.strftime('%Y-%m-%d', time.gmtime(started))})\n")
    print(f"Host during the run: {host_line(conditions)}; {time.time() - started:.0f} s in all; results in {out}.")
    if ref is not None and ref.median_ms is not None:
        print(f"Reference step at calibration: {ref.median_ms:.2f} ms, run-to-run spread {ref.spread_pct:.1f}%.")
    print(
        f"Step-model fit: rms error {100 * profile.fit['rms_rel_error']:.1f}% over "
        f"{len(profile.fit['observations'])} observations.\n"
    )
    print(table("Same server, --max-num-seqs 32 (as calibrated)", same))
    print()
    print(table("Restarted with --max-num-seqs 8, same profile", other))


if __name__ == "__main__":
    main()
