"""Request generators behind `--dataset-name`, deterministic under a seed.

Every generator yields RequestSpecs with `arrival_time = 0` in index order;
`servelab.workload.arrival` gives them their send times afterwards. Trace
files (jsonl with timestamps) are the exception: their times come with
them. Specs are made in chunks with numpy so that 10,000 long prompts cost
milliseconds without a tokenizer; `prompt_ids` are int32 numpy arrays (the
prefix of a `prefix` request is a copy of its group's ids, so equal values,
which is what prefix caching keys on).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import count as counter
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from servelab.workload.errors import WorkloadError
from servelab.workload.lengths import LengthDistribution
from servelab.workload.spec import RequestSpec
from servelab.workload.tokenizer import CHARS_PER_TOKEN, PromptTokenizer, estimate_tokens, synthetic_ids
from servelab.schemas.vocabulary import DATASETS, FILE_DATASETS

CHUNK = 1024
"""Specs generated per numpy batch: big enough to amortise, small enough to stay lazy."""
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048
"""vLLM's ShareGPT filter: drop pairs too short to time or too long for a 2k context."""


@dataclass(frozen=True)
class WorkloadConfig:
    """What users send; the defaults are `vllm bench serve`'s."""

    dataset_name: str = "random"
    dataset_path: Path | None = None
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    length_distribution: str = "uniform"
    prefix_len: int = 0
    num_prefixes: int = 1
    turns: int = 3
    think_time: float = 0.0
    seed: int = 0
    tokenizer: Path | None = None

    def __post_init__(self) -> None:
        if self.dataset_name not in DATASETS:
            raise WorkloadError(f"unknown --dataset-name {self.dataset_name!r}; use one of {', '.join(DATASETS)}")
        if self.dataset_name in FILE_DATASETS and self.dataset_path is None:
            raise WorkloadError(f"--dataset-name {self.dataset_name} needs --dataset-path")
        if self.dataset_name not in FILE_DATASETS and self.dataset_path is not None:
            raise WorkloadError(
                f"--dataset-path is only read by --dataset-name {' or '.join(FILE_DATASETS)}, not {self.dataset_name}"
            )
        if self.dataset_name == "prefix" and (self.prefix_len < 1 or self.num_prefixes < 1):
            raise WorkloadError("--dataset-name prefix needs --prefix-len >= 1 and --num-prefixes >= 1")
        if self.prefix_len < 0 or self.num_prefixes < 1:
            raise WorkloadError("--prefix-len must be >= 0 and --num-prefixes >= 1")
        if self.turns < 1 or self.think_time < 0:
            raise WorkloadError("--multiturn-turns must be >= 1 and --multiturn-think-time >= 0")

    def tokens_per_request(self) -> float | None:
        """The most prompt + output tokens one request may hold (a length's top is mean x (1 + ratio); a chat turn
        resends every earlier turn); None where a file sets the lengths."""
        if self.dataset_name in FILE_DATASETS:
            return None
        spread = 1 + self.range_ratio if self.length_distribution == "uniform" else 1 + 3 * self.range_ratio
        turn = (self.input_len + self.output_len) * spread
        prefix = self.prefix_len if self.dataset_name in ("prefix", "multiturn") else 0
        return prefix + turn * (self.turns if self.dataset_name == "multiturn" else 1)

    def input_lengths(self) -> LengthDistribution:
        return LengthDistribution(self.input_len, self.length_distribution, self.range_ratio)

    def output_lengths(self) -> LengthDistribution:
        return LengthDistribution(self.output_len, self.length_distribution, self.range_ratio)


@lru_cache(maxsize=4)
def load_tokenizer(path: Path) -> PromptTokenizer:
    """Cached: a sweep rebuilds its plan once per point."""
    return PromptTokenizer(path)


@dataclass(frozen=True, slots=True)
class _Row:
    text: str | None
    ids: np.ndarray | None
    messages: list[dict[str, str]] | None
    max_tokens: int
    timestamp: float | None


class DatasetNotes(TypedDict, total=False):
    """What a dataset learns while it is read or generated, added to its description in run.json."""

    lengths_estimated: str
    """Prompt lengths counted without a tokenizer (estimated from characters)."""
    requests_in_file: int
    conversations_in_file: int
    inexact_prompt_lengths: int
    """Prompts whose token count a tokenizer round trip could not hit exactly."""


