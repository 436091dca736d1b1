"""hone.agents.rollout on the tiny preset: exact log-probabilities across turns, the episode
layout (sampled ids kept, environment tokens = the template's rendering), limits, failures."""

from __future__ import annotations

import functools
import jax
import numpy as np
import pytest
from flax import nnx

from hone.agents.render import after_turn_text
from hone.agents.episode import episode_metrics
from hone.agents.rollout import rollout
from scripted import ENDS, EXAMPLES, KW, Counter
from hone.sampling.engine import TRACES

TOL = 1e-4
@functools.partial(jax.jit, static_argnums=0)
def _log_softmax_of(graphdef, state, tokens, mask):
    return jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens, attention_mask=mask), axis=-1)


def teacher_forced(model, episodes):
    """log p of every token of each episode given the tokens before it: one forward pass."""
    width = -(-max(len(e.tokens) for e in episodes) // 64) * 64
    tokens = np.zeros((len(episodes), width), np.int32)
    mask = np.zeros_like(tokens)
    for i, e in enumerate(episodes):
        tokens[i, :len(e.tokens)], mask[i, :len(e.tokens)] = e.tokens, 1
    lp = np.asarray(_log_softmax_of(*nnx.split(model), tokens, mask))
    return [np.array([lp[i, t - 1, e.tokens[t]] for t in range(1, len(e.tokens))])
            for i, e in enumerate(episodes)]


@pytest.mark.parametrize("count,group", [(4, 1), (3, 2)])
def test_logprobs_equal_a_forward_pass_over_the_finished_episode(tiny, count, group):
    model, tok = tiny
    eps = rollout(model, tok, Counter, EXAMPLES[:count], temperature=1.0, seed=count,
                  group_size=group, **KW)
    assert len(eps) == count * group
    for tf, ep in zip(teacher_forced(model, eps), eps):
        lp, mask = np.array(ep.logprobs[1:]), np.array(ep.model_mask[1:], bool)
        assert mask.sum() >= ep.turns >= 1
        assert np.abs(tf[mask] - lp[mask]).max() <= TOL
        assert (lp[~mask] == 0).all()
    for i, ex in enumerate(EXAMPLES[:count]):
        for j in range(group):
            ep = eps[i * group + j]
            assert ep.turns == ex["turns"] and ep.done and ep.limit is None
            assert ep.reward == float(ex["turns"]) and ep.events["replies"] == ex["turns"]


def test_episode_layout_is_the_sampled_ids_and_the_templates_rendering(tiny):
    model, tok = tiny
    eps = rollout(model, tok, Counter, EXAMPLES[1:4], seed=5, **KW)
    for ep in eps:
        mask = np.array(ep.model_mask)
        # Model spans: runs of 1s, one per turn, ending at turn_ends.
        starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
        ends = [k for k in range(len(mask)) if mask[k] and (k + 1 == len(mask) or not mask[k + 1])]
        assert ends == ep.turn_ends and len(starts) == ep.turns
        # The opening is the template's rendering of the first message.
        opening = tok.apply_chat_template(ep.messages[:1], add_generation_prompt=True)
        assert tok.decode(ep.tokens[:ep.prompt_len]) == opening
        # Between model turns: exactly what the template adds for the environment's messages.
        for t in range(ep.turns - 1):
            env = ep.tokens[ends[t] + 1:starts[t + 1]]
            turn = ep.tokens[starts[t]:ends[t] + 1]
            ended = turn[-1] in ENDS
            reply = tok.decode(turn[:-1] if ended else turn)
            history = ep.messages[:1 + 2 * t]
            expect = after_turn_text(tok, history, reply, tok.decode(turn[-1:]) if ended
                                     else None, [ep.messages[2 + 2 * t]], {})
            assert tok.decode(env) == expect
            assert env == tok.encode(expect, add_special_tokens=False)
            assert expect.endswith("<|im_start|>assistant\n")


def test_limits_cut_episodes_and_say_which(tiny):
    model, tok = tiny
    many = [{"prompt": "again", "turns": 99}] * 4
    eps = rollout(model, tok, Counter, many, seed=1, **KW)
    assert all(e.turns == 4 and e.limit == "max_turns" and not e.done for e in eps)
    short = rollout(model, tok, Counter, many, seed=1, **dict(KW, max_episode_tokens=40))
    assert all(len(e.tokens) <= 40 and e.limit == "max_episode_tokens" for e in short)
    m = episode_metrics(eps + short)
    assert m["agent/cut_fraction"] == 1.0 and m["agent/done_fraction"] == 0.0


def test_max_after_opening_keeps_episodes_within_their_training_rows(tiny):
    # Rows give the opening P slots and the rest L - P: an opening shorter than P must not let
    # the rest run past L - P (it once did, and episode_rows refused the batch).
    from hone.agents.episode_rows import episode_rows
    model, tok = tiny
    long = [{"prompt": "a much longer opening than the other one", "turns": 99},
            {"prompt": "x", "turns": 99}]
    eps = rollout(model, tok, Counter, long, max_turns=4, max_new_tokens=8,
                  max_episode_tokens=256, top_k=50, seed=1, eos_ids=ENDS, max_after_opening=30)
    p = max(e.prompt_len for e in eps)
    assert eps[0].prompt_len > eps[1].prompt_len
    assert all(len(e.tokens) - e.prompt_len <= 30 and e.limit == "max_episode_tokens"
               for e in eps)
    rows = episode_rows(eps, p, p + 30, tok.pad_id)
    assert rows["tokens"].shape == (2, p + 30)


class Broken(Counter):
    def __init__(self):
        self.calls = 0

    def reset(self, example):
        if example["prompt"] == "boom":
            raise RuntimeError("reset failed")
        return super().reset(example)

    def step(self, reply):
        if self.left == 1:
            raise ValueError("step failed")
        return super().step(reply)


def test_a_failing_environment_ends_only_its_own_episode(tiny):
    model, tok = tiny
    examples = [{"prompt": "boom", "turns": 2}, {"prompt": "fine", "turns": 1},
                {"prompt": "late", "turns": 3}]
    eps = rollout(model, tok, Broken, examples, seed=2, **KW)
    events = [{k: v for k, v in e.events.items() if k != "turns_cut"} for e in eps]
    assert events[0] == {"reset_errors": 1} and eps[0].tokens == [] and eps[0].turns == 0
    assert events[1] == {"env_errors": 1} and eps[1].turns == 1 and not eps[1].done
    assert eps[2].turns == 3 and events[2] == {"replies": 2, "env_errors": 1}


def test_the_same_batch_again_is_the_same_episodes_from_the_same_programs(tiny):
    model, tok = tiny
    first = rollout(model, tok, Counter, EXAMPLES, seed=11, **KW)
    before = dict(TRACES)
    again = rollout(model, tok, Counter, EXAMPLES, seed=11, **KW)
    assert dict(TRACES) == before  # nothing compiled again
    assert [(e.tokens, e.logprobs) for e in first] == [(e.tokens, e.logprobs) for e in again]
