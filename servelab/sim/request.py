"""A request inside the simulated engine.

While a request is RUNNING its token counters live in the scheduler's
arrays (that is what makes a step cost a few numpy calls); the fields here
are authoritative while it is WAITING or FINISHED, and the scheduler copies
them in and out when it admits or removes the request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.sim.hashing import (
    frozen_hashes,
    frozen_root,
    output_block_hashes,
    prompt_block_hashes,
    prompt_block_hashes_many,
)

WAITING = "waiting"
RUNNING = "running"
PREEMPTED = "preempted"
FINISHED = "finished"


@dataclass(slots=True, eq=False)
class SimRequest:
    uid: int
    """Engine-wide arrival order: the tie-break vLLM uses (request id) and the salt of output-block hashes."""
    prompt_ids: Any
    prompt_len: int
    max_tokens: int
    arrival_time: float
    priority: int = 0
    tag: Any = None
    """Whatever the caller needs to map the request back (the RequestSpec)."""
    output_ids: Any = None
    """The tokens it will generate, when the caller knows them (a chat's next turn quotes this reply): its output
    blocks are then hashed as the next turn's prompt blocks, so that turn hits them, as in vLLM; else None."""
    status: str = WAITING
    num_tokens: int = 0
    """Prompt plus output tokens so far (vLLM's num_tokens)."""
    num_computed_tokens: int = 0
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[int] | None = None
    preemptions: int = 0
    schedule_time: float | None = None
    first_token_step: int | None = None
    runs: list[tuple[int, int]] = field(default_factory=list)
    """Closed runs (first step, last step) of consecutive steps that each emitted one token."""
    run_start: int = -1
    last_emit: int = -2
    finish_step: int | None = None

    def __post_init__(self) -> None:
        self.num_tokens = self.prompt_len

    def restart(self) -> None:
        """Back to the queue with nothing computed, its KV dropped by the caller: vLLM's recompute preemption,
        SGLang's retraction and TensorRT-LLM's pause all start the prompt over."""
        self.num_computed_tokens = 0
        self.status = PREEMPTED
        self.preemptions += 1

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.prompt_len

    def findable_blocks(self, block_size: int) -> int:
        """Full blocks whose token ids are known (the prompt's, plus the output's when given): others can hit them."""
        known = self.prompt_len if self.output_ids is None else self.prompt_len + len(self.output_ids)
        return known // block_size

    def hashed_ids(self) -> Any:
        """The token ids its block hashes cover: the prompt, then the output when known."""
        return self.prompt_ids if self.output_ids is None else np.concatenate([self.prompt_ids, self.output_ids])

    def frozen_source(self) -> np.ndarray | None:
        """The read-only array whose prefix `hashed_ids()` is, if there is one (see hashing.frozen_root): the
        prompt; or, with the output known, the next turn's prompt that quotes both (SimTarget's `_quote_reply`)."""
        if self.output_ids is None:
            return frozen_root(self.prompt_ids)
        quoted = self.output_ids
        root = frozen_root(quoted.base) if isinstance(quoted, np.ndarray) else None
        if root is None or root is not quoted.base or not quoted.flags.c_contiguous or quoted.dtype != root.dtype:
            return None
        start = (quoted.ctypes.data - root.ctypes.data) // root.itemsize
        return root if start == self.prompt_len and frozen_root(self.prompt_ids) is not None else None

    def hashes(self, block_size: int, upto: int) -> list[int]:
        """Block hashes of the first `upto` blocks, computed once and extended as output fills blocks."""
        hashes = self.block_hashes
        if hashes is None:
            root = self.frozen_source()
            if root is None:
                hashes = prompt_block_hashes(self.hashed_ids(), block_size)
            else:
                hashes = frozen_hashes([root], block_size)[0][: self.findable_blocks(block_size)]
            self.block_hashes = hashes
        have = len(hashes)
        if upto > have:
            hashes.extend(output_block_hashes(self.uid, have, upto))
        return hashes

    def emitted_steps(self) -> list[tuple[int, int]]:
        """All runs including the open one."""
        if self.run_start < 0:
            return list(self.runs)
        return [*self.runs, (self.run_start, self.last_emit)]


def hash_ahead(reqs: Iterable[SimRequest], block_size: int) -> None:
    """Compute the block hashes of those of `reqs` that have none yet, all in one pass (they are needed later)."""
    todo = [r for r in reqs if r.block_hashes is None]
    if not todo:
        return
    sources = [r.frozen_source() for r in todo]
    fresh = [r for r, root in zip(todo, sources) if root is None]
    if fresh:
        for req, hashes in zip(fresh, prompt_block_hashes_many([r.hashed_ids() for r in fresh], block_size)):
            req.block_hashes = hashes
    if len(fresh) < len(todo):
        frozen = [(r, root) for r, root in zip(todo, sources) if root is not None]
        for (req, _), hashes in zip(frozen, frozen_hashes([root for _, root in frozen], block_size)):
            req.block_hashes = hashes[: req.findable_blocks(block_size)]
