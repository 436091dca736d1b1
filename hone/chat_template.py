"""Rendering chat templates the way `transformers` does.

A chat template is a Jinja2 program shipped with a model that turns a list of messages into the exact
prompt text the model was trained on. This file owns running it. Choices:

- The sandbox is `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, and the
  `loopcontrols` extension (`{% break %}`), as in `transformers`: templates come from the internet, and
  the same template must render the same bytes here and there, or a fine-tuned model sees prompts at
  inference that differ from the ones it was trained on.
- The names a template may use are the ones `transformers` gives it: `raise_exception`, `strftime_now`,
  a `tojson` filter that keeps non-ASCII text as is, `messages`, `add_generation_prompt`, `tools` and
  `documents` (None unless given: templates test `tools is not none`), the special-token strings
  (`bos_token`, `eos_token`, ...) and any extra keyword the caller passes.
- `{% generation %}...{% endgeneration %}` (used by templates that mark assistant text for loss masks)
  renders its body unchanged; hone computes loss masks from token spans, not from this tag.
- Keys whose value is None are dropped from messages first, as `transformers` does, so a template that
  checks `'tool_calls' in message` behaves the same for `{"tool_calls": None}`.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own `tojson` escapes <, >, & and ' for HTML, which would change the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}body{% endgeneration %}` renders `body`: the tag only marks text for masks."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile `source` once; the same template string is reused for every conversation."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    **extra: Any,
) -> str:
    """The prompt text for `messages`; `special_tokens` maps names like `bos_token` to strings.

    Keywords in `extra` override special tokens of the same name, as in `transformers`.
    """
    if not messages:
        raise ValueError("apply_chat_template needs at least one message")
    cleaned = [{k: v for k, v in dict(message).items() if v is not None} for message in messages]
    variables: dict[str, Any] = {"tools": None, "documents": None, **special_tokens, **extra}
    return compile_template(source).render(
        messages=cleaned, add_generation_prompt=add_generation_prompt, **variables
    )
