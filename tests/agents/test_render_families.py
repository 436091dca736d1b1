"""Exact episode rendering per chat template with tools: an episode assembled as the sampler
assembles it (the opening, each reply's ids, the environment's turn from `after_turn_text`) is,
id for id, the tokenisation of the template's rendering of the whole conversation, with several
tool calls in one turn and consecutive tool messages.

Templates: the tiny preset's ChatML and SmolLM2-135M-Instruct's (shipped; neither has tool support
of its own: calls are Hermes blocks in the reply, tools are described in the system message), and
the real templates of Qwen2.5, Qwen3, Llama 3.1 and Llama 3.2 (tests/agents/templates/, with
their sources), which take the tools themselves. Those families' tokenizers are not shipped, so they
run on byte-level tokenizers with each family's special tokens: the text and the special ids are
checked, not the family's BPE merges. Each family's replies call tools in its own format (Hermes
blocks; Llama 3's JSON objects, read by `agent.parser: llama3`), and Qwen3's think first, as it
does by default.

Where a template rewrites earlier turns, one growing token sequence cannot be both what the model
saw and the template's rendering: Qwen3 drops an earlier turn's reasoning once a new user query
follows, and with enable_thinking false drops the empty think block its generation prompt gave
each earlier reply. `after_turn_text` says so (`NotAPrefix`), and the rollout starts a new
segment of the episode from the template's rendering of the whole conversation (tested in
test_segments.py). Gemma 2's template takes neither a system nor a tool message: its episodes
get them in the roles it takes (`in_roles`: the system text at the head of the first user turn,
tool results as <tool_response> blocks in one user turn), as its SFT data does.
"""

from __future__ import annotations

from pathlib import Path

import jax

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.agents import Step
from hone.agents.environment import ToolEnvironment
from hone.agents.parsers import Llama3JsonParser
from hone.agents.tool_messages import fit_roles
from hone.agents.turns import Restart, after_model_turn, start_episode
from hone.agents.render import (NotAPrefix, after_turn_text, in_roles, opening_text,
                                supports_tools, with_tools)
from hone.errors import InputError
from hone.sampling.generate import encode_prompt
from hone.tokenizer import Tokenizer, byte_level_backend, load_tokenizer

TEMPLATES = Path(__file__).parent / "templates"
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
          "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
# family: (special tokens, template, bos, eos, other end tokens); as each family's instruct
# models configure them
FAMILIES = {
    "qwen2.5": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "qwen2_5.jinja", None,
                "<|im_end|>", ["<|endoftext|>"]),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "qwen3.jinja", None,
              "<|im_end|>", ["<|endoftext|>"]),
    "llama3.1": (LLAMA3, "llama3_1.jinja", "<|begin_of_text|>", "<|eot_id|>",
                 ["<|end_of_text|>", "<|eom_id|>"]),
    "llama3.2": (LLAMA3, "llama3_2.jinja", "<|begin_of_text|>", "<|eot_id|>",
                 ["<|end_of_text|>", "<|eom_id|>"]),
    "gemma2": (["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "gemma2.jinja",
               "<bos>", "<eos>", ["<end_of_turn>"]),
}
THINK = "<think>\nThe tools do this.\n</think>\n\n"  # Qwen3's reasoning, as it writes it


def family_tokenizer(name: str) -> Tokenizer:
    """A byte-level tokenizer (every byte its own id) with the family's special tokens and its
    real chat template."""
    specials, template, bos, eos, ends = FAMILIES[name]
    backend = byte_level_backend(specials)
    return Tokenizer(backend, bos_token=bos, eos_token=eos, source=name,
                     chat_template=(TEMPLATES / template).read_text(encoding="utf-8"),
                     extra_eos_ids=[backend.token_to_id(t) for t in ends])


def tokenizer_of(source: str):
    return family_tokenizer(source) if source in FAMILIES else load_tokenizer(source)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    return text.upper()


CALLS = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
         '<tool_call>\n{"name": "shout", "arguments": {"text": "hi"}}\n</tool_call>')
REPLIES = ["Two tools at once.\n" + CALLS,
           '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 1}}\n</tool_call>',
           "2 + 3 = 5, then 6; and HI."]


LLAMA_REPLIES = ['{"name": "add", "parameters": {"a": 2, "b": 3}}; '
                 '{"name": "shout", "parameters": {"text": "hi"}}',
                 '{"name": "add", "parameters": {"a": 5, "b": 1}}',
                 REPLIES[2]]


def replies_of(source: str) -> list[str]:
    if source.startswith("llama3"):
        return LLAMA_REPLIES
    return [THINK + r for r in REPLIES] if source == "qwen3" else REPLIES


