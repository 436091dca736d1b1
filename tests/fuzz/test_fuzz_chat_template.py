"""Hostile chat templates and messages: `render_chat` either returns the prompt text or raises
`ChatTemplateError` (an InputError naming the template or the messages, and the file the template
came from when given).

Templates: the shapes real models ship (ChatML, Llama 3, a Gemma-style one that enforces role
order with `raise_exception`, a Qwen-style one with tools and `tojson`, one reading multimodal
content parts, one with `{% generation %}`), the same cut at any point, random text between
Jinja delimiters, and programs written to break out or run away: dunder access, mutation of the
messages, unbounded macro recursion, `'x' * 10**12`, `2 ** (10**8)`, `tojson(indent=10**9)`,
`range(10**12)`, division by zero, nesting past the recursion limit.
Messages: not a list, empty, items that are not objects, roles and contents of every JSON type,
content parts, `tool_calls` of the wrong shape, special tokens and lone surrogates in text.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz_common import EXAMPLES, FUZZ, HOSTILE_INTS, anywhere, mostly
from hone.chat_template import render_chat
from hone.errors import InputError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] "
          "+ '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] "
         "+ '\\n\\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first = '' %}"
         "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
         "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
         "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
         "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content']"
         " | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<start_of_turn>model\\n' }}{% endif %}")
QWEN_TOOLS = ("{% if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{% for tool in tools %}"
              "{{ tool | tojson }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
              "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' }}"
              "{% if message.content is string %}{{ message.content }}{% endif %}"
              "{% if message.tool_calls %}{% for call in message.tool_calls %}"
              "{% if call.function is defined %}{% set call = call.function %}{% endif %}"
              "{{ '<tool_call>' + call.name + (call.arguments | tojson) + '</tool_call>' }}"
              "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PARTS = ("{% for message in messages %}{{ message['role'] }}: {% if message['content'] is string %}"
         "{{ message['content'] }}{% else %}{% for part in message['content'] %}"
         "{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}"
         "<image>{% endif %}{% endfor %}{% endif %}\\n{% endfor %}")
GENERATION = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
              "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
REAL = [CHATML, LLAMA3, GEMMA, QWEN_TOOLS, PARTS, GENERATION]

NASTY = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.append(1) }}",
    "{{ messages[0].update(role='x') }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ 'x' * 10**12 }}", "{{ [0] * 10**10 }}", "{{ 2 ** (10**8) }}", "{{ 2 ** -5 }}",
    "{{ messages | tojson(indent=10**9) }}", "{{ range(10**12) | list }}", "{{ 1 / 0 }}",
    "{{ 1 // 0 }}", "{{ messages[99].content }}", "{{ messages['x'] }}", "{{ undefined_fn() }}",
    "{{ raise_exception('no') }}", "{{ raise_exception() }}", "{{ messages | nofilter }}",
    "{% for m in messages %}{{ m.content.upper() }}{% endfor %}", "{{ strftime_now('%Q') }}",
    "{{ strftime_now(5) }}", "{% break %}", "{% generation %}", "{% endgeneration %}",
    "{{ " + "(" * 3000 + " }}", "{% if %}", "{{ messages[0]['content'] + 1 }}",
    "{{ 'a' | int(base=99) }}", "{{ 'x' | center(10**12) }}", "{% set x = namespace() %}{{ x }}",
    "{{ messages | tojson }}", "{{ tools | tojson }}", "{{ bos_token * 3 }}", "{#", "{{", "{%",
    "{% for m in messages %}{% for n in messages %}{{ loop.length }}{% endfor %}{% endfor %}",
]
# Each of these would build a value of a gigabyte or more; the sandbox refuses them first.
HUGE = ["{{ 'x' * 10**9 }}", "{{ [0] * 10**9 }}", "{{ 2 ** (10**9) }}", "{{ 'x' | center(10**9) }}",
        "{{ 'x'.ljust(10**9) }}", "{{ '%999999999d' % 1 }}", "{{ '%*d' % (10**9, 1) }}",
        "{{ '{:>999999999}'.format(1) }}", "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
        "{{ messages | tojson(indent=10**9) }}", "{{ 'x' | indent(10**9) }}",
        "{{ '{:{w}}'.format(1, w=10**9) }}"]
NASTY += HUGE

# ---- strategies ---------------------------------------------------------------------------------

texts = (st.text(max_size=10) | st.sampled_from(["<|im_end|>", "{{ bos_token }}", "{% raw %}",
                                                  "\x00", "x\ud800", "\ufeff"]))
json_values = st.recursive(st.none() | st.booleans() | st.sampled_from(HOSTILE_INTS)
                           | st.floats() | texts,
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=6)
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "x"]) | texts},
                                       optional={"text": texts | json_values}), max_size=3)
messages = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "assistant", "system", "tool"]), json_values),
     "content": mostly(texts, parts | json_values)},
    optional={"tool_calls": st.lists(st.fixed_dictionaries(
        {"function": st.fixed_dictionaries({"name": texts | json_values,
                                            "arguments": json_values})}), max_size=2)
        | json_values, "name": texts})
conversations = mostly(st.lists(messages, min_size=1, max_size=5),
                       st.lists(messages | json_values, max_size=5) | json_values)

@st.composite
def templates(draw) -> str:
    kind = draw(st.sampled_from(["real", "real", "cut", "nasty", "random"]))
    if kind == "real":
        return draw(st.sampled_from(REAL))
    if kind == "cut":
        real = draw(st.sampled_from(REAL))
        return real[:draw(anywhere) % (len(real) + 1)]
    if kind == "nasty":
        return draw(st.sampled_from(NASTY))
    pieces = st.sampled_from(["{{", "}}", "{%", "%}", "{#", "#}", " for ", " in ", " if ",
                              " endif ", " endfor ", "messages", "|", "(", ")", "[", "]", "'",
                              " + ", ".", "loop", "raise_exception", " set ", "="]) | texts
    return "".join(draw(st.lists(pieces, max_size=12)))


# ---- properties ---------------------------------------------------------------------------------

def _render(template, conversation, add, tools) -> None:
    text = render_chat(template, conversation, add_generation_prompt=add,
                       special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
                       origin="model/chat_template.jinja", tools=tools)
    assert isinstance(text, str)


def test_real_templates_render_a_plain_conversation():
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for template in REAL:
        assert "hi" in render_chat(template, chat, add_generation_prompt=True,
                                   special_tokens={"bos_token": "<s>"})


def test_large_numbers_as_values_still_format():
    template = "{{ '{}'.format(5000000) }} {{ '%d' % 5000000 }} {{ 5000000 | string }}"
    assert render_chat(template, [{"role": "user", "content": "x"}], add_generation_prompt=True,
                       special_tokens={}) == "5000000 5000000 5000000"


def test_templates_that_would_exhaust_memory_are_refused():
    for template in HUGE:
        try:
            render_chat(template, [{"role": "user", "content": "x"}], add_generation_prompt=True,
                        special_tokens={})
        except InputError as err:
            assert err.key == "chat_template"
        else:
            raise AssertionError(f"rendered {template!r}")


@FUZZ
@given(template=templates(), conversation=conversations, add=st.booleans(),
       tools=st.none() | st.lists(json_values, max_size=2))
def test_hostile_templates_and_messages(template, conversation, add, tools):
    assert EXAMPLES >= 2000
    try:
        _render(template, conversation, add, tools)
    except InputError as err:  # names the template's file, and which is wrong: it or the messages
        assert "chat_template.jinja" in str(err)
        assert err.key == "chat_template" or err.key.startswith("messages")
