"""A tune candidate as SGLang's or TensorRT-LLM's own launch line: the user's line with the searched knobs changed.

vLLM's candidates are EngineConfig changes re-printed as flags (Deployment.engine_args); the other engines'
are edits of the line itself, so whatever else the user's line holds (the launcher, the model, flags servelab
does not model) stays as it was. A knob is named as its flag (`max_running_requests` is
`--max-running-requests`, `max_batch_size` is trtllm-serve's `--max_batch_size`); None removes the flag so the
engine's default applies.

TensorRT-LLM takes some settings only from its `--extra_llm_api_options` YAML (the capacity scheduler policy),
and that YAML overrides a flag for the same field. A candidate that sets a YAML-only knob, or a flag the user's
YAML also sets, gets a YAML of its own: the user's, with the knob written in and the flag's field taken out,
stored under the study's directory by content (`<sha256 prefix>.yaml`), so the same candidate always names the
same file and a line printed once stays valid.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servelab.perf.engine_flags import FlagTable, parse_flags, split_launcher, with_flag
from servelab.perf.errors import PerfConfigError
from servelab.perf.sglang_args import FLAGS as SGLANG_FLAGS
from servelab.perf.trtllm_args import FLAGS as TRTLLM_FLAGS
from servelab.perf.trtllm_args import YAML_KEY_OF
from servelab.schemas.results import Json
from servelab.sim.engines import SGLANG, TRTLLM
from servelab.tune.errors import TuneError

TABLES: dict[str, FlagTable] = {SGLANG: SGLANG_FLAGS, TRTLLM: TRTLLM_FLAGS}
COMMANDS: dict[str, tuple[str, ...]] = {SGLANG: ("python", "-m", "sglang.launch_server"), TRTLLM: ("trtllm-serve",)}
"""What a printed launch line starts with when the user's --engine-args gave only flags."""
MODEL_FLAG = {SGLANG: "model-path"}
"""Where the model goes on a line that names none (TensorRT-LLM: the positional MODEL)."""
OPTIONS_FLAG = "extra-llm-api-options"
YAML_ONLY: dict[str, tuple[str, ...]] = {"capacity_scheduler_policy": YAML_KEY_OF["capacity_scheduler_policy"]}
"""TensorRT-LLM knobs trtllm-serve has no flag for, and where its YAML sets them."""


def flag_of(knob: str) -> str:
    """The canonical flag a knob of `engine` sets (`max_running_requests` -> `max-running-requests`)."""
    return knob.replace("_", "-")


def engine_line(engine: str, line: str, changes: Mapping[str, object], options_dir: Path | None) -> str:
    """`line` (the engine's flags, with or without its launcher) with each knob of `changes` set or removed.

    `options_dir` is where a TensorRT-LLM candidate's own YAML goes (TuneError if one is needed and none given);
    PerfConfigError when the user's YAML cannot be read.
    """
    table = TABLES[engine]
    tokens = shlex.split(line)
    yaml_changes: dict[tuple[str, ...], object] = {}
    for knob, value in changes.items():
        if knob in YAML_ONLY:
            yaml_changes[YAML_ONLY[knob]] = value
            continue
        flag = flag_of(knob)
        tokens = with_flag(tokens, table, flag, value)
        field = table.modelled[flag].target
        if engine == TRTLLM and field in YAML_KEY_OF:
            yaml_changes[YAML_KEY_OF[field]] = None  # the flag decides: the YAML must not override it
    if yaml_changes:
        tokens = _with_options(tokens, table, yaml_changes, options_dir)
    return shlex.join(tokens)


def _with_options(
    tokens: list[str], table: FlagTable, changes: Mapping[tuple[str, ...], object], options_dir: Path | None
) -> list[str]:
    """`tokens` naming a YAML that is the user's with `changes` made (None removes a key); the user's own file
    when nothing changes, none when nothing is left."""
    given = parse_flags(tokens, table).values.get(table.modelled[OPTIONS_FLAG].target)
    tree = _read(Path(given)) if given else {}
    edited = copy.deepcopy(tree)
    for key, value in changes.items():
        _set(edited, key, value)
    if edited == tree:
        return tokens
    if not edited:
        return with_flag(tokens, table, OPTIONS_FLAG, None)
    if options_dir is None:
        raise TuneError(
            "a TensorRT-LLM candidate needs its own --extra_llm_api_options file, and no directory "
            "was given to write it in"
        )
    text = yaml.safe_dump(edited, sort_keys=True)
    path = options_dir.resolve() / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # Ray workers may write the same file at once
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return with_flag(tokens, table, OPTIONS_FLAG, str(path))


def _read(path: Path) -> Json:
    """The user's --extra_llm_api_options YAML, a nested mapping of TensorRT-LLM's LLM API options, kept as read:
    servelab edits a few keys and writes the rest back untouched."""
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PerfConfigError(f"--extra_llm_api_options {path}: cannot read it ({exc})") from None
    if not isinstance(tree, dict):
        raise PerfConfigError(f"--extra_llm_api_options {path}: expected a mapping of LLM API options")
    return tree


def _set(tree: Json, key: tuple[str, ...], value: object) -> None:
    """Set (or, for None, remove) a nested key; a section emptied by a removal goes too."""
    *parents, leaf = key
    if value is None:
        node: Any = tree
        trail = []
        for part in parents:
            if not isinstance(node.get(part), dict):
                return
            trail.append((node, part))
            node = node[part]
        node.pop(leaf, None)
        for parent, part in reversed(trail):
            if parent[part]:
                break
            del parent[part]
        return
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def launch_line(engine: str, line: str, model: str) -> str:
    """`line` as a command to paste: the engine's launcher in front and `model` named, where the line lacks them."""
    table = TABLES[engine]
    launcher, rest = split_launcher(shlex.split(line), table)
    if "model" not in parse_flags(rest, table).values:
        rest = [model, *rest] if table.positional == "model" else [table.spelled(MODEL_FLAG[engine]), model, *rest]
    return shlex.join([*(launcher or COMMANDS[engine]), *rest])
