"""OpenAI's chat-completions format, in and out: a request body -> the prompt's token ids and
the sampling settings; the engine's samples -> a response (or, streamed, its chunks).

In: `messages` (system/user/assistant/tool; an assistant's `tool_calls` with `arguments` as a
JSON string or object), `tools` (function schemas), `n`, `max_tokens` or
`max_completion_tokens`, `temperature`, `top_p`, `top_k` (an extension), `seed`, `stream`,
`logprobs`. The conversation is rendered with the model's chat template as hone renders agent
episodes (hone/agents/tool_messages.py: a template without tool support gets the tools in the
system message and the calls as Hermes `<tool_call>` blocks). Fields that would change what
the engine samples but that it does not do (`stop`, `top_logprobs` > 0, penalties,
`logit_bias`, `response_format`, n with a greedy request) are refused with a 400 naming the
field, never ignored; fields that do not change the tokens (`user`, `metadata`, `store`,
`stream_options`, ...) are accepted.

Out: the reply's text, and the tool calls parsed from it (hone.agents.parsers.HermesParser;
finish_reason "tool_calls"); `logprobs.content` when asked; and in every choice the extension
`hone: {"token_ids", "logprobs"}`, the sampled ids exactly (the end token included) with the
sampler's log-prob of each, so a trainer never tokenises the text again. The response's top
level carries `hone: {"prompt_token_ids"}`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hone.agents.parsers import HermesParser
from hone.agents.render import in_roles
from hone.agents.tool_messages import for_template
from hone.sampling.generate import encode_prompt
from hone.serve.engine_loop import Settings

REFUSED = {"stop": None, "top_logprobs": 0, "presence_penalty": 0, "frequency_penalty": 0,
           "logit_bias": None, "response_format": None, "tool_choice": "auto",
           "parallel_tool_calls": True}  # the value each may have (what hone does anyway)


class BadRequest(ValueError):
    """A request hone cannot serve: a 400 naming the field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass
class ChatRequest:
    """A parsed request: the prompt's ids and how to sample it."""

    prompt: list[int]
    settings: Settings
    n: int
    max_tokens: int
    seed: int | None
    stream: bool
    logprobs: bool
    tools: bool
    model: str
    body: dict
    messages: list[dict]  # as `messages_of` normalises them
    tool_list: list[dict] | None
    episode: str | None  # `hone.episode`: a session of hone/serve/sessions.py


def _number(body: dict, key: str, kind, low=None, high=None, default=None):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise BadRequest(f"{key} must be {'a number' if kind is float else 'an integer'}", key)
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadRequest(f"{key} must lie in [{low}, {high}], got {value}", key)
    return kind(value)


def messages_of(body: dict) -> list[dict]:
    """The body's messages, checked, with developer as system, text parts joined and tool-call
    arguments as objects."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user",
                                                           "assistant", "tool"):
            raise BadRequest("each message needs a role of system, developer, user, assistant "
                             "or tool", f"messages[{i}]")
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise BadRequest("only text content parts are served", f"messages[{i}].content")
            m["content"] = "".join(str(p.get("text", "")) for p in content)
        elif content is None:
            m["content"] = ""
        elif not isinstance(content, str):
            raise BadRequest("content must be a string or a list of text parts",
                             f"messages[{i}].content")
        if m.get("tool_calls"):
            m["tool_calls"] = [_call_in(c, f"messages[{i}].tool_calls[{k}]")
                               for k, c in enumerate(m["tool_calls"])]
        out.append(m)
    return out


def _call_in(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("a tool call needs function.name", where)
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise BadRequest(f"function.arguments is not JSON ({e.msg})", where) from None
    return {**call, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def render(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The prompt's token ids: the conversation through the chat template, generation prompt
    on."""
    messages, extra = for_template(messages, tools or None, tokenizer.chat_template)
    messages = in_roles(tokenizer, messages, extra)  # Gemma's: tool results as user turns
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)
    return encode_prompt(tokenizer, text)


