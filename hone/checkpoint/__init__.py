"""Checkpoints of a run: Orbax save and restore of the whole train state (`manager.py`) and the
content manifests that tell a whole step folder from a damaged one (`manifest.py`).

`python -m hone.checkpoint.manifest verify|write STEP_DIR...` checks step folders by hand, or
adopts ones written before manifests existed.

The names below are loaded on first use rather than imported here: `python -m` runs
`manifest.py` after importing this package, and a package that had already imported it would
make Python warn that the module is loaded twice.
"""

from __future__ import annotations

import importlib

# public name -> the module of this package that defines it
_EXPORTS = {
    "Checkpointer": "manager", "CheckpointError": "manager", "Restored": "manager",
    "ensure_unlocked": "manager",
    "ManifestError": "manifest", "verify_manifest": "manifest", "write_manifest": "manifest",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
