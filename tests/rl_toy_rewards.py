"""Reward functions the RL recipe tests load by import path ("rl_toy_rewards:NAME")."""

import os
import signal

# Set by a test: the call number (1-based) on which `stop_signal` sends SIGTERM to the process.
STOP_ON_CALL = {"at": None, "calls": 0}


def stop_signal(prompts, completions, **columns):
    """Always 0; sends SIGTERM to this process on the chosen call (a preemption mid-run)."""
    STOP_ON_CALL["calls"] += 1
    if STOP_ON_CALL["at"] == STOP_ON_CALL["calls"]:
        os.kill(os.getpid(), signal.SIGTERM)
    return [0.0] * len(completions)


def one_group_varies(prompts, completions, **columns):
    """1 for every sample whose prompt is the batch's first, with alternating values, else 0:
    only the first group has differing rewards (dynamic sampling must refill the rest)."""
    return [float(p == prompts[0] and i % 2) for i, p in enumerate(prompts)]
