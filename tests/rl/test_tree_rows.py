"""GRPO's tree rows (one row per prompt group, the prompt computed once) against a row per
sample: the layout by hand, and the same GRPO and PPO update (loss, metrics, new weights) from
both."""

import dataclasses

import numpy as np
import pytest
from grpo_sgd import ppo_sgd_update, sgd_update

from hone.config import GRPOConfig, PPOConfig, load_config
from hone.data.shared_prefix import work_tokens
from hone.models.config import PRESETS
from hone.rl.rollout import Samples, pack_rows, pack_tree_rows, tree_width
from hone.sampling.generate import Completion

PAD = 0


def samples(prompts, completions, g) -> Samples:
    """Samples of len(prompts) groups of g completions (token lists), made-up log-probs."""
    outs = [Completion(None, list(c), [-0.5 - 0.1 * i for i in range(len(c))])
            for c in completions]
    ids = [list(p) for p in prompts for _ in range(g)]
    return Samples(ids, [""] * len(ids), outs, {}, g)


def test_layout_by_hand():
    rows = pack_tree_rows(samples([[5, 6]], [[7, 8, 9], [10]], 2), 3, 3, PAD)
    # Rows of P + G x M = 3 + 2 x 3 = 9 slots: the prompt from slot 0, the samples after it.
    assert rows["tokens"][0].tolist() == [5, 6, 7, 8, 9, 10, PAD, PAD, PAD]
    assert rows["attention_mask"][0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0]
    assert rows["positions"][0].tolist() == [0, 1, 2, 3, 4, 2, 0, 0, 0]
    assert rows["branch_ids"][0].tolist() == [0, 0, 1, 1, 1, 2, 0, 0, 0]
    # Sample 1's tokens 7, 8, 9 are predicted at slots 1 (the prompt's last), 2, 3; sample
    # 2's token 10 at slot 1 as well.
    assert rows["score_index"][0].tolist() == [[1, 2, 3], [1, 0, 0]]
    assert rows["score_targets"][0].tolist() == [[7, 8, 9], [10, PAD, PAD]]
    assert rows["loss_mask"][0].tolist() == [[1, 1, 1], [1, 0, 0]]
    np.testing.assert_allclose(rows["sampler_logp"][0, 0], [-0.5, -0.6, -0.7])
    with pytest.raises(ValueError, match="different prompts"):
        pack_tree_rows(Samples([[1], [2]], ["", ""], [Completion(None, [3], [0.0])] * 2, {}, 2),
                       2, 2, PAD)


def test_work_tokens_count_a_tree_batch_as_its_rows():
    """tokens/s counts each sample's prompt + completion in both layouts: by hand,
    (2 + 3) + (2 + 1) = 8 for the tree row's 6 tokens; and a random rollout alike."""
    hand = samples([[5, 6]], [[7, 8, 9], [10]], 2)
    assert work_tokens(pack_tree_rows(hand, 3, 3, PAD)) == 8
    assert work_tokens(pack_rows(hand, 3, 3, PAD)) == 8
    rollout = _rollout(0)
    assert (work_tokens(pack_tree_rows(rollout, 6, 5, PAD))
            == work_tokens(pack_rows(rollout, 6, 5, PAD)))


def _rollout(seed: int, groups: int = 3, g: int = 4, p: int = 6, m: int = 5) -> Samples:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 200, rng.integers(1, p + 1)).tolist() for _ in range(groups)]
    completions = [rng.integers(3, 200, rng.integers(1, m + 1)).tolist()
                   for _ in range(groups * g)]
    return samples(prompts, completions, g)


