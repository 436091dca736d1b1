"""Module-level tools for the agent tests: worker processes import them by reference, so they live
in a small module without pytest or hypothesis (each worker imports it once)."""

import os
import time


def add(a: int, b: int = 1) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def echo(text: str) -> str:
    """Repeat the text.

    Args:
        text: What to repeat.
    """
    return text


def sleepy(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def broken(x: int) -> str:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise RuntimeError(f"broken on {x}")


def nothing() -> None:
    """Returns None, which is not text."""
    return None


def crash() -> str:
    """Kills its own process."""
    os._exit(3)


def pid() -> int:
    """The id of the process the tool runs in."""
    return os.getpid()
