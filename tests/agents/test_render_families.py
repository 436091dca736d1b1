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
cannot start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.agents.environment import ToolEnvironment
from hone.agents.parsers import Llama3JsonParser
from hone.agents.render import (NotAPrefix, after_turn_text, opening_text, supports_tools,
                                with_tools)
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
    return env, messages, args, encode_prompt(tok, opening_text(tok, messages, args))


def end_token(tok) -> int:
    """The end-of-turn token a model samples: the end token the template closes a reply with."""
    closed = tok.apply_chat_template([{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "ZZZ"}],
                                     add_generation_prompt=False)
    return next(e for e in tok.eos_ids if tok.decode([e]) in closed.split("ZZZ", 1)[1])


@pytest.mark.parametrize("source", ["tiny", pytest.param("smollm2-135m-instruct",
                                                         marks=pytest.mark.real_model),
                                    "qwen2.5", "qwen3", "llama3.1", "llama3.2"])
def test_an_episode_is_the_tokenisation_of_the_whole_conversation(source):
    tok = tokenizer_of(source)
    assert supports_tools(tok) == (source in FAMILIES)
    env, messages, extra, ids = start(tok)
    end = end_token(tok)
    history = messages
    conversation = list(messages)
    for turn, reply in enumerate(replies_of(source)):
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
    if source in FAMILIES:  # the tools reached the template itself, not the system text
        assert '"name": "shout"' in whole and "To call a tool, write exactly" not in whole


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
    # Gemma 2 takes no system message (nor tool messages): the opening already fails
    gemma = family_tokenizer("gemma2")
    with pytest.raises(InputError, match="System role not supported"):
        start(gemma)
