"""Episodes an outside harness plays against hone serve (hone/serve/sessions.py): one token
sequence whose model ids are those the responses carried, whose other tokens are the chat
template's rendering of the rest of the conversation, whose log-probs are a teacher-forced
pass's; the same harness again gives the same episode; a rewritten history starts it over; a
template that rewrites earlier turns (Qwen3's) starts a new segment instead."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from hone.serve import Server
from hone.serve.engine_loop import Settings
from hone.serve.sessions import Sessions
from hone.tokenizer import Tokenizer, load_tokenizer
from hone.weights.loading import load_model

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3), load_tokenizer("tiny")


@functools.partial(jax.jit, static_argnums=0)
def _log_softmax(graphdef, state, tokens):
    return jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens), axis=-1)


def play(model, tok, seed=4, rewrite=False, **server_kw):
    """Two episodes of three model turns, a tool turn and a user turn between them."""
    sessions = Sessions(tok, seed=seed, settings=Settings(1.0, 50), max_new_tokens=10,
                        max_episode_tokens=480)
    server = Server(model, tok, port=0, max_seqs=4, max_len=512, page_size=16,
                    sessions=sessions, **server_kw).start()
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    said = {}
    try:
        for ep in ("a", "b"):
            messages = [{"role": "user", "content": f"Start {ep}."}]
            said[ep] = []
            for turn in range(3):
                r = client.chat.completions.create(
                    model="x", messages=messages, temperature=0.3, max_tokens=99,
                    extra_body={"hone": {"episode": ep}})
                said[ep].append(r.choices[0].model_extra["hone"]["token_ids"])
                messages.append({"role": "assistant", "content": r.choices[0].message.content})
                messages.append({"role": "tool", "content": "42"} if turn == 0
                                else {"role": "user", "content": "Go on."})
                if rewrite and turn == 1:
                    messages = messages[:1] + messages[3:]
    except openai.InternalServerError:
        if server.failure is None:
            raise
    finally:
        server.close()
    return sessions, said


def test_an_episode_is_the_served_ids_between_the_templates_rendering(tiny):
    model, tok = tiny
    sessions, said = play(model, tok)
    for name in ("a", "b"):
        ep = sessions.episode(name, 1.0)
        assert ep.turns == 3 and ep.reward == 1.0 and not ep.events
        mask = np.asarray(ep.model_mask, bool)
        tokens = np.asarray(ep.tokens)
        assert tokens[mask].tolist() == sum(said[name], [])  # the ids as the responses had them
        assert all(len(ids) <= 10 for ids in said[name])  # the run's max_new_tokens, not 99
        # The rest: the template's rendering of the conversation around the model's replies
        # (each reply as its sampled ids decode, its end token the template's own).
        text = lambda ids: tok.decode(ids[:-1] if ids[-1] in tok.eos_ids else ids)  # noqa
        history = [ep.messages[0]]
        for t in range(2):
            history += [{"role": "assistant", "content": text(said[name][t])},
                        ep.messages[2 * t + 2]]
        assert tok.decode(ep.tokens) == tok.apply_chat_template(
            history, add_generation_prompt=True) + tok.decode(said[name][2])
        assert ep.messages[2]["role"] == "tool" and ep.messages[4]["role"] == "user"
        # Log-probs: a teacher-forced pass over the whole episode.
        lp = np.asarray(_log_softmax(*nnx.split(model), tokens[None]))[0]
        forced = lp[np.arange(len(tokens) - 1), tokens[1:]]
        np.testing.assert_allclose(np.asarray(ep.logprobs)[1:][mask[1:]], forced[mask[1:]],
                                   atol=1e-4)
        assert set(ep.versions) == {-1, 0}


def test_the_same_harness_again_is_the_same_episodes(tiny):
    model, tok = tiny
    first, _ = play(model, tok)
    again, _ = play(model, tok)
    other, _ = play(model, tok, seed=5)
    for name in ("a", "b"):
        assert first.episode(name, 0.0).tokens == again.episode(name, 0.0).tokens
    assert first.episode("a", 0.0).tokens != other.episode("a", 0.0).tokens


def test_a_rewritten_history_starts_the_episode_over_and_says_so(tiny):
    model, tok = tiny
    sessions, said = play(model, tok, rewrite=True)
    ep = sessions.episode("a", None)
    assert ep.events == {"restarts": 1, "missing_rewards": 1} and ep.reward == 0.0
    assert ep.turns == 1  # the turn after the restart: the earlier ones are not in it
    assert np.asarray(ep.tokens)[np.asarray(ep.model_mask, bool)].tolist() == said["a"][2]


def test_a_template_that_rewrites_earlier_turns_starts_a_segment_per_turn(tiny):
    """Qwen3's real template on the tiny tokenizer (which has its ChatML tokens): the random
    model writes no think block, and the template drops the empty one it gives the last reply
    once the reply is no longer last, so each later turn renders the conversation again."""
    model, tiny_tok = tiny
    path = Path(__file__).parents[1] / "agents" / "templates" / "qwen3.jinja"
    tok = Tokenizer(tiny_tok.backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                    chat_template=path.read_text(encoding="utf-8"),
                    extra_eos_ids=[tiny_tok.backend.token_to_id("<|im_end|>")])
    sessions, said = play(model, tok)
    for name in ("a", "b"):
        ep = sessions.episode(name, 1.0)
        assert ep.turns == 3 and len(ep.segments) == 2
        assert ep.events == {"template_rewrites": 2}
        bounds = [0] + ep.segments + [len(ep.tokens)]
        text = lambda ids: tok.decode(ids[:-1] if ids[-1] in tok.eos_ids else ids)  # noqa
        history = [ep.messages[0]]
        for t, (a, z) in enumerate(zip(bounds[:-1], bounds[1:])):
            seg = ep.tokens[a:z]
            mask = np.asarray(ep.model_mask[a:z], bool)
            assert np.asarray(seg)[mask].tolist() == said[name][t]
            prompt = tok.apply_chat_template(history, add_generation_prompt=True)
            assert tok.decode(seg) == prompt + tok.decode(said[name][t])
            forced = _teacher_forced(model, seg)
            np.testing.assert_allclose(np.asarray(ep.logprobs[a + 1:z])[mask[1:]],
                                       forced[mask[1:]], atol=1e-4)
            history += [{"role": "assistant", "content": text(said[name][t])},
                        *ep.messages[2 * t + 2:2 * t + 3]]


def _teacher_forced(model, tokens):
    lp = np.asarray(_log_softmax(*nnx.split(model), np.asarray(tokens)[None]))[0]
    return lp[np.arange(len(tokens) - 1), np.asarray(tokens)[1:]]


def test_partial_episodes_turns_from_the_switch_are_the_next_versions(tiny):
    """Asynchronous RL's partial episodes through the server (agent.endpoint with
    agent.switch_turn): turns from the switch's on sample with its weights on an engine of
    their own and record its version; with the same weights the episodes are those of no
    switch, with other weights each token's log-prob is a teacher-forced pass of the version
    that sampled it."""
    from hone.agents.episode import Switch
    from perturb import perturbed
    model, tok = tiny
    plain, _ = play(model, tok)
    same, _ = play(model, tok, version=3, switch=Switch(1, lambda: model, 4))
    new = perturbed(model)
    moved, said = play(model, tok, version=3, switch=Switch(2, lambda: new, 4))
    for name in ("a", "b"):
        a, b = plain.episode(name, 1.0), same.episode(name, 1.0)
        assert a.tokens == b.tokens and a.logprobs == b.logprobs
        first = b.turn_ends[0]
        assert all(v == (-1 if not m else 3 if k <= first else 4)
                   for k, (v, m) in enumerate(zip(b.versions, b.model_mask)))
        ep = moved.episode(name, 1.0)
        assert ep.tokens[:ep.turn_ends[1] + 1] == a.tokens[:a.turn_ends[1] + 1]
        assert ep.tokens != a.tokens  # the new weights sampled the third turn
        old_tf, new_tf = _teacher_forced(model, ep.tokens), _teacher_forced(new, ep.tokens)
        for k in range(1, len(ep.tokens)):
            if ep.model_mask[k]:
                tf = old_tf if ep.versions[k] == 3 else new_tf
                assert abs(tf[k - 1] - ep.logprobs[k]) <= 1e-4
        assert ep.versions[-1] == 4 and ep.versions[ep.turn_ends[1]] == 3


def test_a_switch_whose_weights_never_come_fails_the_rollout_not_the_server(tiny):
    """The lag cancels a version that will not come (a rollback, a stop): the turn that waits
    for it gets a 500, the failure is kept for the trainer to raise, and the turns before it
    were served."""
    from hone.agents.episode import Switch
    from hone.train.lagged import Cancelled
    model, tok = tiny

    def never():
        raise Cancelled("policy version 4 will not come")

    sessions, said = play(model, tok, switch=Switch(1, never, 4))
    assert len(said["a"]) == 1 and sessions.episode("a", None).turns == 1