@dataclass
class Dataset:
    """A request generator plus what run.json should say about it."""

    config: WorkloadConfig
    rng: np.random.Generator
    tokenizer: PromptTokenizer | None
    notes: DatasetNotes = field(default_factory=lambda: DatasetNotes())
    timestamps: bool = False
    """True when the specs carry their own arrival times (trace replay)."""
    text_prompts: bool = False
    """True when the prompt text is the data (sharegpt/jsonl), so it is what a server should be sent."""
    pairs: list[tuple[str, str]] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)

    def specs(self, count: int | None) -> Iterator[RequestSpec]:
        """`count` specs, or an endless stream when None (the caller bounds it)."""
        name = self.config.dataset_name
        if name == "random":
            return _take(self._random(), count)
        if name == "prefix":
            return _take(self._prefix(), count)
        if name == "multiturn":
            return _take(self._multiturn(), count)
        if name == "sharegpt":
            return _take(self._sharegpt(), count)
        return _take(self._jsonl(), count)

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        out: dict[str, Any] = {"dataset_name": cfg.dataset_name, "seed": cfg.seed}
        if cfg.dataset_path is not None:
            out["dataset_path"] = str(cfg.dataset_path)
        if cfg.dataset_name in ("random", "prefix", "multiturn"):
            out["input_len"] = cfg.input_lengths().describe()
            out["output_len"] = cfg.output_lengths().describe()
        if cfg.dataset_name == "prefix":
            out.update(prefix_len=cfg.prefix_len, num_prefixes=cfg.num_prefixes)
        if cfg.dataset_name == "multiturn":
            out.update(
                turns=cfg.turns,
                think_time=cfg.think_time,
                system_prompt_len=cfg.prefix_len,
                system_prompts=cfg.num_prefixes if cfg.prefix_len else 0,
            )
        out["tokenizer"] = str(cfg.tokenizer) if cfg.tokenizer else None
        out["token_ids"] = "tokenizer" if self.tokenizer else "synthetic ids in [1000, 4000), no text"
        out.update(self.notes)
        return out

    # -- pieces -----------------------------------------------------------

    def _texts(self, lengths: np.ndarray) -> tuple[list[np.ndarray], list[str] | None]:
        """Token ids of the given lengths, with exact-length text when there is a tokenizer."""
        if self.tokenizer is None:
            flat = synthetic_ids(int(lengths.sum()), self.rng)
            return np.split(flat, np.cumsum(lengths)[:-1]), None
        ids, texts, off = self.tokenizer.exact_prompts(lengths, self.rng)
        if off:
            self.notes["inexact_prompt_lengths"] = self.notes.get("inexact_prompt_lengths", 0) + off
        return ids, texts

    def _random(self) -> Iterator[RequestSpec]:
        index = counter()
        while True:
            ins = self.config.input_lengths().sample(CHUNK, self.rng)
            outs = self.config.output_lengths().sample(CHUNK, self.rng)
            ids, texts = self._texts(ins)
            for k in range(CHUNK):
                text = texts[k] if texts else None
                yield RequestSpec(
                    index=next(index),
                    prompt_ids=ids[k],
                    max_tokens=int(outs[k]),
                    prompt_text=text,
                    messages=[{"role": "user", "content": text}] if text is not None else None,
                )

    def _prefix(self) -> Iterator[RequestSpec]:
        cfg = self.config
        prefix_ids, prefix_texts = self._texts(np.full(cfg.num_prefixes, cfg.prefix_len))
        index = counter()
        while True:
            groups = self.rng.integers(0, cfg.num_prefixes, size=CHUNK)
            ins = cfg.input_lengths().sample(CHUNK, self.rng)
            outs = cfg.output_lengths().sample(CHUNK, self.rng)
            ids, texts = self._texts(ins)
            for k in range(CHUNK):
                g = int(groups[k])
                spec = RequestSpec(
                    index=next(index),
                    prompt_ids=np.concatenate([prefix_ids[g], ids[k]]),
                    max_tokens=int(outs[k]),
                    prefix_group=g,
                    prefix_len=cfg.prefix_len,
                )
                if texts is not None and prefix_texts is not None:
                    spec.prompt_text = prefix_texts[g] + texts[k]
                    spec.messages = [
                        {"role": "system", "content": prefix_texts[g]},
                        {"role": "user", "content": texts[k]},
                    ]
                yield spec

    def _multiturn(self) -> Iterator[RequestSpec]:
        """Conversations in index order (the arrival schedule overlaps them); turn k resends turns < k plus their
        (synthetic) replies. With --prefix-len, each conversation opens with one of --num-prefixes system prompts,
        picked at random: the prompt head many conversations share, as a deployment's few system prompts are."""
        cfg = self.config
        turns = cfg.turns
        systems, system_texts = self._texts(np.full(cfg.num_prefixes, cfg.prefix_len)) if cfg.prefix_len else ([], None)
        index = counter()
        conversation = counter()
        per_chunk = max(1, CHUNK // turns)
        while True:
            users = cfg.input_lengths().sample(per_chunk * turns, self.rng)
            outs = cfg.output_lengths().sample(per_chunk * turns, self.rng)
            user_ids, user_texts = self._texts(users)
            # A reply of turn k's output length stands in for what the server answered.
            reply_ids, reply_texts = self._texts(outs)
            picks = (
                self.rng.integers(0, cfg.num_prefixes, size=per_chunk) if systems else None
            )  # no draw: same runs as before
            for c in range(per_chunk):
                conv = next(conversation)
                history: list[np.ndarray] = [systems[picks[c]]] if picks is not None else []
                messages: list[dict[str, str]] = (
                    [{"role": "system", "content": system_texts[picks[c]]}]
                    if system_texts is not None and picks is not None
                    else []
                )
                previous: int | None = None
                for t in range(turns):
                    k = c * turns + t
                    history.append(user_ids[k])
                    if user_texts is not None:
                        messages.append({"role": "user", "content": user_texts[k]})
                    prompt = np.concatenate(history)
                    idx = next(index)
                    yield RequestSpec(
                        index=idx,
                        prompt_ids=prompt,
                        max_tokens=int(outs[k]),
                        prompt_text="".join(m["content"] for m in messages) if messages else None,
                        messages=list(messages) if messages else None,
                        prefix_group=conv,
                        prefix_len=len(prompt) - len(user_ids[k]),
                        depends_on=previous,
                        think_time=cfg.think_time if previous is not None else 0.0,
                        conversation=conv,
                        system_len=len(systems[picks[c]]) if picks is not None else 0,
                    )
                    previous = idx
                    history.append(reply_ids[k])
                    if reply_texts is not None:
                        messages.append({"role": "assistant", "content": reply_texts[k]})

    def _encode_texts(self, texts: list[str]) -> list[np.ndarray]:
        """Real ids with a tokenizer; otherwise synthetic ids of the ~4 chars/token estimate."""
        if self.tokenizer is not None:
            return self.tokenizer.encode_batch(texts)
        lengths = np.asarray([estimate_tokens(t) for t in texts], dtype=np.int64)
        flat = synthetic_ids(int(lengths.sum()), self.rng)
        return np.split(flat, np.cumsum(lengths)[:-1]) if texts else []

    def _sharegpt(self) -> Iterator[RequestSpec]:
        """vLLM's loader: first human turn as prompt, the reply's length as max_tokens, seeded shuffle, oversampled."""
        path = self.config.dataset_path
        pairs = self.pairs
        order = self.rng.permutation(len(pairs))
        index = counter()
        kept = 0
        while True:
            for start in range(0, len(order), CHUNK):
                chosen = [pairs[i] for i in order[start : start + CHUNK]]
                prompts = self._encode_texts([p for p, _ in chosen])
                if self.tokenizer is not None:
                    out_lens = [len(ids) for ids in self.tokenizer.encode_batch([r for _, r in chosen])]
                else:
                    out_lens = [estimate_tokens(r) for _, r in chosen]
                for (text, _), ids, out_len in zip(chosen, prompts, out_lens):
                    if not _sharegpt_fits(len(ids), out_len):
                        continue
                    kept += 1
                    yield RequestSpec(
                        index=next(index),
                        prompt_ids=ids,
                        max_tokens=out_len,
                        prompt_text=text,
                        messages=[{"role": "user", "content": text}],
                    )
            if kept == 0:
                raise WorkloadError(
                    f"{path}: no conversation passes vLLM's ShareGPT filter "
                    f"(prompt and reply >= {SHAREGPT_MIN_LEN} tokens, prompt <= {SHAREGPT_MAX_PROMPT}, "
                    f"total <= {SHAREGPT_MAX_TOTAL})"
                )

    def _jsonl(self) -> Iterator[RequestSpec]:
        """File order, no repetition: a trace is replayed as it was recorded."""
        rows = self.rows
        t0 = rows[0].timestamp or 0.0
        index = counter()
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            texts = [r.text for r in chunk if r.ids is None]
            encoded = iter(self._encode_texts(texts))
            for row in chunk:
                ids = row.ids if row.ids is not None else next(encoded)
                yield RequestSpec(
                    index=next(index),
                    prompt_ids=ids,
                    max_tokens=row.max_tokens,
                    arrival_time=(row.timestamp - t0) if row.timestamp is not None else 0.0,
                    prompt_text=row.text,
                    messages=row.messages,
                )


def _take(specs: Iterator[RequestSpec], count: int | None) -> Iterator[RequestSpec]:
    if count is None:
        yield from specs
        return
    for spec in specs:
        if spec.index >= count:
            return
        yield spec


def _sharegpt_fits(prompt_len: int, output_len: int) -> bool:
    return (
        prompt_len >= SHAREGPT_MIN_LEN
        and output_len >= SHAREGPT_MIN_LEN
        and prompt_len <= SHAREGPT_MAX_PROMPT
        and prompt_len + output_len <= SHAREGPT_MAX_TOTAL
    )


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from exc


def _read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(first human turn, first reply) of every entry with at least two turns."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} entries")
    pairs = []
    for n, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or not all(
            isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns
        ):
            raise WorkloadError(
                f"{path}: entry {n} (0-based) needs 'conversations': a list of {{'from': ..., 'value': str}}"
            )
        if len(turns) >= 2:
            pairs.append((turns[0]["value"], turns[1]["value"]))
    if not pairs:
        raise WorkloadError(f"{path}: no conversation with at least two turns")
    return pairs


