"""SIGINT/SIGTERM as a request to stop a run early, on the running event loop.

A run that is interrupted must still write a record for every request it
released and a summary of what completed, so the signals only set a flag and
cancel work; the default handlers (KeyboardInterrupt, termination) come back
when the run ends.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

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
