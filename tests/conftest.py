"""Shared test set-up: tests/ is importable (reference models), JAX stays quiet, and the slowest
tests are collected first.

`make test` runs two workers; a long test that starts last keeps one worker busy while the other
has nothing left to do. The files below (subprocess families, real models, recipes: each
measured at a minute or more, `make test` lists the slowest at its end) go first, slowest
family first; every other test keeps its place after them.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

SLOW_FIRST = (
    "train/test_fault_script.py",
    "parallel/test_roles.py",
    "parallel/test_mesh_parity.py",
    "parallel/test_real_model_mesh.py",
    "recipes/test_distill_recipe.py",
    "recipes/test_rl_recipes.py",
    "recipes/test_dpo_recipe.py",
    "recipes/test_moe_recipes.py",
    "recipes/test_kto_recipe.py",
    "train/test_resume.py",
    "parallel/test_ring_attention.py",
    "recipes/test_online_dpo.py",
    "test_device_check.py",
    "plan/test_plan.py",
    "models/test_moe.py",
    "agents/test_failures.py",
    "agents/test_agent_recipes.py",
    "agents/test_episode_update.py",
    "models/test_scan_layers.py",
    "weights/test_shipped.py",
    "test_pipeline.py",
    "sampling/test_generate.py",
    "models/test_real_models.py",
    "test_tokenizer.py",
    "parallel/test_profile.py",
    "sampling/test_long.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: the order within a file and among the rest is kept


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def _maps_in_use() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


MAP_LIMIT = _map_limit()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Frees the worker's compiled programs after a test file once they hold a third of its maps.

    Every program XLA compiles for the CPU lives in three memory maps (code, constants, data)
    for as long as a jitted function holds it, and a worker runs hundreds of files: measured on
    2026-12-06, one worker held 13,700 programs (42,600 maps) halfway through the suite. At the
    kernel's limit (vm.max_map_count, 65,530 by default) the next compile's mmap fails and XLA
    crashes the worker with a segfault, in whichever test compiles then (it passed alone; a
    worker crashed so at 65,250 maps). Once the maps pass a third of the limit (one test file
    added up to 12,000), `jax.clear_caches()` drops every cached program; a later test
    that needs one compiles it again (from the suite's compilation cache), the same executable.
    """
    yield
    if MAP_LIMIT and _maps_in_use() > MAP_LIMIT // 3:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
