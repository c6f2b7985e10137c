"""SIGINT/SIGTERM as a request to stop a run early, on the running event loop.

A run that is interrupted must still write a record for every request it
released and a summary of what completed, so the signals only set a flag and
cancel work; the default handlers (KeyboardInterrupt, termination) come back
when the run ends.

A client worker process also stops when its parent dies, however it dies
(`stop_with_parent`): a SIGKILLed `bench --workers N` must not leave
workers streaming requests nobody will record.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that created it exits."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signals(on_signal: Callable[[], None]) -> Callable[[], None] | None:
    """Route SIGINT/SIGTERM to `on_signal`; returns the function that restores the previous handlers.

    None off the main thread, where Python cannot install signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in previous:
        loop.add_signal_handler(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)

    return restore


def stop_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """Have `sig` delivered to this process when its parent dies (Linux; elsewhere a no-op).

    `parent_pid` closes the race with a parent that died before the call: this process then stops at once.
    """
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
