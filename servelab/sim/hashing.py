"""Block hashes for prefix caching, computed in one vectorized pass per prompt.

vLLM chains `hash((parent_hash, block_token_ids))`, so the hash of block k
stands for every token up to the end of block k. We keep that meaning but
compute all of a prompt's block hashes at once: a position-weighted
multilinear sum over the prefix (a running sum, so block k covers tokens
0..(k+1)*block_size-1), then a 64-bit mixer. A per-block Python hash chain
would cost more than the rest of a 10,000-request simulation.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

_MAX_BLOCK_SIZE = 1024
_rng = np.random.default_rng(0x5E5E1AB)
_TOKEN_WEIGHTS = _rng.integers(1, 2**63, size=_MAX_BLOCK_SIZE, dtype=np.uint64) | np.uint64(1)
_BLOCK_WEIGHT = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place: spreads the linear sum over all 64 bits (array arithmetic wraps silently)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


_position_weights = np.zeros(0, dtype=np.uint64)


def _weights_for(num_blocks: int) -> np.ndarray:
    """Per-block-position multipliers, grown on demand and kept (they depend on nothing else)."""
    global _position_weights
    if len(_position_weights) < num_blocks:
        size = max(num_blocks, 2 * len(_position_weights), 4096)
        with np.errstate(over="ignore"):
            _position_weights = _mix(np.arange(1, size + 1, dtype=np.uint64) * _BLOCK_WEIGHT)
    return _position_weights[:num_blocks]


def prompt_block_hashes(prompt_ids: Sequence[int] | np.ndarray, block_size: int) -> list[int]:
    """Hashes of the prompt's full blocks; equal prefixes give equal hashes, block by block."""
    return prompt_block_hashes_many([prompt_ids], block_size)[0]


def prompt_block_hashes_many(prompts: Sequence[Sequence[int] | np.ndarray], block_size: int) -> list[list[int]]:
    """`prompt_block_hashes` of several prompts in one vectorised pass (a few numpy calls for all of them).

    Each prompt's running sum is the running sum over all the prompts minus its
    value where the prompt starts; arithmetic modulo 2^64 makes that exact, so
    the hashes are those of one prompt at a time, bit for bit.
    """
    if block_size > _MAX_BLOCK_SIZE:
        raise ValueError(f"block_size {block_size} exceeds {_MAX_BLOCK_SIZE}")
    arrays = [np.asarray(p) for p in prompts]
    counts = [len(ids) // block_size for ids in arrays]
    total = sum(counts)
    if total == 0:
        return [[] for _ in arrays]
    tokens = np.concatenate(
        [ids[: c * block_size] for ids, c in zip(arrays, counts)], dtype=np.uint64, casting="unsafe"
    )
    prefix = tokens.reshape(total, block_size) @ _TOKEN_WEIGHTS[:block_size]
    prefix += _BLOCK_WEIGHT
    if len(arrays) == 1:
        prefix *= _weights_for(total)
        np.cumsum(prefix, out=prefix)
    else:
        starts = np.cumsum(counts) - counts
        position = np.arange(total) - np.repeat(starts, counts)
        prefix *= _weights_for(max(counts))[position]
        np.cumsum(prefix, out=prefix)
        before = np.zeros(len(counts), dtype=np.uint64)
        nonempty = starts > 0
        before[nonempty] = prefix[starts[nonempty] - 1]
        prefix -= np.repeat(before, counts)
    hashes = _mix(prefix).view(np.int64)
    hashes[hashes == 0] = 1
    flat = hashes.tolist()
    out: list[list[int]] = []
    offset = 0
    for c in counts:
        out.append(flat[offset : offset + c])
        offset += c
    return out


_KEPT_PROMPTS = 16_384
"""Frozen prompts whose hashes are kept (a few KB each): a diagnosis's scenarios, several thousand prompts each."""
_FROZEN: dict[tuple[int, int], tuple[weakref.ref[np.ndarray], list[int]]] = {}


def frozen_root(ids: object) -> np.ndarray | None:
    """The array whose prefix `ids` is, when neither can change (both read-only): its block hashes may be kept
    by identity and shared by every simulation that sends it. None for anything else (a writable prompt)."""
    if not isinstance(ids, np.ndarray) or ids.flags.writeable or ids.ndim != 1 or not ids.flags.c_contiguous:
        return None
    root = ids
    while isinstance(root.base, np.ndarray):
        base = root.base
        if base.ndim != 1 or base.dtype != root.dtype or base.ctypes.data != root.ctypes.data:
            return None
        root = base
    return None if root.flags.writeable or not root.flags.c_contiguous else root


def frozen_hashes(roots: Sequence[np.ndarray], block_size: int) -> list[list[int]]:
    """`prompt_block_hashes` of read-only arrays (from `frozen_root`), each computed once while it lives: a
    diagnosis simulates the same prompts dozens of times. The lists are the cache's: callers copy what they keep."""
    found: list[list[int] | None] = []
    for root in roots:
        entry = _FROZEN.get((id(root), block_size))
        found.append(entry[1] if entry is not None and entry[0]() is root else None)
    todo = [i for i, hashes in enumerate(found) if hashes is None]
    if len(_FROZEN) + len(todo) > _KEPT_PROMPTS:
        _FROZEN.clear()
    for i, hashes in zip(todo, prompt_block_hashes_many([roots[i] for i in todo], block_size)):
        _FROZEN[(id(roots[i]), block_size)] = (weakref.ref(roots[i]), hashes)
        found[i] = hashes
    return [hashes for hashes in found if hashes is not None]


def output_block_hashes(request_uid: int, start: int, stop: int) -> range:
    """Hashes of blocks holding generated tokens (the simulator knows no output ids): unique to the request.

    Small negative numbers, disjoint from one request to the next and, short
    of a 2^-40 accident, from the pseudo-random prompt hashes.
    """
    base = -(request_uid << 24) - 2
    return range(base - start, base - stop, -1)


def output_block_hash_array(request_uids: np.ndarray, block_indices: np.ndarray) -> np.ndarray:
    """`output_block_hashes` element-wise: the hash of block `block_indices[i]` of request `request_uids[i]`."""
    return -(request_uids << 24) - 2 - block_indices
