"""Partial episodes (asynchronous RL): an episode in progress when the weights change goes on
under the new ones from a fixed turn, each token recording the version that sampled it and its
log-prob under that version."""

from __future__ import annotations

import numpy as np
import pytest

from hone.agents.episode import Switch
from hone.agents.rollout import rollout
from hone.errors import InputError
from perturb import perturbed as _perturbed
from scripted import EXAMPLES, KW, Counter
from test_rollout import TOL, teacher_forced


def _spans(ep):
    """Per model token of the episode (index into ep.tokens): its turn."""
    turn, out = 0, {}
    for k, m in enumerate(ep.model_mask):
        if m:
            out[k] = turn
            if k in ep.turn_ends:
                turn += 1
    return out


def test_the_same_weights_after_the_switch_give_the_episodes_of_no_switch(tiny):
    model, tok = tiny
    calls = []

    def later():
        calls.append(1)
        return model

    kw = dict(KW, temperature=1.0, seed=7, group_size=2)
    plain = rollout(model, tok, Counter, EXAMPLES, policy_version=3, **kw)
    split = rollout(model, tok, Counter, EXAMPLES, policy_version=3,
                    switch=Switch(turn=2, model=later, version=4), **kw)
    assert calls == [1]  # asked for once, when the first episode reached turn 2
    spanned = 0
    for a, b in zip(plain, split):
        assert a.tokens == b.tokens and a.model_mask == b.model_mask
        assert a.turns == b.turns and a.reward == b.reward and a.done == b.done
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)
        turn_of = _spans(b)
        assert set(a.versions) <= {-1, 3}
        for k, v in enumerate(b.versions):
            assert v == (-1 if k not in turn_of else 3 if turn_of[k] < 2 else 4)
        spanned += b.turns > 2
    assert spanned == 4  # the 3- and 4-turn examples, two copies each


def test_turns_after_the_switch_are_sampled_and_scored_by_the_new_weights(tiny):
    model, tok = tiny
    new = _perturbed(model)
    kw = dict(KW, temperature=1.0, seed=9)
    old_only = rollout(model, tok, Counter, EXAMPLES, **kw)
    eps = rollout(model, tok, Counter, EXAMPLES, switch=Switch(1, lambda: new, 1), **kw)
    before, after = teacher_forced(model, eps), teacher_forced(new, eps)
    moved = 0
    for ep, ref, tf_old, tf_new in zip(eps, old_only, before, after):
        turn_of = _spans(ep)
        first = ep.turn_ends[0] + 1  # the first turn is the old weights' in both runs
        assert ep.tokens[:first] == ref.tokens[:first]
        lp = np.asarray(ep.logprobs)
        for k, turn in turn_of.items():  # teacher-forced under the version that sampled it
            tf = tf_old if turn < 1 else tf_new
            assert abs(tf[k - 1] - lp[k]) <= TOL, (k, turn)
            assert ep.versions[k] == (0 if turn < 1 else 1)
        moved += ep.turns > 1 and ep.tokens != ref.tokens
    assert moved >= 2  # the new weights did sample other tokens


def test_a_switch_outside_the_episodes_turns_is_refused(tiny):
    model, tok = tiny
    for turn in (0, KW["max_turns"]):
        with pytest.raises(InputError, match="switch_turn"):
            rollout(model, tok, Counter, EXAMPLES[:1], switch=Switch(turn, lambda: model, 1),
                    **KW)
