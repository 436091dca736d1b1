"""Shared test set-up: tests/ is importable (reference models), and JAX stays quiet."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# The few tests that take a minute or more (whole training runs in subprocesses) go first:
# pytest-xdist hands tests out in collection order, so a long test collected last would keep
# one worker busy while the other sits idle at the end of the run.
FIRST = ("tests/parallel/test_mesh_parity.py", "tests/parallel/test_roles.py",
         "tests/train/test_resume.py", "tests/train/test_fault_script.py",
         "tests/parallel/test_multiprocess.py", "tests/test_pipeline.py",
         "tests/recipes/test_rl_recipes.py::test_sigterm", "tests/parallel/test_profile.py",
         "tests/fuzz/")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
