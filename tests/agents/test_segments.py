"""Episodes through a chat template that rewrites earlier turns: Qwen3's real template on the tiny
preset (its tokenizer has the ChatML tokens Qwen3's template writes). The random model never
writes a think block, and Qwen3's template gives the last reply an empty one that it drops once
the reply is no longer last, so every turn after the first starts a new segment: the whole
conversation rendered again, sampled after alone.

Checked: each segment's prompt is the template's rendering of the conversation before its turn;
each segment's log-probs equal a forward pass over that segment alone; the tokens do not depend
on max_seqs; the training rows keep the segments apart (segment ids, positions restarting), so
the loss's forward over a whole row gives the sampler's log-probs; a switch of weights in the
middle of a segment gives the episodes of no switch when the weights are the same."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hone.agents.episode import Switch, episode_metrics
from hone.agents.episode_rows import episode_rows
from hone.agents.rollout import rollout
from hone.rl.grpo_objective import model_logp
from hone.sampling.generate import encode_prompt
from hone.tokenizer import Tokenizer
from scripted import EXAMPLES, KW, Counter
from test_rollout import TOL, teacher_forced

QWEN3 = (Path(__file__).parent / "templates" / "qwen3.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def qwen3_tiny(tiny):
    model, tok = tiny
    return model, Tokenizer(tok.backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                            chat_template=QWEN3, extra_eos_ids=[tok.backend.token_to_id(
                                "<|im_end|>")], source="tiny+qwen3")


@pytest.fixture(scope="module")
def played(qwen3_tiny):
    """The episodes every test here reads (played once: policy version 3)."""
    return _play(*qwen3_tiny, policy_version=3)


def _segments(ep):
    """(start, end) of each segment in ep.tokens."""
    bounds = [0] + ep.segments + [len(ep.tokens)]
    return list(zip(bounds[:-1], bounds[1:]))


def _play(model, tok, **kw):
    # each segment renders the conversation again: room for four turns' renderings
    return rollout(model, tok, Counter, EXAMPLES, **dict(KW, temperature=1.0, seed=11,
                                                         group_size=2, max_episode_tokens=512,
                                                         **kw))


def test_each_segment_is_the_templates_rendering_and_scores_alone(qwen3_tiny, played):
    model, tok = qwen3_tiny
    eps = played
    for ep, ex in zip(eps, [e for e in EXAMPLES for _ in range(2)]):
        assert ep.done and ep.turns == ex["turns"] and ep.limit is None
        assert len(ep.segments) == ep.turns - 1 == ep.events.get("template_rewrites", 0)
        replies = [k for k, m in enumerate(ep.messages) if m["role"] == "assistant"]
        for s, (a, z) in enumerate(_segments(ep)):
            # the segment's prompt: the conversation before its turn, as the template renders it
            prompt = encode_prompt(tok, tok.apply_chat_template(ep.messages[:replies[s]],
                                                                add_generation_prompt=True))
            assert ep.tokens[a:a + len(prompt)] == prompt
            assert sum(ep.model_mask[a:a + len(prompt)]) == 0 and sum(ep.model_mask[a:z]) > 0
            part = type(ep)(tokens=ep.tokens[a:z])
            tf = teacher_forced(model, [part])[0]
            mask = np.array(ep.model_mask[a + 1:z], bool)
            assert np.abs(tf[mask] - np.array(ep.logprobs[a + 1:z])[mask]).max() <= TOL
    m = episode_metrics(eps)
    assert m["agent/template_rewrites"] == sum(e["turns"] - 1 for e in EXAMPLES) * 2
    assert m["agent/segments_mean"] == sum(e["turns"] for e in EXAMPLES) / len(EXAMPLES)


def test_segments_do_not_depend_on_how_many_run_at_once(qwen3_tiny, played):
    model, tok = qwen3_tiny
    for n in (1, 3):  # against all eight episodes at once
        for a, b in zip(played, _play(model, tok, max_seqs=n, policy_version=3)):
            assert a.tokens == b.tokens and a.segments == b.segments
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)


def test_rows_keep_segments_apart_so_the_loss_forward_gives_the_sampler_logprobs(qwen3_tiny,
                                                                                 played):
    model, tok = qwen3_tiny
    eps = played
    rows = episode_rows(eps, 64, 512, tok.pad_id)
    for r, ep in enumerate(eps):
        start = 64 - ep.prompt_len
        for s, (a, z) in enumerate(_segments(ep)):
            assert (rows["segment_ids"][r, start + a:start + z] == s + 1).all()
            assert rows["positions"][r, start + a:start + z].tolist() == list(range(z - a))
        assert (rows["segment_ids"][r, start + len(ep.tokens):] == 0).all()
    logp, _ = model_logp(model, {k: jnp.asarray(v) for k, v in rows.items()})
    mask = rows["loss_mask"] > 0
    assert mask.sum() == sum(sum(ep.model_mask) for ep in eps)
    assert np.abs(np.asarray(logp)[mask] - rows["sampler_logp"][mask]).max() <= TOL
    # without the segment ids, a later segment would see the earlier ones: other numbers
    plain = {k: jnp.asarray(v) for k, v in rows.items() if k != "segment_ids"}
    assert np.abs(np.asarray(model_logp(model, plain)[0])[mask]
                  - rows["sampler_logp"][mask]).max() > 0.01


def test_a_switch_within_segments_gives_the_episodes_of_no_switch(qwen3_tiny, played):
    model, tok = qwen3_tiny
    plain = played
    split = _play(model, tok, policy_version=3, switch=Switch(turn=2, model=lambda: model,
                                                              version=4))
    for a, b in zip(plain, split):
        assert a.tokens == b.tokens and a.segments == b.segments and a.reward == b.reward
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)
        assert set(b.versions) == ({-1, 3, 4} if b.turns > 2 else {-1, 3})
