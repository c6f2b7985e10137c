#!/usr/bin/env python3
"""Refit servelab's per-GPU kernel coefficients from the installed aiconfigurator-core tables.

    pip install -e '.[kernels]'          # aiconfigurator-core==0.12.0: the measured tables
    .venv/bin/python scripts/fit_kernels.py [--gpu H100-SXM ...] [--data DIR] [--check]

Writes servelab/perf/data/kernel_coefficients.yaml (coefficients and fit residuals,
per GPU); the fit is deterministic, so a rerun on the same data reproduces the file.
--check compares instead of writing and exits 1 on a difference beyond the optimiser's platform noise (0.1%; the
parameters that converge to ~0 at a bound differ in their last digits between machines). See docs/kernels.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from servelab.perf.kernel_fit import (
    COEFFICIENTS_FILE,
    SYSTEMS,
    KernelCoefficients,
    dump_yaml,
    fit_all,
    refit_differences,
    sibling_time_ratios,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="append", choices=sorted(SYSTEMS), help="GPUs to fit (default: all with tables)")
    ap.add_argument("--data", type=Path, help="aiconfigurator systems/data folder (default: the installed package's)")
    ap.add_argument("--out", type=Path, default=COEFFICIENTS_FILE)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()

    coefficients = fit_all(args.gpu or tuple(SYSTEMS), args.data)
    text = dump_yaml(coefficients)
    for gpu, fit in coefficients.gpus.items():
        worst = max(fit.residuals.items(), key=lambda kv: kv[1].holdout_rms)
        print(
            f"{gpu:14s} {fit.device:24s} gemm held-out rms {fit.residuals['gemm'].holdout_rms:.1%}; "
            f"worst op {worst[0]} {worst[1].holdout_rms:.1%}"
        )
    if coefficients.sink_prefill:
        scale = coefficients.sink_prefill
        ratios = sibling_time_ratios(scale, args.data)
        print(
            f"sink prefill   {scale.device:24s} Triton backend x{scale.efficiency_ratio:.3f} of FlashAttention 2's "
            f"efficiency; time over FlashAttention 2's, measured/fitted median: "
            + ", ".join(f"{n}: {m:.2f}/{f:.2f}" for n, (m, f) in ratios.items() if n in (512, 2048, 8192, 16384))
        )
    if args.check:
        if not args.out.exists():
            print(f"{args.out}: missing")
            return 1
        committed = KernelCoefficients.model_validate(yaml.safe_load(args.out.read_text())).model_dump()
        differences = refit_differences(committed, yaml.safe_load(text))
        print("\n".join(differences) or f"{args.out}: reproduced (within the optimiser's platform noise)")
        return 1 if differences else 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
