"""Every document servelab writes, byte for byte as stored in tests/data/documents/ (apart from what a rerun changes).

The stored files were written by the code before the result types moved into servelab/schemas/: a refactor of how a
document is built must leave the file itself alone. Each case runs a verb through the real command line on the
simulator (deterministic: seeded workloads, no clock in the model) and compares every file it writes with the stored
one after blanking what differs between two runs of the same code: wall-clock stamps, how long the host took, and the
temporary directory's path. report.html is left out (plotly's element ids and its bundled library change per run),
and so is tune's optuna database (sqlite, optuna's own format).

The stored files were written again once, when expert parallelism added its knobs (vLLM's enable_expert_parallel,
SGLang's ep_size and enable_dp_attention) to the engine configuration every document records: those keys are the only
difference (`diff -r` of the two sets); and when vLLM's VLLM_MXFP4_USE_MARLIN joined it (`mxfp4_use_marlin`), the only
key added. diagnose-results-priced was written again when weight-only formats (AWQ, FP8 weights on an A100) moved onto
the measured kernel fit: its AWQ and FP8 options' numbers are the only difference; and again when FP8 linear layers on
an A100 were held to Marlin's measured large-batch rate (perf/moe_kernels.py, marlin_linear_flops): only the FP8 option
moved (a step at the run's load 27.3 -> 38.4 ms, its verdict helps -> hurts). The diagnose and tune documents were
written again when vLLM's API server began to send a step of more than 128 outputs in slices of 128
(docs/simulator.md): diagnose's saturated replay moved by under 0.1%, tune's best rate by -2.4% (46.70 to 45.57 req/s),
and their 80% intervals moved with the residuals that change put in prediction_residuals.yaml (kvcached's bursts). The
simulated summaries and the documents holding their intervals were written again when the intervals were conditioned on
what limits the run (servelab.metrics.intervals.classify_limit): `client_stats.api_server_busy_share` and
`interval_basis.limit` are new keys, the pooling notes name the limit, and the intervals of engine-bound saturated
predictions moved (the described diagnosis's ceiling: 7.45-15.4 to 6.87-10.3 req/s around 8.57). When each vLLM
release's layout of MXFP4 experts for OpenAI's Triton kernel joined the engine configuration
(`mxfp4_triton_keeps_checkpoint_scales`, `mxfp4_triton_pads_values_to_64_bytes`), those keys were the only ones added.

To store the files again after a deliberate change of a document (and a schema_version bump where a published schema
changes): `SERVELAB_WRITE_DOCUMENTS=1 pytest tests/test_documents_unchanged.py`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servelab.cli import app

STORED = Path(__file__).parent / "data" / "documents"
FIXTURES = Path(__file__).parent / "fixtures" / "results"
WRITE = os.environ.get("SERVELAB_WRITE_DOCUMENTS") == "1"

VOLATILE_KEYS = {
    "started_at",
    "finished_at",
    "sim_wall_s",
    "steps_per_s",
    "created_at",
    "wall_s",
    "elapsed_s",
    "duration_wall_s",
    "generated_at",
    "servelab_version",
    "python",
    "client_host",
    "argv",
    "ended_at",
    "host",
}
"""Keys whose values are the host's clock, speed, load or name, the installed versions, or the test runner's own argv
(run.json records sys.argv, which under CliRunner is pytest's): blanked before comparing."""

SIM = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b"]
LOAD = [
    "--num-prompts",
    "40",
    "--random-input-len",
    "300",
    "--random-output-len",
    "40",
    "--seed",
    "3",
    "--goodput",
    "ttft:500",
]

UNSTARTABLE_SERVER = "python3 -c 'import sys; sys.exit(3)' {engine_args}"
"""A stage-2 server that exits before it is ready: stage 2 runs its real path (prediction, start, the failure kept in
stage2.json and tune.json) without a GPU, and the documents stay deterministic."""

CASES: dict[str, list[str]] = {
    "simulate": ["simulate", *SIM, *LOAD, "--request-rate", "4", "--result-dir", "{out}"],
    "sweep": ["simulate", *SIM, *LOAD, "--sweep", "request-rate=2,6", "--result-dir", "{out}"],
    "compare": ["compare", *SIM, *LOAD, "--request-rate", "4", "--engines", "vllm,sglang", "--result-dir", "{out}"],
    "tune": [
        "tune",
        *SIM,
        *LOAD,
        "--request-rate",
        "4",
        "--n-trials",
        "3",
        "--search-seed",
        "1",
        "--result-dir",
        "{out}",
    ],
    "tune-stage2": [
        "tune",
        *SIM,
        *LOAD,
        "--request-rate",
        "4",
        "--n-trials",
        "3",
        "--search-seed",
        "1",
        "--top-k",
        "1",
        "--server-cmd",
        UNSTARTABLE_SERVER,
        "--result-dir",
        "{out}",
    ],
    "diagnose-described": [
        "diagnose",
        *SIM,
        "--input-len",
        "1500",
        "--output-len",
        "200",
        "--request-rate",
        "10",
        "--engine-args",
        "--max-num-seqs 256",
        "--observed-gpu-util",
        "0.3",
        "--goodput",
        "ttft:2000",
        "--tried",
        "--max-num-batched-tokens 1024:no-effect",
        "--save",
        "{out}/diagnosis.json",
    ],
    "calibrate-from": [
        "calibrate",
        "--from",
        "{fixtures}/vllm-bench-detailed.json",
        "--gpu",
        "h100-sxm",
        "--model",
        "qwen2.5-7b",
        "-o",
        "{out}/profile.json",
    ],
    "diagnose-results": ["diagnose", "{out}/run", "--save", "{out}/diagnosis.json"],
    "diagnose-results-priced": [
        "diagnose",
        "{out}/run",
        "--check-advice",
        "--price-options",
        "--save",
        "{out}/diagnosis.json",
    ],
}
"""Each case: the argv, with {out} the directory its files land in."""

OVERLOADED_RUN = ["simulate", *SIM, *LOAD, "--request-rate", "40", "--result-dir", "{out}/run"]
BEFORE: dict[str, list[str]] = {"diagnose-results": OVERLOADED_RUN, "diagnose-results-priced": OVERLOADED_RUN}
"""A verb run before the case's own, whose files the case reads (and are compared too): a simulated run for
`diagnose RESULTS`, offered more than it serves so the verdict, findings and recommendations all appear."""


def _blank(value: Any, out: str, volatile: frozenset[str] = frozenset()) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<volatile>" if k in VOLATILE_KEYS | volatile else _blank(v, out, volatile)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_blank(v, out, volatile) for v in value]
    if isinstance(value, str):
        return value.replace(out, "<out>").replace(str(FIXTURES), "<fixtures>")
    return value


def _normalised(path: Path, out: str, volatile: frozenset[str] = frozenset()) -> str:
    """The file's text with the volatile values blanked, each JSON value re-serialised in the file's own layout."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return "".join(json.dumps(_blank(json.loads(line), out, volatile)) + "\n" for line in text.splitlines() if line)
    if path.suffix == ".json":
        indent = 2 if re.match(r"[\[{]\n", text) else None
        return json.dumps(_blank(json.loads(text), out, volatile), indent=indent) + "\n"
    return text.replace(out, "<out>")


def _documents(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix not in (".html", ".db")
    }


SLOW_CASES = {"diagnose-described"}
"""Cases of 10 s on 2 cores (the described diagnosis reconciles the reported figures and prices the tried change):
in the full suite only, as the `slow` marker says."""


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if case in SLOW_CASES else []) for case in sorted(CASES)]
)
def test_a_verb_writes_the_stored_documents(case: str, tmp_path: Path):
    out = tmp_path / case
    argv = [arg.replace("{out}", str(out)).replace("{fixtures}", str(FIXTURES)) for arg in CASES[case]]
    if case.startswith("diagnose"):
        out.mkdir()
    if case in BEFORE:
        before = CliRunner().invoke(app, [arg.replace("{out}", str(out)) for arg in BEFORE[case]])
        assert before.exit_code == 0, before.output
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    _assert_stored(case, {name: _normalised(path, str(out)) for name, path in _documents(out).items()})


def _assert_stored(case: str, written: dict[str, str]) -> None:
    stored_dir = STORED / case
    if WRITE:
        for name, text in written.items():
            (stored_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (stored_dir / name).write_text(text, encoding="utf-8")
    stored = {name: _normalised(path, "<out>") for name, path in _documents(stored_dir).items()}  # blanked alike
    assert sorted(written) == sorted(stored), f"{case}: files written differ from those stored"
    for name, text in written.items():
        assert text == stored[name], f"{case}/{name} differs from tests/data/documents/{case}/{name}"


def test_validate_writes_the_stored_report(tmp_path: Path):
    """validation.json of a profile checked against a simulated "server" that is the profile itself (no live server:
    the measured side is the simulator too, so every figure is deterministic). The host's conditions are blanked."""
    from servelab.targets.profile import profile_sim_target
    from servelab.calibrate.validate import QUICK_POINTS, report_json, validate_on
    from servelab.perf.calibration import load_profile
    from support.profiles import tiny_profile

    out = tmp_path / "validate"
    profile = load_profile(tiny_profile(out / "profile"))
    report = validate_on(
        profile_sim_target(profile), profile, out / "validation.runs", points=QUICK_POINTS[:2], repeats=2
    )
    (out / "validation.json").write_text(report_json(report), encoding="utf-8")
    _assert_stored("validate", {"validation.json": _normalised(out / "validation.json", str(out), frozenset({"host"}))})
