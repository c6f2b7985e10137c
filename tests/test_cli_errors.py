"""The one error path: every exception servelab raises derives from ServelabError, and the CLI maps it to an exit code.

A failure nobody raised on purpose (a bug) is exit 1 with its traceback and a
request to report it, never exit 2 ("bad input"): that is what these tests pin.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import servelab
from servelab.cli import app
from servelab.cli.exits import BUG_HINT
from servelab.errors import EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED, InputError, ServelabError, ServerFault


def _servelab_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(servelab.__path__, "servelab."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


def test_every_exception_servelab_defines_is_a_servelab_error():
    classes = _servelab_exceptions()
    assert len(classes) >= 16  # the layers' own classes, found by the walk (not an empty list that passes)
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, ServelabError)]
    assert strays == []


def test_no_servelab_exception_shadows_pydantics_validation_error():
    assert "ValidationError" not in {c.__name__ for c in _servelab_exceptions()}


def test_layer_errors_keep_the_builtin_bases_callers_catch():
    from servelab.metrics.results import ResultsDirError
    from servelab.targets.stream_client import ConnectError, ResetError
    from servelab.workload.errors import WorkloadError

    assert issubclass(WorkloadError, InputError) and issubclass(WorkloadError, ValueError)
    assert issubclass(ConnectError, ServerFault) and issubclass(ConnectError, OSError)
    assert issubclass(ResetError, ConnectionResetError)
    assert issubclass(ResultsDirError, FileNotFoundError) and ResultsDirError.exit_code == EXIT_BAD_INPUT


def test_a_bug_is_reported_as_a_bug_with_its_traceback_not_as_bad_input(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("some_internal_key")

    monkeypatch.setattr("servelab.cli.diagnose.diagnose_described", broken)
    result = CliRunner().invoke(app, ["diagnose", "--json"])
    assert result.exit_code == EXIT_BUG, result.output
    assert "Traceback" in result.output and "some_internal_key" in result.output
    assert BUG_HINT in result.output and "error:" not in result.output


def test_ctrl_c_is_exit_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("servelab.cli.diagnose.diagnose_described", interrupted)
    result = CliRunner().invoke(app, ["diagnose"])
    assert result.exit_code == EXIT_INTERRUPTED and "interrupted" in result.output


@pytest.mark.parametrize("make", [
    lambda d: d,  # no run.json
    lambda d: (d / "run.json").write_text("{not json"),
])
def test_diagnose_of_a_directory_that_is_not_results_is_one_line_exit_2(tmp_path: Path, make):
    make(tmp_path)
    result = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--gpu", "a100-80gb", "--model", "qwen2.5-7b"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.startswith("error: ") and str(tmp_path) in result.output and "Traceback" not in result.output


def test_a_described_deployment_with_no_tokens_is_bad_input_not_a_bug():
    result = CliRunner().invoke(app, ["diagnose", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--input-len", "0",
                                      "--output-len", "10", "--request-rate", "1"])
    assert result.exit_code == EXIT_BAD_INPUT and "--input-len" in result.output, result.output


def test_a_file_servelab_cannot_write_is_one_line_exit_2_naming_it(tmp_path: Path):
    run = tmp_path / "run"
    assert CliRunner().invoke(app, ["simulate", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "5",
                                    "--result-dir", str(run)]).exit_code == 0
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(blocker / "report.html")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.startswith("error: ") and str(blocker) in result.output and "Traceback" not in result.output
