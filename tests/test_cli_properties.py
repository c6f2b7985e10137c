"""Every command, driven with generated flag values: never a traceback, every error one line naming the input,
nothing written on an input error.

Each verb gets a few of its own flags (read from the command itself, so a new flag is driven too) set to values
of its type and to hostile ones: 0, negatives, NaN, infinities, huge numbers, quotes, paths to directories, to
malformed JSON and YAML, to nothing. Around each draw, a fixed base keeps a valid draw cheap (a tiny simulation,
a server address where nothing listens). Each draw runs in an empty working directory, under a time and memory
bound: a draw that would run away (a simulation without end, a prompt of a billion tokens) is a failure named by
its command line, not a hung or killed test run.

The budget is fixed (derandomized, no example database, no shrinking, DRAWS_PER_VERB draws per verb), so the test
runs the same draws every time, in well under a minute.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import shlex
import shutil
import signal
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servelab.cli import VERBS, app

ALLOWED_EXITS = {0, 2, 3}
NO_SERVER = "http://127.0.0.1:9"
"""The discard port: nothing listens there, so a live-server verb fails its pre-flight at once."""
SECONDS_PER_DRAW = 10
"""A draw still running after this long (a tiny simulation takes well under a second) is a runaway."""
MEMORY_HEADROOM = 3 * 2**30
"""Address space a draw may add to the test process before an allocation fails (a runaway, not the machine's end)."""

BASE: dict[str, list[str]] = {
    "bench": ["--base-url", NO_SERVER, "--num-prompts", "4"],
    "simulate": ["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--num-prompts", "4"],
    "diagnose": [
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2.5-7b",
        "--input-len",
        "200",
        "--output-len",
        "20",
        "--request-rate",
        "1",
    ],
    "tune": [
        "--gpu",
        "a100-80gb",
        "--model",
        "qwen2.5-7b",
        "--n-trials",
        "1",
        "--sim-prompts",
        "4",
        "--num-prompts",
        "4",
        "--goodput",
        "ttft:500",
        "tpot:50",
        "--space",
        "max_num_seqs=64",
    ],
    "compare": ["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--engines", "vllm", "--num-prompts", "4"],
    "calibrate": ["--base-url", NO_SERVER, "--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--out", "profile.json"],
    "validate": ["--base-url", NO_SERVER, "--calibration", "{inputs}/wrong_shape.json"],
    "report": [],
    "schema": [],
}
"""Flags each draw starts from ({inputs}: the directory of `inputs`); a drawn flag given again overrides its base value
(the last one counts)."""

SKIPPED = {
    "help",
    "ray_address",
    "clients",
    "ray_gpu_resource",
    "server_cmd",
    "server_env",
    "server_port",
    "startup_timeout",
    "top_k",
    "gpu_metrics_url",
    "report",
    "resume",
}
"""Flags not drawn: a Ray cluster, a server launched from a generated command line, a scrape of another address,
the HTML report (plotting a tiny run proves nothing here and costs seconds)."""
SMALL_AMOUNTS = {"num_prompts", "sim_prompts", "n_trials", "repeats", "multiturn_turns", "duration", "budget"}
"""Flags that size the work: drawn among small and hostile values, never a large valid one."""

HOSTILE_TEXT = [
    "",
    " ",
    "'",
    '"',
    "a'b",
    'say "hi',
    "--max-num-seqs 'unbalanced",
    "ü✓",
    "x" * 300,
    "0",
    "-1",
    "nan",
    "inf",
    "1e999",
    "none",
    "auto",
    "request-rate=1,nan",
    "max-concurrency=0",
    "ttft:nan",
    "tpot:-5",
]
ENGINE_ARGS = [
    "--max-num-seqs 0",
    "--tensor-parallel-size 0",
    "--tensor-parallel-size -1",
    "--block-size 7",
    "--max-model-len 0",
    "--max-num-batched-tokens 1",
    "--gpu-memory-utilization 1.5",
    "--gpu-memory-utilization nan",
    "--tensor-parallel-size 2 --tp 4",
    "--kv-cache-dtype fp3",
    "--quantization nope",
    "--max-num-seqs 9999999999999999999",
    "--unknown-flag 3",
]
INTS = [0, -1, 1, 3, 2**31, 2**63, 10**30]
FLOATS = [0.0, -0.0, -1.0, 1e-9, 0.5, 2.0, 1e308, math.nan, math.inf, -math.inf]
AMOUNTS = [-1, 0, 1, 2, 4, math.nan, math.inf, -math.inf, 0.5]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files and directories a drawn path may name, outside the working directory (which must stay empty)."""
    root = tmp_path_factory.mktemp("inputs")
    files = {
        "empty_dir": None,
        "bad.json": '{"schema_version": 2, "truncated": [1, 2',
        "bad.yaml": "gpus:\n  - name: [unclosed\n  bad: :",
        "list.json": "[1, 2, 3]",
        "empty.json": "",
        "wrong_shape.json": '{"hardware": 5, "model": "x", "coefficients": "nan"}',
        "binary.bin": "\x00\xff\x00",
        "prompts.jsonl": '{"prompt": "a", "output_len": -3}\n{"prompt": 5}\n',
    }
    for name, content in files.items():
        path = root / name
        if content is None:
            path.mkdir()
        else:
            path.write_text(content, encoding="utf-8", errors="surrogateescape")
    run = root / "run_without_summary"
    run.mkdir()
    (run / "run.json").write_text('{"schema_version": 2, "verb": "simulate", "source": "sim"}')
    return {name: root / name for name in [*files, "run_without_summary", "missing", "missing/dir/x.json"]}


def _option_kind(param: Any) -> type:
    """The flag's value type as typer reads it: int, float, str, Path or bool (Optional and list unwrapped)."""
    annotation = param.type_descriptor.annotation
    while typing.get_origin(annotation) in (typing.Union, list, typing.Optional):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _flags(verb: str) -> list[tuple[str, type]]:
    command = typer.main.get_command(app).get_command(None, verb)  # type: ignore[attr-defined]
    return [
        ((param.opts or [param.name])[0], _option_kind(param)) for param in command.params if param.name not in SKIPPED
    ]


def _names(verb: str) -> list[str]:
    """The verb's flags and arguments as an error may name them: --flag, 'argument' or ARGUMENT."""
    command = typer.main.get_command(app).get_command(None, verb)  # type: ignore[attr-defined]
    return [
        name
        for param in command.params
        for name in (*param.opts, f"'{param.name}'", str(param.name).upper())
        if len(name) > 2
    ]


def _values(flag: str, kind: type, paths: list[str]) -> st.SearchStrategy[list[str]]:
    """The words one drawn flag adds to the command line."""
    name = flag.lstrip("-").replace("-", "_")
    if kind is bool:
        return st.just([flag])
    if name in SMALL_AMOUNTS:
        pool: list[Any] = AMOUNTS
    elif kind is int:
        pool = [*INTS, *FLOATS[3:], "two"]
    elif kind is float:
        pool = [*FLOATS, *INTS, "fast"]
    elif kind is Path:
        pool = [*paths, "out", "out.json", "'quoted dir'", ""]
    elif name in ("engine_args", "vllm_args", "sglang_args", "trtllm_args", "sim_args"):
        pool = [*ENGINE_ARGS, *HOSTILE_TEXT[:8]]
    else:
        pool = [*HOSTILE_TEXT, *paths[:3]]
    value = st.sampled_from(pool).map(lambda v: str(v))
    if not flag.startswith("-"):  # a positional argument
        return value.map(lambda v: [v])
    return value.map(lambda v: [flag, v])


def command_lines(verb: str, inputs: dict[str, Path]) -> st.SearchStrategy[list[str]]:
    paths = [str(p) for p in inputs.values()]
    base = [word.format(inputs=inputs["empty_dir"].parent) for word in BASE[verb]]
    one = st.sampled_from(_flags(verb)).flatmap(lambda fk: _values(fk[0], fk[1], paths))
    return st.lists(one, min_size=0 if verb != "report" else 1, max_size=3).map(
        lambda chosen: [verb, *base, *(word for words in chosen for word in words)]
    )


class Runaway(BaseException):
    """A draw that ran past SECONDS_PER_DRAW (a BaseException: nothing in servelab may catch it as a bug)."""


@contextlib.contextmanager
def bounded(seconds: float, headroom: int) -> Iterator[None]:
    """Run the block with a wall-clock alarm and an address-space limit, both lifted after it."""

    def alarm(signum: int, frame: object) -> None:
        raise Runaway(f"still running after {seconds} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + headroom if hard == resource.RLIM_INFINITY else min(hard, used + headroom)
    previous = signal.signal(signal.SIGALRM, alarm)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def _names_the_input(message: str, argv: list[str], known: list[str]) -> bool:
    """Whether an error message names what it is about: a word the user typed (a value as itself or quoted), or a
    flag or argument of the command (the one missing)."""
    if message.endswith(" --help)"):  # click's own: a flag that does not parse, is missing or unknown, by name
        return True
    words = [*argv[1:], *(part for w in argv[1:] if " " in w.strip() for part in w.split())]  # and inside --engine-args
    typed = [w for w in words if len(w.strip()) > 1 and w.strip() in message]
    return bool(typed) or any(repr(w) in message for w in argv[1:]) or any(name in message for name in known)


def problems(argv: list[str], workdir: Path) -> list[str]:
    """What is wrong with how `servelab ARGV` ended, run in `workdir` (empty); [] when nothing is."""
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        with bounded(SECONDS_PER_DRAW, MEMORY_HEADROOM):
            result = CliRunner().invoke(app, argv)
    except Runaway as exc:
        return [f"runaway: {exc}"]
    finally:
        os.chdir(previous)
    found = []
    output = result.stdout + result.stderr
    if result.exit_code not in ALLOWED_EXITS:
        found.append(f"exit {result.exit_code}")
    if "Traceback" in output or "bug:" in output or (result.exception and not isinstance(result.exception, SystemExit)):
        found.append(
            f"traceback: {type(result.exception).__name__}: {result.exception}"
            if result.exception
            else "traceback printed"
        )
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if len(lines) != 1:
            found.append(f"error on {len(lines)} lines: {result.stderr[:300]!r}")
        elif not _names_the_input(lines[0], argv, _names(argv[0])):
            found.append(f"error names no input: {lines[0][:300]!r}")
        left = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
        if left:
            found.append(f"wrote {left[:5]} on an input error")
    return found


DRAWS_PER_VERB = 20
"""Per verb; with the draws derandomized and not shrunk (a failure is reported as drawn), the test's budget."""


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_command_ends_cleanly_on_any_flag_values(
    verb: str, inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
):
    @settings(
        max_examples=DRAWS_PER_VERB,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=command_lines(verb, inputs))
    def check(argv: list[str]) -> None:
        workdir = tmp_path_factory.mktemp("cwd")
        try:
            found = problems(argv, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # a runaway draw writes hundreds of MB of timeline in its time
        assert not found, f"servelab {shlex.join(argv)}: {'; '.join(found)}"

    check()
