"""The workload every trial is judged on: the same requests for every configuration.

Each trial must see identical requests (common random numbers), otherwise the
ranking measures the dice rather than the configuration. So prompts, output
lengths and unit-rate inter-arrival gaps are drawn once from the seed, and a
request rate only rescales the gaps: the goodput search over the rate then
compares like with like, and feasibility is monotone in the rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

import numpy as np

from servelab.tune.errors import TuneError
from servelab.workload.spec import LoadPlan, RequestSpec


@dataclass(frozen=True)
class TuneWorkload:
    """Random-token prompts as `vllm bench serve --dataset-name random` makes them, optionally with a shared prefix."""

    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    """Lengths uniform in [len*(1-r), len*(1+r)], as vLLM's --random-range-ratio."""
    prefix_len: int = 0
    """Tokens of a shared system prompt in front of every prompt (prefix caching reuses them)."""
    num_prefixes: int = 1
    num_requests: int = 200
    request_rate: float | None = None
    """Poisson arrivals at this rate; None sends all at once (closed loop under max_concurrency)."""
    max_concurrency: int | None = None
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise TuneError("--random-input-len and --random-output-len must be at least 1")
        if not 0 <= self.range_ratio < 1:
            raise TuneError(f"--random-range-ratio must be in [0, 1), got {self.range_ratio}")
        if self.prefix_len < 0 or self.num_prefixes < 1:
            raise TuneError("--prefix-len must be >= 0 and --num-prefixes >= 1")
        if self.num_requests < 1:
            raise TuneError("the number of requests must be at least 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise TuneError(f"--request-rate must be positive, got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise TuneError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.vocab_size < 2:
            raise TuneError("the vocabulary must have at least 2 tokens")

    @property
    def max_request_len(self) -> int:
        """The longest prompt + output this workload can send: what max_model_len must hold."""
        spread = 1 + self.range_ratio
        return self.prefix_len + int(np.ceil(self.input_len * spread)) + int(np.ceil(self.output_len * spread))

    @cached_property
    def _draws(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        n = self.num_requests

        def lengths(mean: int) -> np.ndarray:
            if self.range_ratio == 0:
                return np.full(n, mean, dtype=np.int64)
            low = int(np.floor(mean * (1 - self.range_ratio)))
            high = int(np.ceil(mean * (1 + self.range_ratio)))
            return np.maximum(rng.integers(low, high + 1, size=n), 1)

        inputs, outputs = lengths(self.input_len), lengths(self.output_len)
        prefixes = rng.integers(0, self.vocab_size, size=(self.num_prefixes, self.prefix_len))
        groups = rng.integers(0, self.num_prefixes, size=n)
        prompts = [
            np.concatenate([prefixes[groups[i]], rng.integers(0, self.vocab_size, size=inputs[i])]).astype(np.int64)
            for i in range(n)
        ]
        gaps = rng.exponential(1.0, size=n)
        return prompts, outputs, groups if self.prefix_len else np.full(n, -1), gaps

    def plan(self, rate: float | None = None, *, burst: bool = False, open_loop: bool = False) -> LoadPlan:
        """The requests as a LoadPlan at `rate` (default: the workload's own); `burst` sends all at once.

        `open_loop` drops the concurrency cap: the goodput search asks what the
        server sustains, not what a capped client can send.
        """
        prompts, outputs, groups, gaps = self._draws
        rate = None if burst else (rate or self.request_rate)
        arrivals = np.zeros(len(prompts))
        if rate:
            arrivals = np.cumsum(gaps) / rate
            arrivals -= arrivals[0]  # the first request goes at once, as vllm bench serve does
        specs = [
            RequestSpec(
                index=i,
                prompt_ids=prompts[i].tolist(),
                max_tokens=int(outputs[i]),
                arrival_time=float(arrivals[i]),
                prefix_group=int(groups[i]) if groups[i] >= 0 else None,
                prefix_len=self.prefix_len if groups[i] >= 0 else 0,
            )
            for i in range(len(prompts))
        ]
        return LoadPlan(specs, max_concurrency=None if open_loop else self.max_concurrency, description=self.describe() | {"rate": rate})

    def with_(self, **changes: object) -> TuneWorkload:
        return replace(self, **changes)

    def describe(self) -> dict[str, object]:
        return {"dataset": "random", **asdict(self)}