def start(tok, extra=None):
    """The environment, its opening messages, the template's extra arguments and the opening's
    ids. Llama 3.2 dates its system message with today's date unless given one: pinned here so
    that a test run across midnight renders one date."""
    llama = str(tok.source).startswith("llama3")
    env = ToolEnvironment([add, shout], lambda **_: 1.0, system_prompt="Use the tools.",
                          runner="inline", parser=Llama3JsonParser() if llama else None)
    opening = env.reset({"prompt": "Add 2 and 3, shout hi, then add 1."})
    messages, args = with_tools(opening, env.tools, supports_tools(tok))
    args = {**args, "date_string": "26 Jul 2024", **(extra or {})}
    messages = in_roles(tok, messages, args)  # as the rollout: Gemma's roles
    return env, messages, args, encode_prompt(tok, opening_text(tok, messages, args))


def end_token(tok) -> int:
    """The end-of-turn token a model samples: the end token the template closes a reply with."""
    closed = tok.apply_chat_template([{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "ZZZ"}],
                                     add_generation_prompt=False)
    return next(e for e in tok.eos_ids if tok.decode([e]) in closed.split("ZZZ", 1)[1])


@pytest.mark.parametrize("source", ["tiny", pytest.param("smollm2-135m-instruct",
                                                         marks=pytest.mark.real_model),
                                    "qwen2.5", "qwen3", "llama3.1", "llama3.2", "gemma2"])
def test_an_episode_is_the_tokenisation_of_the_whole_conversation(source):
    tok = tokenizer_of(source)
    native = source in FAMILIES and source != "gemma2"
    assert supports_tools(tok) == native
    env, messages, extra, ids = start(tok)
    end = end_token(tok)
    history = messages
    conversation = with_tools(env.reset({"prompt": "Add 2 and 3, shout hi, then add 1."}),
                              env.tools, native)[0]  # as the environment gave it
    for turn, reply in enumerate(replies_of(source)):
        ids += tok.encode(reply, add_special_tokens=False) + [end]
        step = env.step(reply)
        conversation.append({"role": "assistant", "content": reply})
        if step.done:
            break
        assert [m["role"] for m in step.messages] == ["tool"] * (2 if turn == 0 else 1)
        new = in_roles(tok, step.messages, extra, opening=False)  # as the rollout does
        ids += tok.encode(after_turn_text(tok, history, reply, tok.decode([end]), new, extra),
                          add_special_tokens=False)
        history = history + [{"role": "assistant", "content": reply}] + new
        conversation += step.messages
    assert step.done and step.reward == 1.0
    assert [m["content"] for m in conversation if m["role"] == "tool"] == ["5", "HI", "6"]
    # the whole conversation in the roles the template takes, as SFT data renders it
    whole = tok.apply_chat_template(in_roles(tok, conversation, extra),
                                    add_generation_prompt=False, **extra)
    expect = encode_prompt(tok, whole)
    # The rendering closes the last reply after its end token ("\n" in ChatML): the episode
    # stops at the end token the model sampled.
    assert ids == expect[:len(ids)] and tok.decode(expect[len(ids):]).strip() == ""
    if native:  # the tools reached the template itself, not the system text
        assert '"name": "shout"' in whole and "To call a tool, write exactly" not in whole
    if source == "gemma2":  # user and model turns only: the system text opens the first user
        # turn, both results of the first turn share one user turn
        assert "<start_of_turn>system" not in whole and "<start_of_turn>tool" not in whole
        assert whole.count("<start_of_turn>user\nUse the tools.\n\nYou can call these") == 1
        assert "<tool_response>\n5\n</tool_response>\n<tool_response>\nHI" in whole


