"""Output that fits where it goes, and the command line's own flags (--version, completion, a light start).

Piped or redirected, every print is laid out at its full width: nothing a script or a log reads is cropped, elided
or dropped. On a terminal too narrow for a table, the table prints row by row; no column vanishes, no cell is cut.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.panel import Panel
from rich.table import Table
from typer.testing import CliRunner

import servelab
from servelab.cli import VERBS, app
from servelab.cli.schema import SCHEMAS
from servelab.report.diagnosis_view import ALTERNATIVE_COLUMNS
from servelab.report.console import FittingConsole, make_console

ELLIPSIS = "…"
ENTRY = "import sys; from servelab.cli import main; sys.argv[0] = 'servelab'; main()"


def servelab_piped(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`servelab ARGV` as a user's shell runs it with stdout into a pipe (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def wide_table() -> Table:
    table = Table(title="Options at this load (simulated)")
    for header in ("option", "GPUs", "TTFT p50 ms", "E2E p50 ms", "E2E p99 ms", "$/M out tok", "E2E verdict", "why"):
        table.add_column(header, no_wrap=header != "option")
    table.add_row(
        "--max-num-batched-tokens 4096 with a long explanation",
        "1",
        "3,306",
        "28,446",
        "33,115",
        "$0.17",
        "no effect",
        "the same prompt tokens are computed either way, only moved between steps",
    )
    table.add_row("one H100-SXM, FP8 weights", "1", "35.87", "757", "909", "$0.43", "helps", "faster chip")
    return table


@pytest.mark.slow
def test_diagnose_piped_keeps_every_title_price_and_column(tmp_path: Path):
    """The README's first command, piped: the options table keeps its verdict column, prices their cents, finding
    titles their last words (the 80-column layout rich falls back to for a pipe had lost all three)."""
    saved = tmp_path / "diagnosis.json"
    result = servelab_piped(
        "diagnose", "--check-advice", "--price-options", "--save", str(saved), cwd=tmp_path, env={"COLUMNS": "60"}
    )  # a pipe has no columns: the variable describes a terminal
    assert result.returncode == 0, result.stderr
    text = result.stdout
    diagnosis = json.loads(saved.read_text())
    assert ELLIPSIS not in text
    assert diagnosis["findings"] and diagnosis["alternatives"] and diagnosis["advice"]
    for finding in diagnosis["findings"]:
        assert finding["title"] in text
    for header in ALTERNATIVE_COLUMNS:
        assert header in text
    prices = [f"${a['usd_per_mtok']:.2f}" for a in diagnosis["alternatives"] if a["usd_per_mtok"] is not None]
    assert prices and all(price in text for price in prices)
    for row in diagnosis["advice"]:  # one line per advice row, not one word per line
        assert any(row["advice"] in line and row["verdict"] in line for line in text.splitlines())


def test_compare_through_clirunner_prints_every_number_whole():
    result = CliRunner().invoke(
        app, ["compare", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "20", "--request-rate", "4"]
    )
    assert result.exit_code == 0, result.output
    assert ELLIPSIS not in result.output
    header = next(line for line in result.output.splitlines() if "engine" in line and "preempt" in line)
    for column in ("req/s", "output tok/s", "mean TTFT ms", "p99 TTFT ms", "mean TPOT ms", "goodput req/s", "preempt"):
        assert column in header


def test_a_file_gets_each_print_at_its_full_width():
    out = io.StringIO()
    FittingConsole(file=out).print(wide_table())
    text = out.getvalue()
    assert ELLIPSIS not in text and "$0.17" in text
    assert "the same prompt tokens are computed either way, only moved between steps" in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_narrow_terminal_gets_a_too_wide_table_row_by_row():
    out = io.StringIO()
    FittingConsole(file=out, force_terminal=True, width=60, color_system=None).print(wide_table())
    lines = out.getvalue().splitlines()
    assert ELLIPSIS not in out.getvalue()
    assert max(len(line) for line in lines) <= 60
    assert lines[0] == "Options at this load (simulated)"
    for header, value in (
        ("GPUs", "1"),
        ("$/M out tok", "$0.17"),
        ("E2E verdict", "no effect"),
        ("$/M out tok", "$0.43"),
    ):
        assert any(line.split(":", 1)[0] == header and line.split(":", 1)[1].strip() == value for line in lines), header


def test_a_table_that_fits_the_terminal_stays_a_table():
    out = io.StringIO()
    table = Table("engine", "req/s")
    table.add_row("vLLM", "3.53")
    FittingConsole(file=out, force_terminal=True, width=60, color_system=None).print(table)
    assert "┃ engine ┃ req/s ┃" in out.getvalue()


def test_a_panel_title_longer_than_the_terminal_moves_above_it_whole():
    title = "1. The reported QPS and GPU utilisation cannot hold for this deployment and workload"
    out = io.StringIO()
    FittingConsole(file=out, force_terminal=True, width=60, color_system=None).print(Panel("evidence", title=title))
    assert " ".join(out.getvalue().split()).startswith(title)


def test_errors_go_to_stderr_through_the_same_console():
    assert make_console(stderr=True).stderr and not make_console().stderr


def test_version_prints_the_package_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"servelab {servelab.__version__}\n"


def test_shell_completion_completes_verbs_and_their_flags(tmp_path: Path):
    # `--show-completion` prints the script for the shell it runs in, found among its parent processes: run from a
    # bash that stays its parent (a second command keeps bash from exec'ing it), as a user's would, so the test does
    # not depend on what started pytest (under `flock`/`timeout` in the background no shell is among its parents).
    script = subprocess.run(
        ["bash", "-c", '"$@"; exit $?', "bash", sys.executable, "-c", ENTRY, "--show-completion"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert script.returncode == 0, script.stderr
    assert "_SERVELAB_COMPLETE=complete_bash" in script.stdout
    verbs = servelab_piped(
        cwd=tmp_path, env={"_SERVELAB_COMPLETE": "complete_bash", "COMP_WORDS": "servelab si", "COMP_CWORD": "1"}
    )
    assert verbs.stdout.split() == ["simulate"]
    flags = servelab_piped(
        cwd=tmp_path,
        env={"_SERVELAB_COMPLETE": "complete_bash", "COMP_WORDS": "servelab simulate --num-pr", "COMP_CWORD": "2"},
    )
    assert "--num-prompts" in flags.stdout.split()


HEAVY = (
    "numpy",
    "scipy",
    "pydantic",
    "plotly",
    "optuna",
    "aiohttp",
    "pandas",
    "yaml",
    "tokenizers",
    "ray",
    "servelab.sim",
    "servelab.experiment",
    "servelab.calibrate",
    "servelab.compare",
    "servelab.diagnose",
    "servelab.targets",
)
"""What `servelab --help` and `--version` must not import."""
VERB_HELP_HEAVY = (
    "numpy",
    "scipy",
    "plotly",
    "optuna",
    "aiohttp",
    "pandas",
    "yaml",
    "tokenizers",
    "ray",
    "servelab.schemas.base",
    "servelab.sim.engine",
    "servelab.experiment",
    "servelab.calibrate",
    "servelab.compare",
    "servelab.targets.http",
    "servelab.report.terminal",
)
"""What no verb's `--help` may import: a verb's flags read their choices and defaults from light vocabulary modules
and the verb imports its implementation when it runs. (typer itself imports the pydantic library to build a
command, but none of servelab's result models, all of which derive from servelab.schemas.base or import numpy.)"""


def imported_by(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after `servelab ARGV` (which exits through SystemExit)."""
    probe = (
        "import sys\nfrom servelab.cli import main\nsys.argv[0] = 'servelab'\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit:\n    pass\nsys.stderr.write(' '.join(sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    return set(done.stderr.split())


def _loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(p for p in packages if any(m == p or m.startswith(p + ".") for m in modules))


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_top_level_help_and_version_import_no_verb(argv):
    assert _loaded(imported_by(*argv), HEAVY) == []


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_verbs_help_imports_no_numpy_result_model_or_layer(verb):
    assert _loaded(imported_by(verb, "--help"), VERB_HELP_HEAVY) == []


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_no_schema_imports_the_simulator_an_optimiser_plotting_or_the_http_client(name):
    modules = imported_by("schema", name)
    assert (
        _loaded(
            modules,
            (
                "scipy",
                "plotly",
                "optuna",
                "aiohttp",
                "pandas",
                "ray",
                "servelab.sim.engine",
                "servelab.targets.http",
                "servelab.tune.tuner",
                "servelab.diagnose.analysis",
            ),
        )
        == []
    )


def test_schema_imports_only_the_model_asked_for():
    modules = imported_by("schema", "summary")
    assert "servelab.schemas.results" in modules
    assert (
        _loaded(
            modules,
            (
                "numpy",
                "scipy",
                "plotly",
                "optuna",
                "aiohttp",
                "pandas",
                "yaml",
                "ray",
                "servelab.sim",
                "servelab.tune",
                "servelab.diagnose",
                "servelab.experiment",
                "servelab.perf",
            ),
        )
        == []
    )


def test_every_registered_verb_is_listed():
    """servelab.cli.VERBS is what --help lists and what loads a verb: a verb registered on `app` but missing there
    could not be run."""
    import importlib

    for module in {verb.module for verb in VERBS.values()}:
        importlib.import_module(f"servelab.cli.{module}")
    from servelab.cli import _name

    assert sorted(_name(command) for command in app.registered_commands) == sorted(VERBS)


@pytest.mark.parametrize(
    "argv, names",
    [
        (["simulate", "--tp", "two"], "'--tp'"),
        (["compare", "--model", "qwen2.5-7b"], "'--gpu'"),
        (["simulat"], "'simulat'"),
    ],
)
def test_a_flag_that_does_not_parse_is_one_line_naming_it(argv, names):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and names in result.stderr
