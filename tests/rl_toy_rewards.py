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


# Calls of `varies_on_first_call` so far in this process; a test sets it to 0 before a run.
FIRST_CALL = {"calls": 0}


def varies_on_first_call(prompts, completions, **columns):
    """The first call: 0, 1, 0, 1, ... (every group of an even size has rewards that differ);
    every later call: all 0 (no group differs, so every advantage is 0)."""
    FIRST_CALL["calls"] += 1
    return [float(FIRST_CALL["calls"] == 1 and i % 2) for i in range(len(completions))]
