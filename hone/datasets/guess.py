"""Records for the guess-the-number game (`hone.agents.tasks.GuessNumber`): each sets the range
of one game, {"prompt": ..., "lo": 1, "hi": N}; the secret is drawn by the environment from its
seed (run seed, step and episode), so the same record plays a different game each time it is
drawn. Small ranges (N from 3 to 12) keep a game winnable within a few guesses, even at random.
"""

from __future__ import annotations

import random


def guess_number(n: int = 500, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        hi = rng.randint(3, 12)
        out.append({"prompt": f"Guess my number from 1 to {hi}.", "lo": 1, "hi": hi})
    return out


def guess_number_eval() -> list[dict]:
    return guess_number(64, seed=1)
