"""Exact episode rendering per shipped chat template with tools: an episode assembled as the
sampler assembles it (the opening, each reply's ids, the environment's turn from
`after_turn_text`) is, id for id, the tokenisation of the template's rendering of the whole
conversation, with several tool calls in one turn and consecutive tool messages.

Families whose templates are not shipped (Qwen3, Gemma's chat models, Llama 3) cannot be checked
on a machine without a model hub; the shipped ones are the tiny preset's ChatML and
SmolLM2-135M-Instruct's (neither has tool support of its own: calls are Hermes blocks in the
reply, tools are described in the system message)."""

from __future__ import annotations

import pytest

from hone.agents.environment import ToolEnvironment
from hone.agents.render import after_turn_text, opening_text, supports_tools, with_tools
from hone.sampling.generate import encode_prompt
from hone.tokenizer import load_tokenizer


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


@pytest.mark.parametrize("source", ["tiny", pytest.param("smollm2-135m-instruct",
                                                         marks=pytest.mark.real_model)])
def test_an_episode_is_the_tokenisation_of_the_whole_conversation(source):
    tok = load_tokenizer(source)
    env = ToolEnvironment([add, shout], lambda **_: 1.0, system_prompt="Use the tools.",
                          runner="inline")
    opening = env.reset({"prompt": "Add 2 and 3, shout hi, then add 1."})
    messages, extra = with_tools(opening, env.tools, supports_tools(tok))
    ids = encode_prompt(tok, opening_text(tok, messages, extra))
    # The end-of-turn token a model samples: the end token the template closes a reply with.
    closed = tok.apply_chat_template([{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "x"}],
                                     add_generation_prompt=False)
    end = next(e for e in tok.eos_ids if tok.decode([e]) in closed.split("x", 1)[1])
    history = messages
    conversation = list(messages)
    for turn, reply in enumerate(REPLIES):
        ids += tok.encode(reply, add_special_tokens=False) + [end]
        step = env.step(reply)
        conversation.append({"role": "assistant", "content": reply})
        if step.done:
            break
        new = step.messages
        assert [m["role"] for m in new] == ["tool"] * (2 if turn == 0 else 1)
        ids += tok.encode(after_turn_text(tok, history, reply, tok.decode([end]), new, extra),
                          add_special_tokens=False)
        history = history + [{"role": "assistant", "content": reply}] + new
        conversation += new
    assert step.done and step.reward == 1.0
    assert [m["content"] for m in conversation if m["role"] == "tool"] == ["5", "HI", "6"]
    whole = tok.apply_chat_template(conversation, add_generation_prompt=False, **extra)
    expect = encode_prompt(tok, whole)
    # The rendering closes the last reply after its end token ("\n" in ChatML): the episode
    # stops at the end token the model sampled.
    assert ids == expect[:len(ids)] and tok.decode(expect[len(ids):]).strip() == ""