@pytest.mark.parametrize("extra", [
    ["grpo.loss_agg=token-mean"],
    ["grpo.loss_agg=seq-mean-token-mean", "grpo.iterations=2", "grpo.tis_cap=2.0"],
    ["grpo.loss_agg=seq-mean-token-sum-norm", "grpo.ratio=sequence"],
])
def test_tree_rows_give_the_update_of_a_row_per_sample(extra):
    """One SGD update (beta > 0 with a copied reference, so the reference forward runs too)
    from both layouts of the same rollout: equal loss, metrics and new weights."""
    g, p, m = 4, 6, 5
    rollout = _rollout(0)
    rng = np.random.default_rng(1)
    adv = rng.normal(size=12).astype(np.float32)
    cfg = load_config(GRPOConfig, None, [
        "grpo.beta=0.1", f"grpo.group_size={g}", f"grpo.max_prompt_tokens={p}",
        f"grpo.max_new_tokens={m + 2}", "train.batch_size=12", *extra])
    tiny = dataclasses.replace(PRESETS["tiny"], num_layers=2, sliding_window=4,
                               layer_types=("sliding", "global"))
    longest = max(rollout.lengths)
    assert longest < m + 2  # the trimmed tree rows below are narrower than the limit
    results = []
    for tree, width in ((False, m + 2), (True, m + 2), (True, longest)):
        rows = (pack_tree_rows if tree else pack_rows)(rollout, p, width, PAD)
        rows["advantages"] = adv.reshape(3, g) if tree else adv
        results.append(sgd_update(cfg, tiny, rows))
    (d_rows, m_rows), *trees = results
    for d_tree, m_tree in trees:
        for key, value in m_rows.items():
            np.testing.assert_allclose(m_tree[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
        for k in d_rows:
            assert np.max(np.abs(d_rows[k])) > 0, k
            assert np.max(np.abs(d_tree[k] - d_rows[k])) <= 1e-5 * np.max(np.abs(d_rows[k])), k


def test_tree_width_steps():
    def width(longest, limit):
        return tree_width(samples([[1]], [[5] * longest, [6]], 2), limit)
    assert [width(n, 32) for n in (1, 8, 9, 17, 25, 32)] == [8, 8, 16, 24, 32, 32]
    assert [width(n, 48) for n in (1, 16, 17, 33, 48)] == [16, 16, 32, 48, 48]  # steps of 16
    assert [width(n, 5) for n in (1, 3, 5)] == [5, 5, 5]  # never past the limit
    assert [width(n, 256) for n in (1, 65, 200)] == [64, 128, 256]


@pytest.mark.parametrize("extra", [["ppo.critic=shared"],
                                   ["ppo.critic=separate", "train.grad_accum=3"]])
def test_ppo_tree_rows_give_the_update_of_a_row_per_sample(extra):
    """One SGD update of policy and critic (KL-shaped rewards against a copied reference, GAE,
    whitened advantages, clipped losses) from a row per sample and from trimmed tree rows."""
    g, p, m = 4, 6, 5
    rollout = _rollout(2)
    scores = np.random.default_rng(3).normal(size=12).astype(np.float32)
    cfg = load_config(PPOConfig, None, [
        "ppo.kl_coef=0.1", "ppo.reference=copy", "ppo.epochs=1", f"ppo.group_size={g}",
        f"ppo.max_prompt_tokens={p}", f"ppo.max_new_tokens={m + 2}", "train.batch_size=12",
        *extra])
    tiny = dataclasses.replace(PRESETS["tiny"], num_layers=2, sliding_window=4,
                               layer_types=("sliding", "global"))
    results = []
    for tree, width in ((False, m + 2), (True, max(rollout.lengths))):
        rows = (pack_tree_rows if tree else pack_rows)(rollout, p, width, PAD)
        rows["scores"] = scores.reshape(3, g) if tree else scores
        results.append(ppo_sgd_update(cfg, tiny, rows))
    (d_rows, m_rows), (d_tree, m_tree) = results
    for key, value in m_rows.items():
        np.testing.assert_allclose(m_tree[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    for k in d_rows:
        assert np.max(np.abs(d_rows[k])) > 0, k
        assert np.max(np.abs(d_tree[k] - d_rows[k])) <= 1e-5 * np.max(np.abs(d_rows[k])), k
