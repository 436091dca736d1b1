"""A tool module that takes a while to import (as one that imports numpy or loads a model):
the tests check that a worker's import of it does not count against a call's timeout."""

import os
import time

IMPORT_S = 1.5
time.sleep(IMPORT_S)


def worker_pid() -> str:
    """Which worker process ran the call."""
    return str(os.getpid())