def test_templates_that_rewrite_earlier_turns_are_found_not_misrendered():
    tok = family_tokenizer("qwen3")
    # enable_thinking false: each reply followed an empty think block that the template drops
    # from every reply but the last
    env, messages, extra, _ = start(tok, {"enable_thinking": False})
    assert opening_text(tok, messages, extra).endswith("<think>\n\n</think>\n\n")
    new = env.step(REPLIES[1]).messages
    with pytest.raises(NotAPrefix, match="prefix by prefix"):
        after_turn_text(tok, messages, REPLIES[1], "<|im_end|>", new, extra)
    # a new user query drops the reasoning of the replies before it
    env, messages, extra, _ = start(tok)
    with pytest.raises(NotAPrefix, match="prefix by prefix"):
        after_turn_text(tok, messages, THINK + "Done.", "<|im_end|>",
                        [{"role": "user", "content": "Now shout it."}], extra)
    # while tool results keep the episode one query: the same reasoning is kept
    text = after_turn_text(tok, messages, THINK + REPLIES[1], "<|im_end|>",
                           env.step(REPLIES[1]).messages, extra)
    assert text == ("\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")
    # Gemma 2 takes no system message (nor tool messages) as they come: `in_roles` is needed
    gemma = family_tokenizer("gemma2")
    with pytest.raises(InputError, match="System role not supported"):
        opening_text(gemma, [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                     {})


ENV_ROLES = st.sampled_from(["tool", "user", "system"])


@settings(max_examples=200, deadline=None)
@given(system=st.booleans(), runs=st.lists(st.lists(ENV_ROLES, min_size=1, max_size=3),
                                           max_size=4), answered=st.booleans())
def test_fitted_roles_alternate_and_keep_every_text_in_order(system, runs, answered):
    """Any conversation an environment makes (an optional system message, a user message, then
    model turns each answered by tool, user or system messages) fits Gemma's rule: user and
    assistant turns alternating from a user turn, every text kept in order."""
    texts = iter(f"t{k}" for k in range(100))
    messages = ([{"role": "system", "content": next(texts)}] if system else []) + [
        {"role": "user", "content": next(texts)}]
    for run in runs:
        messages.append({"role": "assistant", "content": next(texts)})
        messages += [{"role": r, "content": next(texts)} for r in run]
    if answered:
        messages.append({"role": "assistant", "content": next(texts)})
    fitted = fit_roles(messages, (True, True))
    assert [m["role"] for m in fitted] == ["user", "assistant"] * (len(fitted) // 2) + (
        ["user"] if len(fitted) % 2 else [])
    joined = "\n".join(m["content"] for m in fitted)
    positions = [joined.find(m["content"]) for m in messages]
    assert -1 not in positions and positions == sorted(positions)
    # as the rollout builds it: the opening fitted, then each environment answer on its own
    first = 2 if system else 1
    step = fit_roles(messages[:first], (True, True))
    answer: list[dict] = []
    for m in messages[first:] + [{"role": "assistant", "content": "end"}]:
        if m["role"] != "assistant":
            answer.append(m)
            continue
        step += fit_roles(answer, (True, True), opening=False) + [m]
        answer = []
    step.pop()
    assert step == fitted
    assert fit_roles(messages, (False, False)) == messages


class FollowUp:
    """A tool turn, then a new user query, then done: Qwen3 drops the reasoning of the replies
    before the new query."""

    tools = ToolEnvironment([add], lambda **_: 1.0, runner="inline").tools

    def reset(self, example):
        self.turn = 0
        return [{"role": "system", "content": "Use the tools."},
                {"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        self.turn += 1
        if self.turn == 1:
            return Step([{"role": "tool", "content": "5"}])
        if self.turn == 2:
            return Step([{"role": "user", "content": "Now add 1."}])
        return Step(reward=1.0, done=True)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_reasoning_dropped_from_earlier_turns_starts_segments(thinking):
    """Episodes assembled by the rollout's own host side (hone.agents.turns): each segment is the
    template's rendering of the conversation before its turn, then the sampled ids; the reasoning
    the model wrote is in the segment it sampled and not in the next one's prompt."""
    tok = family_tokenizer("qwen3")
    end = tok.backend.token_to_id("<|im_end|>")
    think = THINK if thinking else ""
    replies = [think + '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
               think + "It is 5.", think + "Then 6."]
    extra = {} if thinking else {"enable_thinking": False}  # agent.template_args
    live, ids = start_episode(FollowUp, {"prompt": "Add 2 and 3."}, 0, tok, True, 4096, None,
                              template_args=extra)
    live.key = jax.random.key(0)  # the rollout's request key: segments fold theirs from it
    # without thinking, the opening ends in the empty think block the model answers after
    assert tok.decode(ids).endswith("<think>\n\n</think>\n\n") != thinking
    restarts = []
    for turn, reply in enumerate(replies):
        sampled = tok.encode(reply, add_special_tokens=False) + [end]
        more = after_model_turn(live, sampled, [0.0] * len(sampled), {end}, tok, turn, 4, 4096,
                                256, 256, None)
        restarts.append(isinstance(more, Restart))
    ep = live.ep
    assert ep.done and ep.reward == 1.0 and ep.turns == 3
    # thinking: only the new user query rewrites (the tool turn keeps the reasoning); without
    # thinking every turn does (each earlier reply loses the empty think block it followed)
    assert restarts == ([False, True, False] if thinking else [True, True, False])
    bounds = [0] + ep.segments + [len(ep.tokens)]
    replies_at = [k for k, m in enumerate(ep.messages) if m["role"] == "assistant"]
    opening = [{"role": "system", "content": "Use the tools."},
               {"role": "user", "content": "Add 2 and 3."}]
    conversation = opening + ep.messages[2:]
    for s, (a, z) in enumerate(zip(bounds[:-1], bounds[1:])):
        first = [k for k in range(len(replies_at)) if bounds[s] <= ep.turn_ends[k] < z][0]
        before = tok.apply_chat_template(conversation[:replies_at[first]],
                                         add_generation_prompt=True, tools=live.extra["tools"],
                                         **extra)
        text = tok.decode(ep.tokens[a:z])
        assert text.startswith(before)
        if s:
            assert THINK.strip() not in before  # the earlier reasoning: gone from the prompt
    assert tok.decode(ep.tokens[:bounds[1]]).count(THINK.strip()) == (2 if thinking else 0)