def parse_request(body: Any, tokenizer, model_name: str, context: int) -> ChatRequest:
    """A request body -> ChatRequest; BadRequest naming the field when it cannot be served."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for key, allowed in REFUSED.items():
        if key in body and body[key] not in (allowed, None):
            raise BadRequest(f"{key} is not supported by hone serve", key)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)):
        raise BadRequest("tools must be a list of {type: function, function: {...}}", "tools")
    temperature = _number(body, "temperature", float, 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", float, 0.0, 1.0, None)
    top_k = _number(body, "top_k", int, 1, None, None)
    n = _number(body, "n", int, 1, 64, 1)
    if temperature == 0.0 and n > 1:
        raise BadRequest("n > 1 with temperature 0 would repeat one greedy answer", "n")
    messages = messages_of(body)
    episode = (body.get("hone") or {}).get("episode") if isinstance(body.get("hone"),
                                                                     dict) else None
    if episode is not None and (not isinstance(episode, str) or n != 1
                                or body.get("stream")):
        raise BadRequest("an episode (hone.episode) is a string id, with n = 1 and no stream",
                         "hone.episode")
    # An episode's prompt is its session's tokens (hone/serve/sessions.py), made when it runs.
    prompt = [] if episode is not None else render(tokenizer, messages, tools)
    room = context - len(prompt)
    if room < 1:
        raise BadRequest(f"the conversation is {len(prompt)} tokens, the served context is "
                         f"{context}", "messages")
    limit = _number(body, "max_completion_tokens", int, 1, None, None)
    limit = _number(body, "max_tokens", int, 1, None, limit)
    settings = Settings(temperature, None if temperature == 0 else top_k,
                        None if temperature == 0 or top_p == 1.0 else top_p)
    return ChatRequest(prompt=prompt, settings=settings, n=n,
                       max_tokens=min(limit or room, room), seed=_number(body, "seed", int),
                       stream=bool(body.get("stream", False)),
                       logprobs=bool(body.get("logprobs", False)), tools=bool(tools),
                       model=str(body.get("model") or model_name), body=body,
                       messages=messages, tool_list=tools, episode=episode)


def reply_text(tokenizer, tokens: list[int], eos: set[int]) -> tuple[str, bool]:
    """(text of a sample without its end token, whether it ended on one)."""
    ended = bool(tokens) and tokens[-1] in eos
    return tokenizer.decode(tokens[:-1] if ended else tokens), ended


def split_calls(text: str, tools: bool) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of a reply: the Hermes blocks as calls when the request
    gave tools, the text before them as content (None when blank)."""
    if not tools:
        return text, []
    calls, _ = HermesParser().parse(text)
    if not calls:
        return text, []
    head = text[:text.find("<tool_call>")].strip() if "<tool_call>" in text else text.strip()
    return head or None, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                           "function": {"name": c.name,
                                        "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                          for c in calls]


def token_logprobs(tokenizer, tokens: list[int], logprobs: list[float]) -> dict:
    """OpenAI's `logprobs` object of a choice (no alternatives)."""
    content = []
    for t, lp in zip(tokens, logprobs):
        text = tokenizer.decode([t])
        content.append({"token": text, "logprob": float(lp),
                        "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return {"content": content}


def choice(tokenizer, req: ChatRequest, index: int, sample, eos: set[int]) -> dict:
    text, ended = reply_text(tokenizer, sample.tokens, eos)
    content, calls = split_calls(text, req.tools)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop" if ended else "length"
    out = {"index": index, "message": message, "finish_reason": finish,
           "logprobs": token_logprobs(tokenizer, sample.tokens, sample.logprobs)
           if req.logprobs else None,
           "hone": {"token_ids": list(sample.tokens), "logprobs": list(sample.logprobs)}}
    return out


def response(tokenizer, req: ChatRequest, samples, eos: set[int], rid: str) -> dict:
    completion = sum(len(s.tokens) for s in samples)
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": req.model,
            "choices": [choice(tokenizer, req, k, s, eos) for k, s in enumerate(samples)],
            "usage": {"prompt_tokens": len(req.prompt), "completion_tokens": completion,
                      "total_tokens": len(req.prompt) + completion},
            "hone": {"prompt_token_ids": list(req.prompt)}}


def chunk(req: ChatRequest, rid: str, created: int, delta: dict, index: int = 0,
          finish: str | None = None, extra: dict | None = None) -> dict:
    c = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
    if extra:
        c.update(extra)
    return {"id": rid, "object": "chat.completion.chunk", "created": created,
            "model": req.model, "choices": [c]}
