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
- Whatever goes wrong is a `ChatTemplateError`: an `InputError` (the template or the messages are what a
  user fixes) that is also a `jinja2.TemplateError`, as it was before. That covers a template that does
  not compile, the template's own `raise_exception`, and anything else the template program raises on
  these messages (a missing key, `1/0`, runaway macro recursion). Messages must be a non-empty list of
  objects; their fields are the template's business (content may be a list of parts).
- The sandbox also refuses, before computing it, anything that would build a huge value: `'x' * 10**12`,
  `2 ** (10**8)`, a number over a million passed to a call or filter (`'x'.ljust(10**10)`,
  `x | center(10**10)`), a format width of a million or more (`'%999999999d' % 1`), a `tojson` indent
  past 64. (Loops remain bounded only by the sandbox's 100,000-item `range`: a template can still be
  slow, but not exhaust memory through these.)
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from hone.errors import InputError

_MAX_REPEAT = 1 << 20  # longest sequence `*` may build (characters or items)
_MAX_POWER_BITS = 1 << 16  # largest integer `**` may build, in bits
_MAX_INDENT = 64


class ChatTemplateError(InputError, jinja2.TemplateError):
    """The chat template cannot render these messages. `detail` is the reason alone (the message
    also names the key: 'chat_template', or 'messages' for messages that are not a list of objects)."""

    def __init__(self, detail: str, *, key: str = "chat_template", path: str | None = None):
        super().__init__(detail, path=path, key=key)
        self.detail = detail


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own `tojson` escapes <, >, & and ' for HTML, which would change the prompt text.
    if isinstance(indent, int) and indent > _MAX_INDENT:
        raise SecurityError(f"tojson indent {indent} is larger than {_MAX_INDENT}")
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


# A width or precision of seven digits or more in a printf-style (%) or str.format ({}) spec.
_HUGE_WIDTH = re.compile(r"%[-#0 +]*\.?\d{7,}|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")
_NESTED_WIDTH = re.compile(r"\{[^{}]*:[^{}]*\{")  # `'{:{w}}'.format(x, w=n)` takes a width from n


def _check_sizes(values: Any) -> None:
    """SecurityError for a number no chat template needs as a width, count or length argument:
    `'x'.ljust(10**10)` or `x | center(10**10)` would try to build a 10 GB string."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_REPEAT:
            raise SecurityError(f"the argument {value} is larger than {_MAX_REPEAT}")


def _check_format(text: Any) -> None:
    if isinstance(text, str) and _HUGE_WIDTH.search(text):
        raise SecurityError("a format width or precision of a million or more")


def _sized(fn: Any) -> Any:
    """A filter whose arguments (after the value) are checked by `_check_sizes`."""
    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_sizes(args[1:])
        _check_sizes(kwargs.values())
        return fn(*args, **kwargs)
    return checked


class _Sandbox(ImmutableSandboxedEnvironment):
    """The `transformers` sandbox, plus size checks before anything builds a huge value: `*`
    and `**`, printf-style `%`, calls and filters with huge number arguments, huge format widths."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.filters = {name: _sized(fn) for name, fn in self.filters.items()}

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            for seq, count in ((left, right), (right, left)):
                if (isinstance(seq, Sequence) and isinstance(count, int)
                        and len(seq) * count > _MAX_REPEAT):
                    raise SecurityError(f"repeating a sequence of {len(seq)} {count} times is "
                                        f"longer than {_MAX_REPEAT}")
            return operator.mul(left, right)
        if op == "%":
            _check_format(left)
            if isinstance(left, str) and "*" in left:  # `'%*d' % (n, x)` takes a width from n
                _check_sizes(right if isinstance(right, tuple) else (right,))
            return operator.mod(left, right)
        if (isinstance(left, int) and isinstance(right, int) and right > 0
                and max(left.bit_length(), 1) * right > _MAX_POWER_BITS):
            raise SecurityError(f"{left} ** {right} is too large")
        return operator.pow(left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        sizes = True
        if getattr(__obj, "__name__", None) in ("format", "format_map"):  # the sandbox's wrapper
            text = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            _check_format(text)
            # What format() is given are values to print, unless a spec takes its width from one.
            sizes = isinstance(text, str) and _NESTED_WIDTH.search(text) is not None
        if sizes:
            _check_sizes(args)
            _check_sizes(kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile `source` once; the same template string is reused for every conversation."""
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _sized(_tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    origin: str | None = None,
    **extra: Any,
) -> str:
    """The prompt text for `messages`; `special_tokens` maps names like `bos_token` to strings.

    Keywords in `extra` override special tokens of the same name, as in `transformers`. `origin`
    (the file the template came from) is named in a `ChatTemplateError`.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("apply_chat_template needs a non-empty list of messages",
                                key="messages", path=origin)
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {i} is {type(message).__name__}, not an object "
                                    "with role and content", key=f"messages[{i}]", path=origin)
    cleaned = [{k: v for k, v in dict(message).items() if v is not None} for message in messages]
    variables: dict[str, Any] = {"tools": None, "documents": None, **special_tokens, **extra}
    try:
        template = compile_template(source)
    except (jinja2.TemplateError, TypeError, ValueError, SyntaxError, RecursionError) as e:
        raise ChatTemplateError(f"the template does not compile ({_reason(e)})",
                                path=origin) from None
    try:
        return template.render(
            messages=cleaned, add_generation_prompt=add_generation_prompt, **variables
        )
    except Exception as e:  # the template is a program from a model file: anything it raises
        raise ChatTemplateError(_reason(e), path=origin) from e


def _reason(error: Exception) -> str:
    """The error's own text (a template's raise_exception message as written), cut short."""
    text = str(error) if isinstance(error, jinja2.TemplateError) else f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."
