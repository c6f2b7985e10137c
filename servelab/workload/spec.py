"""The unit of load shared by every target: one request, and the plan that orders them.

A `LoadPlan` is the whole description of a run that a `Target` needs. It is
deliberately free of anything HTTP- or simulator-specific, so the same plan
drives a real server and the simulated engine and their records compare
one-to-one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestSpec:
    """One request as the user would send it.

    `prompt_ids` is the source of truth for length and for prefix sharing
    (the simulator hashes it into KV blocks exactly as vLLM does); `prompt_text`
    and `messages` exist for endpoints that take text.
    """

    index: int
    prompt_ids: Sequence[int] | np.ndarray
    max_tokens: int
    arrival_time: float = 0.0
    """Intended send time, seconds from the start of the run (0 = as soon as allowed)."""
    prompt_text: str | None = None
    messages: list[dict[str, str]] | None = None
    priority: int = 0
    prefix_group: int | None = None
    """Requests in one group share their first `prefix_len` tokens (system prompt, RAG context)."""
    prefix_len: int = 0
    depends_on: int | None = None
    """Index of a request that must finish before this one is sent (the previous chat turn)."""
    think_time: float = 0.0
    """Delay after `depends_on` finishes before this request is sent."""
    conversation: int | None = None
    """The chat this request is a turn of (the `multiturn` dataset's conversations): what a session-affinity router
    keys on, and what `bench` sends in its session header."""
    system_len: int = 0
    """Tokens of the system prompt a chat's prompt opens with (0: none). A chat router's prefix key skips them, as
    KubeAI keys a chat request on its first user message."""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@dataclass(slots=True)
class LoadPlan:
    """How requests are released: by arrival time, capped by concurrency and duration.

    Closed loop is `arrival_time=0` for every request plus `max_concurrency=N`;
    open loop is increasing arrival times, optionally also capped. `requests`
    may be a lazy iterator (for `--duration` runs); it must be ordered by
    arrival time and every `depends_on` must point backwards.
    """

    requests: Iterable[RequestSpec]
    max_concurrency: int | None = None
    duration: float | None = None
    """Stop sending new requests after this many seconds."""
    warmup: float = 0.0
    """Requests sent before this many seconds are excluded from statistics."""
    description: dict[str, Any] = field(default_factory=dict)
