"""hone.rl.episode_collect's host-side metrics and dynamic sampling's choice of groups, by hand."""

import numpy as np

from hone.rl.episode_collect import zero_std_fraction


def test_zero_std_fraction_counts_groups_whose_rewards_are_all_equal():
    total = np.asarray([1, 1, 1, 1,  0, 1, 1, 1,  0, 0, 0, 0], np.float32)  # 3 groups of 4
    assert zero_std_fraction(total, 4) == 2 / 3
    assert zero_std_fraction(total, 2) == 5 / 6  # (1,1) (1,1) (0,1) (1,1) (0,0) (0,0)
    assert zero_std_fraction(total, 1) == 1.0


class _Episode:
    def __init__(self, reward):
        self.reward = reward


class _Prompts:
    """A prompt iterator whose batches are counted: the position a checkpoint would save."""

    def __init__(self, batches):
        self.batches, self.drawn = batches, 0

    def next(self):
        self.drawn += 1
        return self.batches[self.drawn - 1]


def _refill(first, later, rounds):
    """AgentRollouts.refill with groups of 2 over scripted rounds: `first` the first round's
    rewards, `later` those of each further batch the iterator gives."""
    from types import SimpleNamespace

    from hone.rl.episode_collect import AgentRollouts
    prompts = _Prompts([{"round": i + 1} for i in range(len(later))])
    collector = AgentRollouts.__new__(AgentRollouts)
    collector.s, collector.data_iter = SimpleNamespace(group_size=2), prompts
    played = []

    def play_round(batch, round_):
        played.append((batch["round"], round_))
        rewards = later[round_ - 1]
        return [_Episode(r) for r in rewards], [f"r{round_}e{i}" for i in range(len(rewards))]

    episodes, records, n = collector.refill([_Episode(r) for r in first],
                                            [f"r0e{i}" for i in range(len(first))],
                                            play_round, rounds)
    return [e.reward for e in episodes], records, n, played, prompts.drawn


def test_dynamic_sampling_keeps_the_groups_whose_rewards_differ_first():
    first = [1, 1, 0, 1, 0, 0]  # 3 groups of 2: only the second has rewards that differ
    later = [[0, 0, 1, 0, 1, 1], [0.5, 0, 1, 1, 1, 1]]
    # Two rounds: round 1 adds one varying group (its second), round 2 the third one needed.
    rewards, records, n, played, drawn = _refill(first, later, rounds=2)
    assert rewards == [0, 1, 1, 0, 0.5, 0] and n == 2 and drawn == 2
    assert records == ["r0e2", "r0e3", "r1e2", "r1e3", "r2e0", "r2e1"]
    assert played == [(1, 1), (2, 2)]  # each round its own batch and seed
    # One round allowed: two varying groups, then the first group whose rewards are equal.
    rewards, records, n, _, drawn = _refill(first, later, rounds=1)
    assert rewards == [0, 1, 1, 0, 1, 1] and n == 1 and drawn == 1
    assert records == ["r0e2", "r0e3", "r1e2", "r1e3", "r0e0", "r0e1"]
    # Enough varying groups in the first round: nothing more is drawn.
    rewards, _, n, played, drawn = _refill([1, 0, 0, 1, 0.5, 1], later, rounds=2)
    assert rewards == [1, 0, 0, 1, 0.5, 1] and n == 0 and drawn == 0 and played == []
