"""hone.rl.episode_collect's host-side metrics, by hand."""

import numpy as np

from hone.rl.episode_collect import zero_std_fraction


def test_zero_std_fraction_counts_groups_whose_rewards_are_all_equal():
    total = np.asarray([1, 1, 1, 1,  0, 1, 1, 1,  0, 0, 0, 0], np.float32)  # 3 groups of 4
    assert zero_std_fraction(total, 4) == 2 / 3
    assert zero_std_fraction(total, 2) == 5 / 6  # (1,1) (1,1) (0,1) (1,1) (0,0) (0,0)
    assert zero_std_fraction(total, 1) == 1.0
