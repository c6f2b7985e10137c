"""What every real-server benchmark here shares: where the vLLM CPU build and the tiny model live, and the lock.

The paths are the ones `scripts/test` creates (overridable as in tests/conftest.py); the lock is the
machine-wide one every heavy run of this repository takes (docs/validation.md), the same flock(2) as
`flock /tmp/servelab-heavy.lock CMD`.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path("/tmp/servelab-heavy.lock")
CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
VLLM_PYTHON = Path(os.environ.get("SERVELAB_VLLM_PYTHON", CACHE / "vllm-venv" / "bin" / "python"))
TINY_MODEL = Path(os.environ.get("SERVELAB_TINY_MODEL", CACHE / "tiny-model"))


@contextmanager
def heavy_lock() -> Iterator[None]:
    """Hold the machine-wide heavy-run lock for the block."""
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
