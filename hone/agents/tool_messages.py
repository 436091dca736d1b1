"""Tool-use conversations: checking them, and writing them for chat templates without tools.

Records may carry the messages transformers' chat templates take for tool use (OpenAI's layout):
- an assistant message with `tool_calls`: [{"type": "function", "function": {"name": str,
  "arguments": dict or JSON-object string}, optional "id"}]; its `content` may be empty or missing;
- a `tool` message: {"role": "tool", "content": str, optional "name", optional "tool_call_id"};
- the record's `tools`: a list of JSON function schemas, passed to the template as `tools=`.

Templates differ in what they know. Choices:
- A template renders tool calls itself when its source mentions `tool_calls`, and takes `tools=`
  when its source names `tools` (the variable transformers passes); a template's own format is what
  the model was trained on, so hone never overrides it.
- For a template that does not render tool calls (ChatML as in the tiny preset, SmolLM2's), each
  call is written into the assistant content as text, the Hermes/Qwen layout
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (`tool_calls_as_text`), which
  `hone.agents.parsers` reads back. Tools such a template cannot take are described in the system
  message (`tools_system_text`). Training data and the agent sampler use these same two functions,
  so what the model learns to write is what the sampler parses.
- `arguments` given as a JSON string are parsed to an object first, everywhere: templates write
  them with `| tojson`, which would quote a string a second time.
- Tool messages keep their role: a template without tools renders `tool` like any role (ChatML:
  `<|im_start|>tool\\n...<|im_end|>\\n`). A template that refuses a role (Gemma's take only user
  and model turns, strictly alternating; Gemma 2's not even a system message) gets the
  conversation in the roles it takes (`fit_roles`): the system text at the head of the first user
  message (as Gemma 3's own template places it), each tool result as a user message wrapped in
  `<tool_response>` lines (Qwen's layout), and the messages between two assistant turns merged
  into one user turn. Training data, the agent sampler and `hone serve` all go through it, so a
  warm-started model sees in RL what it saw in SFT. `refused_tool_message` names a tool message
  that a template still refuses.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_REFUSED: dict[str, tuple[bool, bool]] = {}  # template source -> (refuses system, refuses tool)


def tool_calls_as_text(message: dict) -> str:
    """The text an assistant message writes when the template has no tool calls of its own:
    its content (if not blank), then one block per call, all joined by "\\n". A block is
    `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` with the JSON written by
    `json.dumps(..., ensure_ascii=False)` (keys in this order, arguments parsed first when they are
    a JSON string). `hone.agents.parsers` reads this format back; change the two together."""
    content = message.get("content") or ""
    blocks = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)  # OpenAI nests under "function"; accept it flat too
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        payload = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}")
    return "\n".join(([content] if content.strip() else []) + blocks)


def tools_system_text(schemas: list[dict]) -> str:
    """System-message text that lists the tools (JSON function schemas) and says exactly how to
    call them, for chat templates that cannot take `tools=`: the call format of
    `tool_calls_as_text`, which `hone.agents.parsers.HermesParser` reads. SFT data and the agent
    sampler both describe tools with this text, so a warm-started model sees the same prompt."""
    lines = ["You can call these tools:", ""]
    for schema in schemas:
        f = schema["function"]
        lines.append(f"- {f['name']}: {f.get('description', '')}".rstrip())
        lines.append("  arguments (JSON Schema): " + json.dumps(f["parameters"],
                                                                 ensure_ascii=False))
    lines += ["", "To call a tool, write exactly:", "<tool_call>",
              '{"name": "TOOL_NAME", "arguments": {"ARGUMENT": VALUE}}', "</tool_call>",
              "with the arguments as a JSON object. Each result comes back in a message from the "
              "tool. When you are done, answer without a tool call."]
    return "\n".join(lines)


def renders_tool_calls(template: str | None) -> bool:
    """Whether the chat template writes assistant `tool_calls` itself (its source mentions them)."""
    return template is not None and "tool_calls" in template


def takes_tools(template: str | None) -> bool:
    """Whether the chat template reads the `tools` variable (its source names it)."""
    return template is not None and re.search(r"\btools\b", template) is not None


def for_template(messages: list[dict], tools: list[dict] | None,
                 template: str | None) -> tuple[list[dict], dict[str, Any]]:
    """(messages, extra keywords for apply_chat_template) ready for `template`: tool calls stay
    structured for a template that renders them and become content text otherwise; `tools` go to
    the template as `tools=` or into the system message (prepended when there is none)."""
    extra: dict[str, Any] = {}
    if not renders_tool_calls(template):
        messages = [{**{k: v for k, v in m.items() if k != "tool_calls"},
                     "content": tool_calls_as_text(m)} if m.get("tool_calls") else m
                    for m in messages]
    if tools:
        if takes_tools(template):
            extra["tools"] = tools
        elif messages[0]["role"] == "system":
            first = messages[0]
            text = tools_system_text(tools)
            content = first["content"] + "\n\n" + text if first["content"].strip() else text
            messages = [{**first, "content": content}] + messages[1:]
        else:
            messages = [{"role": "system", "content": tools_system_text(tools)}] + messages
    return messages, extra


def refused_roles(template: str | None, render) -> tuple[bool, bool]:
    """(refuses a leading system message, refuses a tool message) of a chat template, found by
    rendering two short conversations each way (`render(messages)` raises on a refusal)."""
    if template is None:
        return False, False
    if template not in _REFUSED:
        def fails(messages) -> bool:
            try:
                render(messages)
            except Exception:  # noqa: BLE001 - any refusal of the template's
                return True
            return False

        q, a = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
        system = fails([{"role": "system", "content": "s"}, q]) and not fails([q])
        tool = (fails([q, a, {"role": "tool", "content": "r"}])
                and not fails([q, a, {"role": "user", "content": "r"}]))
        _REFUSED[template] = (system, tool)
    return _REFUSED[template]


def fit_roles(messages: list[dict], refused: tuple[bool, bool], opening: bool = True) -> list[dict]:
    """`messages` in the roles a template takes (module doc; `refused` from `refused_roles`):
    unchanged when it refuses none. opening: the messages start the conversation (a leading
    system message is folded into the first user message); else they follow an assistant turn
    (an environment's answer) and become one user message."""
    no_system, no_tool = refused
    if not (no_system or no_tool):
        return list(messages)
    prefix = ""
    if opening and no_system and messages and messages[0]["role"] == "system":
        prefix, messages = (messages[0].get("content") or "") + "\n\n", messages[1:]
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool" and no_tool:
            role, content = "user", f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
        elif role == "system" and no_system:
            role = "user"
        if role == "user" and out and out[-1]["role"] == "user":
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + content}
        else:
            out.append({**{k: v for k, v in m.items() if k not in ("name", "tool_call_id")
                           or role == m["role"]}, "role": role, "content": content})
    if prefix:
        first = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if first is None:
            out.insert(0, {"role": "user", "content": prefix.rstrip("\n")})
        else:
            out[first] = {**out[first], "content": prefix + out[first]["content"]}
    return out


