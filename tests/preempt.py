"""A preemption inside a recipe's run: SIGTERM to this process when the loop draws a given
training batch, for the in-process exact-resume tests of the recipes."""

from __future__ import annotations

import os
import signal


def stop_on_batch(monkeypatch, recipe, at: int) -> None:
    """Wrap `recipe.run_loop` (a recipe module) so that drawing training batch `at` sends
    SIGTERM to this process; the loop saves a checkpoint and raises Interrupted."""
    real = recipe.run_loop

    def run_loop(spec, cfg, run_dir):
        data, calls = spec.data, [0]

        class Stopping:
            def next(self):
                calls[0] += 1
                if calls[0] == at:
                    os.kill(os.getpid(), signal.SIGTERM)
                return data.next()

            def __getattr__(self, name):
                return getattr(data, name)

        spec.data = Stopping()
        return real(spec, cfg, run_dir)

    monkeypatch.setattr(recipe, "run_loop", run_loop)
