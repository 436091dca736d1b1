"""Supervised records -> token ids and a loss mask: the chat template, prompts, truncation.

An `Example` is one document: `tokens` int32 [T] and `loss_mask` bool [T], where
`loss_mask[t]` says token t is a *target* the model is trained to predict (from position t-1).
The shift to (input, target) pairs happens in `hone.data.collate`; `loss_mask[0]` is always False
because nothing predicts the first token.

Record formats (`format="auto"` looks at the fields):
- `messages`: a list of {"role": "system"|"user"|"assistant", "content": str}, rendered with the
  tokenizer's chat template. `loss_on="completion"` trains on every assistant message's content
  plus the end-of-turn token that closes it (the first of the tokenizer's `eos_ids` after the
  content; the whole closing text if the template writes none), so the model learns to stop.
  Tool use (`hone.agents.tool_messages`): `tool` messages, assistant messages with `tool_calls`
  (content may then be empty or missing) and the record's `tools`. Tool results get no loss; a
  tool-call turn is trained like any assistant turn, as the template writes it (its own tool-call
  format, or `tool_calls_as_text` in the content for a template without one).
- `prompt` + `completion`: the prompt as raw text, then the completion, then EOS; loss on the
  completion and EOS. A plain-text prompt is *not* wrapped in the chat template even when the
  tokenizer has one: the record says exactly what the model sees (as in TRL for non-conversational
  data), and a chat prompt can be written as `messages` instead. If `prompt` is a list of messages
  (and `completion` a string or a list of assistant messages) the pair is a conversation and is
  rendered like `messages`.
- `text`: every token is a target, then EOS.
`loss_on="all"` trains on every token (after the first) in every format.

How chat tokens and spans are made (the boundary policy). The conversation is cut into segments at
the start and end of each assistant content, found by rendering prefixes: the text before assistant
message i is `template(messages[:i], add_generation_prompt=True)`, the text through it is
`template(messages[:i+1])`, and both must be prefixes of the whole rendering (else the record is an
`InputError`: train that template with `loss_on="all"`). An assistant message that opens the
conversation has no prefix to render: its turn starts after the first occurrence, in its rendering,
of the generation prompt (the text `add_generation_prompt=True` adds after a probe user message).
A tool-call turn of a template that writes tool calls itself has no verbatim content to find: the
whole turn (the text between the two renderings) is trained through its first end-of-turn token.
Each segment is tokenized on its own and the ids are concatenated. The prompt segments are
therefore tokenized exactly as `hone.generate` tokenizes
`apply_chat_template(messages[:i], add_generation_prompt=True)` at inference (first segment with
special tokens and one BOS, the rest without), and the assistant content starts on a fresh
token, as generated text does: training and inference agree at the boundary the model must learn.
This can differ from tokenizing the whole rendering at once only where a BPE merge would cross a
boundary; for ChatML templates (special tokens and a newline at every boundary) the ids are the same.

Policies, counted in `Stats` for the caller to log:
- an empty (whitespace-only) completion, assistant content or text, or a conversation with no
  assistant message under `loss_on="completion"`: record skipped (`skipped_empty`);
- longer than `max_length` tokens: `overlong="truncate"` keeps the first `max_length` tokens (the
  prompt start survives, the end is cut; `truncated`), `overlong="drop"` skips it
  (`dropped_overlong`); a truncated record left with no trainable token is skipped and counted
  as `dropped_overlong` too.
- a missing field or a field of the wrong type is an `InputError` naming file, record and field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hone.agents.render import in_roles
from hone.agents.tool_messages import (check_tool_calls, check_tools, for_template,
                                       refused_tool_message)
from hone.chat_template import ChatTemplateError
from hone.errors import InputError
from hone.sampling.generate import encode_prompt

FORMATS = ("auto", "messages", "prompt_completion", "text")
LOSS_ON = ("completion", "all")
OVERLONG = ("truncate", "drop")
ROLES = ("system", "user", "assistant")
TOOL_ROLES = ROLES + ("tool",)  # SFT records may carry tool results (hone.agents.tool_messages)


@dataclass(frozen=True)
class Example:
    """One tokenized document."""
    tokens: np.ndarray     # int32 [T]
    loss_mask: np.ndarray  # bool [T]: token t is a trained target (predicted at position t-1)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Stats:
    """What happened to the records (the caller logs it once)."""
    kept: int = 0              # records turned into examples
    skipped_empty: int = 0     # nothing to learn: empty completion/assistant content/text
    dropped_overlong: int = 0  # longer than max_length under overlong="drop", or no target left
    truncated: int = 0         # kept, cut to max_length (counted in `kept` too)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in asdict(self).items())


def check_options(*, format: str = "auto", loss_on: str = "completion", max_length: int = 256,
                  overlong: str = "truncate") -> None:
    """InputError (naming the data.* key) for an option outside its allowed values."""
    for key, value, allowed in (("format", format, FORMATS), ("loss_on", loss_on, LOSS_ON),
                                ("overlong", overlong, OVERLONG)):
        if value not in allowed:
            raise InputError(f"must be one of {', '.join(allowed)}; got {value!r}", key=f"data.{key}")
    if not isinstance(max_length, int) or max_length < 2:
        raise InputError(f"must be an integer >= 2, got {max_length!r}", key="data.max_length")


def detect_format(record: dict, path: str = "<records>", index: int = 0) -> str:
    """'messages', 'prompt_completion' or 'text', from the fields present in `record`."""
    if "messages" in record:
        return "messages"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "text" in record:
        return "text"
    raise InputError(f"record {index}: cannot tell the SFT format from its fields "
                     f"({', '.join(map(repr, record)) or 'none'}); expected 'messages', or "
                     "'prompt' + 'completion', or 'text' (or set data.format)", path=path)


def tokenize_sft(record: dict, tokenizer, *, format: str = "auto", loss_on: str = "completion",
                 max_length: int = 256, overlong: str = "truncate", path: str = "<records>",
                 index: int = 0, stats: Stats | None = None) -> Example | None:
    """Tokens and loss mask of one record, or None when a policy skips it (counted in `stats`)."""
    stats = Stats() if stats is None else stats
    where = Where(path, index)
    if format == "auto":
        format = detect_format(record, path, index)
    if format == "messages":
        messages = parse_messages(where.field(record, "messages"), where, "messages", tools=True)
        keys = [f"messages[{j}]" for j in range(len(messages))]
        ids, mask = _tool_chat_tokens(messages, keys, record, tokenizer, loss_on, where)
    elif format == "prompt_completion":
        prompt, completion = where.field(record, "prompt"), where.field(record, "completion")
        if isinstance(prompt, list):  # conversational prompt-completion
            messages, keys = _as_conversation(prompt, completion, where)
            ids, mask = _tool_chat_tokens(messages, keys, record, tokenizer, loss_on, where)
        else:
            ids, mask = prompt_completion_tokens(where.string(prompt, "prompt"),
                                                 where.string(completion, "completion"),
                                                 tokenizer, loss_on)
    elif format == "text":
        text = where.string(where.field(record, "text"), "text")
        ids = None if not text.strip() else encode_prompt(tokenizer, text) + [tokenizer.eos_id]
        mask = None if ids is None else [True] * len(ids)
    else:
        raise InputError(f"must be one of {', '.join(FORMATS)}; got {format!r}", key="data.format")
    if ids is None:
        stats.skipped_empty += 1
        return None
    tokens = np.asarray(ids, np.int32)
    loss_mask = np.asarray(mask, np.bool_)
    loss_mask[0] = False  # nothing predicts the first token
    if len(tokens) > max_length:
        if overlong == "drop":
            stats.dropped_overlong += 1
            return None
        tokens, loss_mask = tokens[:max_length], loss_mask[:max_length]
        if not loss_mask.any():
            stats.dropped_overlong += 1
            return None
        stats.truncated += 1
    elif not loss_mask.any():
        stats.skipped_empty += 1
        return None
    stats.kept += 1
    return Example(tokens, loss_mask)


# ---- formats ---------------------------------------------------------------------------------

def prompt_completion_tokens(prompt: str, completion: str, tokenizer, loss_on: str):
    """Raw prompt ids then completion ids + EOS, and target flags; (None, None) if it is empty."""
    if not completion.strip():
        return None, None
    prompt_ids = encode_prompt(tokenizer, prompt)
    # Tokenized apart, as at inference: generation starts on a fresh token after the prompt.
    completion_ids = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_id]
    mask = [loss_on == "all"] * len(prompt_ids) + [True] * len(completion_ids)
    return prompt_ids + completion_ids, mask


def _tool_chat_tokens(messages: list[dict], keys: list[str], record: dict, tokenizer,
                      loss_on: str, where: Where):
    """`chat_tokens` of a conversation that may use tools: written for the template first
    (`for_template`), in the roles it takes (`fit_roles`: Gemma's get tool results as user
    turns); a template that still refuses the `tool` role is named at that message's role
    (`keys[j]` names message j in the record)."""
    tools = check_tools(record.get("tools"), where)
    ready, extra = for_template(messages, tools, getattr(tokenizer, "chat_template", None))
    try:
        return chat_tokens(in_roles(tokenizer, ready, extra), tokenizer, loss_on, where,
                           extra=extra)
    except InputError as err:
        if not isinstance(err.__cause__, ChatTemplateError):
            raise
        i = refused_tool_message(ready, lambda m: tokenizer.apply_chat_template(
            m, add_generation_prompt=False, **extra))
        if i is None:
            raise
        j = i - (len(ready) - len(messages))  # a system message may have been prepended
        raise where.error(f"{keys[j]}.role", f"the chat template refuses the role 'tool' "
                                             f"({err.__cause__.detail}); train tool results with "
                                             "a model whose template renders them") from err


def chat_tokens(messages: list[dict], tokenizer, loss_on: str, where: Where,
                last_only: bool = False, extra: dict[str, Any] | None = None):
    """Token ids and target flags of a conversation (the boundary policy of the module docstring),
    or (None, None) when an assistant message is empty or there is none; `last_only` trains only
    the final assistant message (the earlier ones are context, as in a preference prompt).
    `extra` goes to every rendering (`tools=`); an assistant message still carrying `tool_calls`
    is one whose template writes them itself."""
    extra = extra or {}
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if last_only:
        assistant = assistant[-1:]
    if any(not content_text(messages[i]["content"]).strip() and not messages[i].get("tool_calls")
           for i in assistant):
        return None, None
    full = where.render(tokenizer, messages, False, extra)
    if loss_on == "all":
        ids = encode_prompt(tokenizer, full)
        return ids, [True] * len(ids)
    if not assistant:
        return None, None
    segments: list[tuple[str, str]] = []  # (text, kind): kind "context", "content" or "closing"
    cursor = 0
    for i in assistant:
        through = where.render(tokenizer, messages[:i + 1], False, extra)
        before = (where.render(tokenizer, messages[:i], True, extra) if i
                  else _opening_prefix(through, tokenizer, extra))
        if not (through.startswith(before) and full.startswith(through) and len(before) >= cursor):
            raise InputError(
                f"record {where.index}: the chat template does not render this conversation "
                "prefix by prefix, so assistant spans cannot be found; use data.loss_on=all or "
                "the prompt/completion format", path=where.path, key="messages")
        turn = through[len(before):]
        if messages[i].get("tool_calls"):
            # The template's own tool-call text: the whole turn is what the model writes; it is
            # trained as a closing (through its first end-of-turn token) from its first character.
            if not before:
                raise where.error(f"messages[{i}]", "cannot find where this opening assistant "
                                  "turn starts; begin the conversation with a user or system "
                                  "message, or use data.loss_on=all")
            start = end = len(before)
        else:
            content = content_text(messages[i]["content"])
            start = turn.find(content)
            if start < 0:  # some templates strip whitespace around the content
                content = content.strip()
                start = turn.find(content)
            if start < 0:
                raise InputError(f"record {where.index}: the chat template does not write "
                                 f"assistant message {i}'s content verbatim; use data.loss_on=all",
                                 path=where.path, key=f"messages[{i}].content")
            start += len(before)
            end = start + len(content)
        segments += [(full[cursor:start], "context"), (full[start:end], "content"),
                     (full[end:len(through)], "closing")]
        cursor = len(through)
    segments.append((full[cursor:], "context"))

    stops = set(tokenizer.eos_ids) | {tokenizer.eos_id}
    ids: list[int] = []
    mask: list[bool] = []
    for text, kind in segments:
        if not text:
            continue
        piece = (encode_prompt(tokenizer, text) if not ids
                 else tokenizer.encode(text, add_special_tokens=False))
        if kind == "closing":
            # Train through the first end-of-turn token; the rest (a newline) is context.
            stop = next((k for k, t in enumerate(piece) if t in stops), len(piece) - 1)
            flags = [k <= stop for k in range(len(piece))]
        else:
            flags = [kind == "content"] * len(piece)
        ids += piece
        mask += flags
    return ids, mask


def content_text(content: Any) -> str:
    """A message's text: the string itself, or a list of content parts' text parts joined (a
    vision-language record's, hone.data.vision: the template renders the parts)."""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def _opening_prefix(through: str, tokenizer, extra: dict[str, Any]) -> str:
    """The text before the turn of an assistant message that opens the conversation (there is no
    earlier conversation to render): `through` up to the end of the generation prompt, found by
    rendering a probe user message with and without it; "" when the template does not tell."""
    probe = [{"role": "user", "content": "?"}]
    try:
        opened = tokenizer.apply_chat_template(probe, add_generation_prompt=True, **extra)
        closed = tokenizer.apply_chat_template(probe, add_generation_prompt=False, **extra)
    except Exception:  # a template that refuses the probe: fall back to the whole rendering
        return ""
    header = opened[len(closed):] if opened.startswith(closed) else ""
    at = through.find(header) if header.strip() else -1
    return through[:at + len(header)] if at >= 0 else ""


def _as_conversation(prompt: list, completion: Any, where: Where) -> tuple[list[dict], list[str]]:
    """(messages, the record key of each) of a conversational prompt-completion record."""
    messages = parse_messages(prompt, where, "prompt", tools=True)
    keys = [f"prompt[{j}]" for j in range(len(messages))]
    if isinstance(completion, str):
        return messages + [{"role": "assistant", "content": completion}], keys + ["completion"]
    replies = parse_messages(completion, where, "completion", tools=True)
    return messages + replies, keys + [f"completion[{j}]" for j in range(len(replies))]


def parse_messages(value: Any, where: Where, name: str, tools: bool = False) -> list[dict]:
    """`value` checked to be a non-empty list of {role, content} messages (errors name `name`).
    With `tools`, also `tool` messages and assistant `tool_calls` (checked, arguments parsed to
    objects; content may then be missing and reads ""), as `hone.agents.tool_messages` describes."""
    if not isinstance(value, list) or not value:
        raise where.error(name, f"must be a non-empty list of messages, got {_kind(value)}")
    roles = TOOL_ROLES if tools else ROLES
    out = []
    for j, message in enumerate(value):
        at = f"{name}[{j}]"
        if not isinstance(message, dict):
            raise where.error(at, f"must be an object with role and content, got {_kind(message)}")
        role = where.field(message, "role", f"{at}.role")
        if role not in roles:
            raise where.error(f"{at}.role", f"must be one of {', '.join(roles)}, got {role!r}")
        calls = message.get("tool_calls") if tools else None
        if calls is not None and role != "assistant":
            raise where.error(f"{at}.tool_calls", f"only assistant messages carry tool_calls, "
                                                  f"this one's role is {role!r}")
        if calls is not None:
            calls = check_tool_calls(calls, where, f"{at}.tool_calls")
        if calls and message.get("content") is None:
            content = ""  # a turn that only calls tools
        else:
            content = where.string(where.field(message, "content", f"{at}.content"),
                                   f"{at}.content")
        if role == "tool":
            for key in ("name", "tool_call_id"):
                if message.get(key) is not None:
                    where.string(message[key], f"{at}.{key}")
        parsed = {**message, "role": role, "content": content}
        if tools:
            parsed.pop("tool_calls", None)
            if calls:
                parsed["tool_calls"] = calls
        out.append(parsed)
    return out


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


@dataclass(frozen=True)
class Where:
    """The file and record a problem is in; builds InputErrors that name them and the field."""
    path: str
    index: int

    def error(self, key: str, message: str) -> InputError:
        return InputError(f"record {self.index}: {message}", path=self.path, key=key)

    def field(self, obj: dict, name: str, key: str | None = None) -> Any:
        if name not in obj:
            raise self.error(key or name, f"missing field (fields present: "
                                          f"{', '.join(map(repr, obj)) or 'none'})")
        return obj[name]

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {_kind(value)}")
        return value

    def render(self, tokenizer, messages: list[dict], add_generation_prompt: bool,
               extra: dict[str, Any] | None = None) -> str:
        try:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, **(extra or {}))
        except ChatTemplateError as err:  # the template's own raise_exception / Jinja errors
            raise self.error("messages", f"the chat template rejects this conversation "
                                         f"({err.detail})") from err
        except InputError:  # the tokenizer's (no chat template): it names its own source
            raise
        except Exception as err:  # a tokenizer whose apply_chat_template is not hone's
            raise self.error("messages", f"the chat template rejects this conversation "
                                         f"({err})") from err