def refused_tool_message(messages: list[dict], render) -> int | None:
    """Index of the first `tool` message the template refuses: the conversation renders up to it
    and fails with it (`render(prefix)` raises). None when that is not why the template fails."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "tool"), None)
    if first is None:
        return None
    try:
        if first:
            render(messages[:first])
    except Exception:
        return None
    try:
        render(messages[:first + 1])
    except Exception:
        return first
    return None


# ---- checking records --------------------------------------------------------------------------

def check_tool_calls(value: Any, where, key: str) -> list[dict]:
    """`value` (an assistant message's tool_calls) checked: a list of {"type": "function",
    "function": {"name", "arguments"}, "id"?}; arguments come back as an object. Errors name
    `key[k].function.arguments` and the like (`where` is `hone.data.sft.Where`)."""
    if not isinstance(value, list):
        raise where.error(key, f"must be a list of tool calls, got {_kind(value)}")
    calls = []
    for k, call in enumerate(value):
        at = f"{key}[{k}]"
        if not isinstance(call, dict):
            raise where.error(at, f"must be an object with a function, got {_kind(call)}")
        if call.get("type", "function") != "function":
            raise where.error(f"{at}.type", f"must be 'function', got {call['type']!r}")
        if "id" in call and call["id"] is not None and not isinstance(call["id"], str):
            raise where.error(f"{at}.id", f"must be a string, got {_kind(call['id'])}")
        function = where.field(call, "function", f"{at}.function")
        if not isinstance(function, dict):
            raise where.error(f"{at}.function", f"must be an object with name and arguments, "
                                                f"got {_kind(function)}")
        name = where.field(function, "name", f"{at}.function.name")
        if not isinstance(name, str) or not name.strip():
            raise where.error(f"{at}.function.name", f"must be a non-empty string, got {name!r}")
        arguments = _arguments(where.field(function, "arguments", f"{at}.function.arguments"),
                               where, f"{at}.function.arguments")
        calls.append({**call, "function": {**function, "arguments": arguments}})
    return calls


def _arguments(value: Any, where, key: str) -> dict:
    """Arguments as an object: an object as is, or a string holding a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise where.error(key, f"must be an object or a JSON object string; the string is "
                                   f"not JSON ({err.msg} at character {err.pos})") from None
        except (ValueError, RecursionError) as err:  # a 5,000-digit number, nesting too deep
            raise where.error(key, f"must be an object or a JSON object string; the string "
                                   f"cannot be read ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise where.error(key, f"must be an object or a JSON object string, got {_kind(value)}")
    try:  # it is written back as text: a lone surrogate ("\\ud800") from the string is not text
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as err:  # UnicodeEncodeError is a ValueError
        raise where.error(key, f"cannot be written as UTF-8 JSON text ({type(err).__name__})"
                          ) from None
    return value


def check_tools(value: Any, where) -> list[dict] | None:
    """A record's `tools`: None, or a list of JSON function schemas (objects)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise where.error("tools", f"must be a list of function schemas, got {_kind(value)}")
    for k, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise where.error(f"tools[{k}]", f"must be an object (a JSON function schema), "
                                             f"got {_kind(tool)}")
    return value or None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