def _read_jsonl(path: Path) -> list[_Row]:
    """Every line parsed and checked up front, so a bad line fails the run before any load is sent."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    rows: list[_Row] = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            rows.append(_parse_row(path, lineno, line, rows[-1].timestamp if rows else None, first=not rows))
    if not rows:
        raise WorkloadError(f"{path}: no requests (the file is empty)")
    return rows


def _parse_row(path: Path, lineno: int, line: str, previous_ts: float | None, first: bool) -> _Row:
    where = f"{path}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: each line must be a JSON object")
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if (prompt is None) == (messages is None):
        raise WorkloadError(f"{where}: give exactly one of 'prompt' (text or token ids) and 'messages'")
    text: str | None = None
    ids: np.ndarray | None = None
    if isinstance(prompt, str):
        text = prompt
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt)
    ):
        ids = np.asarray(prompt, dtype=np.int32)
    elif prompt is not None:
        raise WorkloadError(f"{where}: 'prompt' must be a string or a non-empty list of token ids")
    if messages is not None:
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise WorkloadError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
        text = "\n".join(m["content"] for m in messages)
    max_tokens = obj.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise WorkloadError(f"{where}: 'max_tokens' must be an integer >= 1")
    ts = obj.get("timestamp")
    if ts is not None and (not isinstance(ts, (int, float)) or isinstance(ts, bool)):
        raise WorkloadError(f"{where}: 'timestamp' must be a number of seconds")
    if not first and (ts is None) != (previous_ts is None):
        raise WorkloadError(f"{where}: either every line has a 'timestamp' or none does")
    if ts is not None and previous_ts is not None and ts < previous_ts:
        raise WorkloadError(f"{where}: timestamps must not decrease ({ts} after {previous_ts})")
    return _Row(text, ids, messages, max_tokens, float(ts) if ts is not None else None)


def open_dataset(config: WorkloadConfig, rng: np.random.Generator) -> Dataset:
    """The generator for `config`; file datasets are read and checked here, before any load."""
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer is not None else None
    dataset = Dataset(config, rng, tokenizer, text_prompts=config.dataset_name in FILE_DATASETS)
    if dataset.text_prompts and tokenizer is None:
        dataset.notes["lengths_estimated"] = (
            f"token counts estimated at ~{CHARS_PER_TOKEN:g} chars/token: pass --tokenizer for exact counts"
        )
    if config.dataset_name == "jsonl":
        assert config.dataset_path is not None
        dataset.rows = _read_jsonl(config.dataset_path)
        dataset.timestamps = dataset.rows[0].timestamp is not None
        dataset.notes["requests_in_file"] = len(dataset.rows)
    elif config.dataset_name == "sharegpt":
        assert config.dataset_path is not None
        dataset.pairs = _read_sharegpt(config.dataset_path)
        dataset.notes["conversations_in_file"] = len(dataset.pairs)
    return dataset
