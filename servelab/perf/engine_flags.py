"""A launch line of another engine (SGLang, TensorRT-LLM) read against that engine's own flag table.

vLLM's parser (engine_args.py) refuses a flag vLLM would refuse, because it
checks against vLLM's full flag list. For SGLang and TensorRT-LLM servelab
holds only the flags that matter to the model plus the common harmless ones,
so a flag it does not know is reported (`unknown`), never silently dropped
and never fatal: the engine may well accept it. A flag the engine removed is
reported with what replaced it (`obsolete`).
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from servelab.perf.errors import PerfConfigError


@dataclass(frozen=True, slots=True)
class Flag:
    """One modelled flag: the settings field it sets and how its text becomes a value (None: an on/off switch)."""

    target: str
    convert: Callable[[str], Any] | None = None
    switch_value: bool = True
    """For a switch: the value a bare `--flag` sets (False for `--disable-x` flags that set `x_enabled`)."""


@dataclass(frozen=True, slots=True)
class FlagTable:
    """An engine's command line as servelab knows it."""

    engine: str
    launchers: tuple[tuple[str, ...], ...]
    modelled: dict[str, Flag]
    obsolete: dict[str, str]
    """Removed flag -> what replaced it."""
    not_modelled: frozenset[str]
    """Flags that change performance in ways the model leaves out: accepted, simulated as absent, warned about."""
    harmless: frozenset[str]
    """Flags with no effect on performance (host, port, logging...): accepted silently."""
    switches: frozenset[str] = frozenset()
    """Unmodelled flags that take no value (so the argument after them is not eaten as theirs)."""
    aliases: dict[str, str] = field(default_factory=dict)
    positional: str | None = None
    """The settings field a positional argument sets (the model), if the engine takes one."""
    separator: str = "-"
    """How the engine joins a flag's words (`--max-running-requests`; TensorRT-LLM's `--max_batch_size`)."""

    def spelled(self, name: str) -> str:
        """A canonical flag name (`max-batch-size`) as the engine's own help spells it."""
        return "--" + name.replace("-", self.separator)


@dataclass(slots=True)
class ParsedFlags:
    values: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    obsolete: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


Settings = TypeVar("Settings")


@dataclass(slots=True)
class ParsedLaunch(Generic[Settings]):
    """An engine's launch line as its settings, with what the model leaves out (each engine's parser returns one)."""

    settings: Settings
    warnings: list[str] = field(default_factory=list)
    obsolete: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _canonical(token: str, table: FlagTable) -> str:
    name = token.lstrip("-").replace("_", "-")
    return table.aliases.get(name, name)


def split_launcher(tokens: Sequence[str], table: FlagTable) -> tuple[list[str], list[str]]:
    """(the launcher the line starts with, if any: `python -m sglang.launch_server`; the rest)."""
    for launcher in table.launchers:
        if tuple(tokens[: len(launcher)]) == launcher:
            return list(launcher), list(tokens[len(launcher) :])
    return [], list(tokens)


def with_flag(line: str | Sequence[str], table: FlagTable, name: str, value: object) -> list[str]:
    """`line` with the modelled flag `name` (canonical: `max-running-requests`) set to `value`, however and
    wherever the line spelled it (an alias, `--flag=value`, once or twice): every occurrence is dropped and the
    flag appended once; None, or False for a switch, leaves it out; True gives a switch bare.

    A value starting with '-' (SGLang's `--chunked-prefill-size -1`) is written `--flag=-1`, the one form
    `parse_flags` does not read as a missing value.
    """
    spec = table.modelled[name]
    launcher, rest = split_launcher(shlex.split(line) if isinstance(line, str) else list(line), table)
    kept: list[str] = []
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        flag, eq, _ = token.partition("=")
        if token.startswith("-") and _canonical(flag, table) == name:
            if not eq and spec.convert is not None and i < len(rest) and not rest[i].startswith("-"):
                i += 1  # its value
            continue
        kept.append(token)
    if value is None or value is False:
        return launcher + kept
    if value is True and spec.convert is None:
        return [*launcher, *kept, table.spelled(name)]
    text = str(value)
    flag_tokens = [f"{table.spelled(name)}={text}"] if text.startswith("-") else [table.spelled(name), text]
    return [*launcher, *kept, *flag_tokens]


def parse_flags(line: str | Sequence[str], table: FlagTable) -> ParsedFlags:
    """Read `line` against `table`; PerfConfigError only for a modelled flag with a missing or bad value."""
    tokens = split_launcher(shlex.split(line) if isinstance(line, str) else list(line), table)[1]
    known = set(table.modelled) | set(table.obsolete) | table.not_modelled | table.harmless
    out = ParsedFlags()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            if table.positional is None or table.positional in out.values:
                raise PerfConfigError(f"unexpected argument {token!r} in the {table.engine} flags")
            out.values[table.positional] = token
            continue
        flag, eq, inline = token.partition("=")
        name = _canonical(flag, table)
        takes_value = not eq and name not in table.switches and i < len(tokens) and not tokens[i].startswith("-")
        spec = table.modelled.get(name)
        convert = spec.convert if spec is not None else None
        if spec is not None and convert is None:  # a switch
            if eq:
                raise PerfConfigError(f"{flag} is an on/off switch of {table.engine} and takes no value")
            out.values[spec.target] = spec.switch_value
            continue
        if spec is not None and convert is not None:
            if not eq:
                if not takes_value:
                    raise PerfConfigError(f"{table.engine} flag {flag} needs a value")
                inline = tokens[i]
                i += 1
            try:
                out.values[spec.target] = convert(inline)
            except ValueError as exc:
                raise PerfConfigError(f"bad value {inline!r} for {table.engine} flag {flag}: {exc}") from None
            continue
        if takes_value and not eq:
            i += 1  # an unmodelled flag's value
        if name in table.obsolete:
            out.obsolete.append(flag)
            out.warnings.append(f"{flag} is obsolete in {table.engine}: {table.obsolete[name]}")
        elif name in table.not_modelled:
            out.warnings.append(
                f"{flag} changes {table.engine}'s performance but is not modelled; simulated as if absent"
            )
        elif name in table.harmless:
            out.ignored.append(flag)
        else:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            out.unknown.append(flag)
            out.warnings.append(f"{flag} is not a {table.engine} flag servelab knows{hint}; simulated as if absent")
    return out


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def fraction(text: str) -> float:
    """A share of something (memory, a ratio) in (0, 1]; vLLM's parser uses it too."""
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be in (0, 1]")
    return value


def choice(*options: str) -> Callable[[str], str]:
    """A converter that accepts exactly `options`; vLLM's parser uses it too."""

    def convert(text: str) -> str:
        if text not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return text

    return convert


def set_flag(line: str, table: FlagTable, flag: str, value: object) -> str:
    """`line` with `flag` (as spelled: `--max-running-requests`) set to `value`, as `with_flag` does it.

    A what-if on another engine's deployment is shown as the launch line the user would run, so a change replaces
    the flag the user gave rather than repeating it.
    """
    return shlex.join(with_flag(line, table, _canonical(flag, table), value))
