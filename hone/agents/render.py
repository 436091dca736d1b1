"""Episode text from the chat template: the opening prompt, and what follows a model turn.

An episode is one token sequence that grows turn by turn. The model's tokens are kept as it
sampled them; everything else is the chat template's rendering of the conversation, cut into the
pieces that come between model turns:

    opening          render(opening messages, add_generation_prompt=True)
    after a turn     the rest of the template's closing of the assistant turn (ChatML: the
                     "\\n" after <|im_end|>; the end-of-turn token itself when the model did not
                     sample one), then the new messages, then the generation prompt

The second piece is found by rendering the conversation three ways (before the reply with the
generation prompt, through the reply, through the new messages with the generation prompt) and
taking differences, so any template that renders a conversation prefix by prefix works, and the
episode's text equals the template's rendering of the whole conversation (with the model's own
tokens where its reply is).

A template that rewrites earlier turns (Qwen3 drops the reasoning of replies before a new user
query, and with enable_thinking false the empty think block of every earlier reply), or does not
write the reply verbatim, cannot be continued so: `after_turn_text` raises `NotAPrefix`, and the
rollout starts a new segment of the episode from `opening_text` of the whole conversation, as
the template renders it now (hone/agents/rollout.py).

Tools: a template that mentions `tools` gets the environment's JSON schemas as its `tools`
argument; for one that does not, they are described in the system message
(`hone.agents.tool_messages.tools_system_text`, the text SFT data gets too). A template that
refuses the system or the tool role (Gemma's) gets the messages in the roles it takes
(`in_roles`), as SFT data does.
"""

from __future__ import annotations

from typing import Any

from hone.agents.tool_messages import fit_roles, for_template, refused_roles, takes_tools
from hone.errors import InputError


class NotAPrefix(InputError):
    """The template's rendering of the conversation after a turn does not extend the episode's
    text: the turn cannot be appended (a new segment can start; module doc)."""


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads a `tools` argument."""
    return takes_tools(getattr(tokenizer, "chat_template", None))


def with_tools(messages: list[dict], tools: list[dict] | None, native: bool) -> tuple[list[dict],
                                                                                  dict[str, Any]]:
    """(messages, extra template arguments) that show the model its tools: the `tools` argument
    when the template takes it (`native`), else a description in the system message (the text
    SFT data gets: `hone.agents.tool_messages.tools_system_text`)."""
    if not tools:
        return list(messages), {}
    if native:
        return list(messages), {"tools": tools}
    return for_template(list(messages), tools, None)


def in_roles(tokenizer, messages: list[dict], extra: dict[str, Any],
             opening: bool = True) -> list[dict]:
    """`messages` in the roles the tokenizer's chat template takes
    (`hone.agents.tool_messages.fit_roles`: for templates that refuse the system or tool role,
    such as Gemma's); opening: they start the conversation, else they answer a model turn."""
    template = getattr(tokenizer, "chat_template", None)
    refused = refused_roles(template, lambda m: tokenizer.apply_chat_template(
        m, add_generation_prompt=False, **extra))
    return fit_roles(messages, refused, opening)


def opening_text(tokenizer, messages: list[dict], extra: dict[str, Any]) -> str:
    """The episode's opening: its messages rendered with the generation prompt."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)


def after_turn_text(tokenizer, history: list[dict], reply: str, end_text: str | None,
                    new: list[dict], extra: dict[str, Any]) -> str:
    """The text between the model's reply and its next turn.

    history: the conversation before the reply (opening included); reply: the model's turn as
    text, without its end-of-turn token; end_text: that token's text when the model sampled
    one (it is already in the episode, as a model token), else None; new: the environment's
    messages."""
    def render(msgs, gen):
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=gen, **extra)

    said = history + [{"role": "assistant", "content": reply}]
    before, through, full = render(history, True), render(said, False), render(said + new, True)
    if not (through.startswith(before) and full.startswith(through)):
        raise NotAPrefix("the chat template does not render the conversation prefix by prefix, "
                         "so a turn cannot be appended to an episode", key="chat_template")
    turn = through[len(before):]
    at, content = turn.find(reply), reply
    if at < 0:  # templates that strip the content
        content = reply.strip()
        at = turn.find(content)
    if at < 0:
        raise NotAPrefix("the chat template does not write the assistant's reply verbatim, so "
                         "the model's tokens cannot be kept as sampled", key="chat_template")
    closing = turn[at + len(content):]
    if end_text and closing.startswith(end_text):
        closing = closing[len(end_text):]
    return closing + full[len(through):]
