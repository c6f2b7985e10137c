"""The report in a real headless Chromium: loads offline without JavaScript errors and every plot draws.

Skipped when chromium/chromedriver/selenium are missing, unless
SERVELAB_REQUIRE_CHROMIUM=1 (CI): then it fails and says what to install.
The screenshot goes to $SERVELAB_ARTIFACTS when set (to look at), else to tmp_path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.report.html import write_report
from support import browser
from support.synthetic_results import TOY_DIAGNOSIS, toy_validation, write_toy_run, write_toy_sweep

pytestmark = pytest.mark.browser
REQUIRE = os.environ.get("SERVELAB_REQUIRE_CHROMIUM") == "1"


@pytest.fixture
def chromium() -> None:
    reason = browser.missing()
    if reason:
        if REQUIRE:
            pytest.fail(f"SERVELAB_REQUIRE_CHROMIUM=1 but {reason}")
        pytest.skip(reason)


@pytest.mark.timeout(120)
def test_report_renders_in_headless_chromium(tmp_path: Path, chromium: None) -> None:
    measured = write_toy_sweep(tmp_path / "bench-sweep", (1, 2, 4, 8, 16), source="http")
    simulated = write_toy_sweep(tmp_path / "sim-sweep", (1, 2, 4, 8, 16), source="sim")
    single = write_toy_run(tmp_path / "single-run", concurrency=12, n=120, source=None)
    (measured / "diagnosis.json").write_text(json.dumps(TOY_DIAGNOSIS))
    study = tmp_path / "tune-study"
    tuned = CliRunner().invoke(
        app,
        [
            "tune",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--space",
            "max_num_seqs=8,32,128",
            "--space",
            "max_num_batched_tokens=1024,8192",
            "--sim-prompts",
            "40",
            "--random-input-len",
            "512",
            "--random-output-len",
            "64",
            "--goodput",
            "ttft:300",
            "--result-dir",
            str(study),
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    validation = tmp_path / "validation.json"
    validation.write_text(json.dumps(toy_validation()))
    comparison = tmp_path / "compare.json"
    compared = CliRunner().invoke(
        app,
        [
            "compare",
            "--gpu",
            "h100-sxm",
            "--model",
            "llama-3.1-8b",
            "--random-input-len",
            "600",
            "--random-output-len",
            "40",
            "--num-prompts",
            "20",
            "--sweep",
            "request-rate=4,inf",
            "--goodput",
            "ttft:2000",
            "--out",
            str(comparison),
        ],
    )
    assert compared.exit_code == 0, compared.output
    page = write_report([measured, simulated, single, study, validation, comparison], tmp_path / "report.html")
    artifacts = Path(os.environ.get("SERVELAB_ARTIFACTS", tmp_path))

    check = browser.open_page(page, artifacts / "report.png")

    assert check.errors == []
    assert len(check.plots) == 9
    not_drawn = [p.id for p in check.plots if not p.rendered]
    assert not_drawn == [], f"plots without svg.main-svg: {not_drawn}"
    assert all(p.traces > 0 for p in check.plots)
    assert check.headings == [
        "What was run",
        "Summary",
        "Diagnosis",
        "Tune",
        "Simulated vs. measured (validate)",
        "Engines compared (compare)",
        "Sweeps",
        "Latency distributions",
        "Per-request timeline",
        "Server timeline",
    ]
    menus = {p.title.split(" (")[0]: p.menu for p in check.plots if p.menu}
    assert list(menus) == ["Per-request timeline", "Server timeline"]
    assert len(menus["Per-request timeline"]) == 11 and menus["Server timeline"][0] == "All runs"
    assert check.screenshot.stat().st_size > 50_000
    assert check.page_height > 5000
