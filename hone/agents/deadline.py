"""A time limit on an environment's reset or step, without a thread per call.

SIGALRM raises `EnvTimeout` inside the running Python code when the time is up (a pure-Python
hang: a loop, a sleep, a blocking call that Python can interrupt); the handler and the timer are
restored after the block. Signal handlers run in the main thread only, so elsewhere the block
runs without a limit. Tools, which may hang in C, run in killable worker processes instead
(`hone.agents.tool_runner.ToolRunner`).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class EnvTimeout(Exception):
    """An environment's reset or step ran past its time."""


@contextmanager
def deadline(seconds: float | None):
    """Raise EnvTimeout inside the block after `seconds` (SIGALRM; main thread only, where
    Python runs signal handlers; elsewhere no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise EnvTimeout(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
