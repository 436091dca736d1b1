"""Shared pieces of the agent tests: a scripted environment, end tokens that make the random tiny
model's turns end early, and the examples it plays."""

from __future__ import annotations

import os
import signal

from hone.agents import Step
from hone.agents.tasks import GuessNumber

# A random tiny model almost never samples <|im_end|>: ending a turn on any of these 40 byte
# ids gives turns of varied lengths (rows that end early leave gaps in the lockstep cache).
ENDS = tuple(range(40)) + (260,)
# Every rollout test plays with these limits and 4 rows (8 with copies): one set of programs.
KW = dict(max_turns=4, max_new_tokens=10, max_episode_tokens=256, max_env_tokens=64, top_k=50,
          eos_ids=ENDS)


class Counter:
    """Answers every turn with a short user message; done after example['turns'] replies;
    reward 1 per turn."""

    tools = None

    def seed(self, seed):
        self.secret = seed % 97

    def reset(self, example):
        self.left = example["turns"]
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        self.left -= 1
        return Step([{"role": "user", "content": f"{len(reply)} chars, {self.secret}"}],
                    reward=1.0, done=self.left <= 0, info={"replies": 1})


EXAMPLES = [{"prompt": "Count with me.", "turns": 1}, {"prompt": "Two, please", "turns": 2},
            {"prompt": "3", "turns": 3}, {"prompt": "Four turns now, go.", "turns": 4}]



class StopsOnReset(GuessNumber):
    """The guess-the-number game that sends SIGTERM to this process on the chosen reset call
    (1-based, counted over the process): a preemption in the middle of an agent rollout."""

    AT = {"at": None, "calls": 0}

    def reset(self, example):
        StopsOnReset.AT["calls"] += 1
        if StopsOnReset.AT["at"] == StopsOnReset.AT["calls"]:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().reset(example)
