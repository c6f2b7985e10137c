"""Waiting for servers a test started to be gone: by process group, since a server's workers outlive its leader."""

from __future__ import annotations

import time

from servelab.targets.server_process import group_alive


def wait_gone(pids: list[int], within: float) -> list[int]:
    """The PIDs whose process group still runs after `within` seconds (a watchdog's grace, then SIGKILL)."""
    deadline = time.monotonic() + within
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if group_alive(pid)]
        time.sleep(0.5)
    return alive
