"""SFT on tool-use conversations: the tool-call text format, loss masks with tool calls and tool
results (templates with and without tools of their own), record errors naming the field."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hone
from hone.agents.tool_messages import tool_calls_as_text, tools_system_text
from hone.cli import main
from hone.data.sft import tokenize_sft
from hone.errors import InputError

TINY = hone.load_tokenizer("tiny")  # byte-level: one token per byte, ChatML without tools
TINY_CONFIG = str(Path(__file__).resolve().parents[2] / "configs/tiny/sft.yaml")

# A ChatML variant with tools of its own: tool schemas in a first system turn, calls as
# <call>NAME(ARGS)</call> after the content (a format unlike hone's text one, to tell them apart).
NATIVE = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
          "<|im_end|>\n{% endif %}"
          "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
          "{% for c in m['tool_calls'] or [] %}<call>{{ c['function']['name'] }}("
          "{{ c['function']['arguments'] | tojson }})</call>{% endfor %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def with_template(template):
    return hone.Tokenizer(TINY.backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                          chat_template=template, extra_eos_ids=[260])


NATIVE_TOK = with_template(NATIVE)


def trained_text(tok, example) -> str:
    return tok.decode(example.tokens[example.loss_mask].tolist())


def call(name, arguments, **extra):
    return {"type": "function", "function": {"name": name, "arguments": arguments}, **extra}


ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
CONVERSATION = [
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "tool_calls": [call("add", '{"a": 2, "b": 3}', id="c1")]},
    {"role": "tool", "name": "add", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "5."},
]


# ---- the text format ------------------------------------------------------------------------

def test_tool_calls_as_text_is_byte_exact():
    message = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        call("weather", {"city": "Zürich", "days": 2}), call("add", '{"a":1,"b":[2, 3]}')]}
    assert tool_calls_as_text(message) == (
        'Let me look.\n'
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Zürich", "days": 2}}\n'
        '</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, 3]}}\n</tool_call>')
    only = {"role": "assistant", "tool_calls": [call("f", {})]}
    assert tool_calls_as_text(only) == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert tool_calls_as_text({**only, "content": " \n"}) == tool_calls_as_text(only)
    assert tool_calls_as_text({"role": "assistant", "content": "hi"}) == "hi"


# ---- masks ----------------------------------------------------------------------------------

def test_two_turn_tool_conversation_masks_tiny():
    example = tokenize_sft({"messages": CONVERSATION}, TINY)
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    # (text, trained) in order; the byte-level tokenizer gives one token per byte or special token.
    pieces = [("<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n", False),
              (call_text + "<|im_end|>", True),
              ("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n", False),
              ("5.<|im_end|>", True), ("\n", False)]
    expected = [flag for text, trained in pieces
                for flag in [trained] * len(TINY.encode(text, add_special_tokens=False))]
    assert example.loss_mask.tolist() == expected
    assert TINY.decode(example.tokens) == "".join(text for text, _ in pieces)
    assert trained_text(TINY, example) == call_text + "<|im_end|>5.<|im_end|>"


def test_tools_go_to_a_template_that_takes_them():
    record = {"messages": CONVERSATION, "tools": [ADD]}
    example = tokenize_sft(record, NATIVE_TOK, max_length=4096)
    text = NATIVE_TOK.decode(example.tokens)
    assert text.startswith("<|im_start|>system\n" + json.dumps(ADD) + "\n<|im_end|>\n")
    # The template's own call format, arguments parsed from their JSON string (not quoted twice).
    assert "<|im_start|>assistant\n<call>add({\"a\": 2, \"b\": 3})</call><|im_end|>\n" in text
    assert trained_text(NATIVE_TOK, example) == (
        '<call>add({"a": 2, "b": 3})</call><|im_end|>5.<|im_end|>')


def test_tools_are_described_in_the_system_message_otherwise():
    bare = tokenize_sft({"messages": CONVERSATION, "tools": [ADD]}, TINY, max_length=4096)
    assert TINY.decode(bare.tokens).startswith(
        "<|im_start|>system\n" + tools_system_text([ADD]) + "<|im_end|>\n<|im_start|>user\n")
    system = [{"role": "system", "content": "Be brief."}]
    joined = tokenize_sft({"messages": system + CONVERSATION, "tools": [ADD]}, TINY,
                          max_length=4096)
    assert TINY.decode(joined.tokens).startswith(
        "<|im_start|>system\nBe brief.\n\n" + tools_system_text([ADD]) + "<|im_end|>\n")
    assert trained_text(TINY, bare) == trained_text(TINY, joined)
    assert json.dumps(ADD["function"]["parameters"], ensure_ascii=False) in tools_system_text([ADD]) and "<tool_call>" in tools_system_text([ADD])


def test_conversational_prompt_completion_with_tools():
    record = {"prompt": CONVERSATION[:3], "completion": "5.", "tools": [ADD]}
    reference = tokenize_sft({"messages": CONVERSATION, "tools": [ADD]}, NATIVE_TOK,
                             max_length=4096)
    example = tokenize_sft(record, NATIVE_TOK, max_length=4096)
    assert example.tokens.tolist() == reference.tokens.tolist()
    assert example.loss_mask.tolist() == reference.loss_mask.tolist()


def test_an_opening_assistant_turn_starts_after_the_generation_prompt():
    # "a" also occurs in "<|im_start|>assistant": the span must be found after that header.
    opening = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    example = tokenize_sft({"messages": opening}, TINY)
    assert trained_text(TINY, example) == "a<|im_end|>"
    calls_first = [{"role": "assistant", "tool_calls": [call("f", {})]}]
    example = tokenize_sft({"messages": calls_first}, NATIVE_TOK)
    assert trained_text(NATIVE_TOK, example) == "<call>f({})</call><|im_end|>"


# ---- property: the mask is exactly the assistant turns --------------------------------------

plain = st.text(max_size=12).filter(lambda s: "<|" not in s)  # no special-token spellings
names = st.text(min_size=1, max_size=6).filter(lambda s: s.strip() and "<|" not in s)
arguments = st.dictionaries(plain, st.integers() | plain | st.booleans(), max_size=3)
calls = st.lists(st.builds(lambda n, a, as_string: call(n, json.dumps(a) if as_string else a),
                           names, arguments, st.booleans()), max_size=2)
assistant = st.builds(lambda c, k: {"role": "assistant", "content": c, "tool_calls": k},
                      plain, calls).filter(lambda m: m["content"].strip() or m["tool_calls"])
steps = st.lists(st.one_of(st.builds(lambda c: {"role": "user", "content": c}, plain), assistant,
                           st.builds(lambda c: {"role": "tool", "content": c}, plain)),
                 min_size=1, max_size=6).filter(
                     lambda ms: any(m["role"] == "assistant" for m in ms))


def native_turn(message) -> str:
    return message["content"] + "".join(
        f"<call>{c['function']['name']}({json.dumps(_args(c), ensure_ascii=False)})</call>"
        for c in message["tool_calls"])


def _args(c):
    arguments = c["function"]["arguments"]
    return json.loads(arguments) if isinstance(arguments, str) else arguments


@settings(max_examples=80, deadline=None)
@given(messages=steps)
def test_mask_is_exactly_the_assistant_turns_text_template(messages):
    example = tokenize_sft({"messages": messages}, TINY, max_length=10_000)
    assert trained_text(TINY, example) == "".join(
        tool_calls_as_text(m) + "<|im_end|>" for m in messages if m["role"] == "assistant")
    full = TINY.decode(example.tokens)
    assert example.tokens.tolist() == TINY.encode(full, add_special_tokens=False)


@settings(max_examples=50, deadline=None)
@given(messages=steps, tools=st.booleans())
def test_mask_is_exactly_the_assistant_turns_native_template(messages, tools):
    record = {"messages": messages, **({"tools": [ADD]} if tools else {})}
    example = tokenize_sft(record, NATIVE_TOK, max_length=10_000)
    assert trained_text(NATIVE_TOK, example) == "".join(
        native_turn(m) + "<|im_end|>" for m in messages if m["role"] == "assistant")


# ---- errors ---------------------------------------------------------------------------------

def conversation_with(index, **fields):
    messages = [dict(m) for m in CONVERSATION]
    messages[index] = {k: v for k, v in {**messages[index], **fields}.items() if v is not ...}
    return {"messages": messages}


@pytest.mark.parametrize("record, field, words", [
    (conversation_with(1, tool_calls={"name": "add"}), "messages[1].tool_calls", "must be a list"),
    (conversation_with(1, tool_calls=["add"]), "messages[1].tool_calls[0]", "must be an object"),
    (conversation_with(1, tool_calls=[{"type": "function"}]), "messages[1].tool_calls[0].function",
     "missing field"),
    (conversation_with(1, tool_calls=[{"function": {"arguments": {}}}]),
     "messages[1].tool_calls[0].function.name", "missing field"),
    (conversation_with(1, tool_calls=[call("", {})]), "messages[1].tool_calls[0].function.name",
     "non-empty string"),
    (conversation_with(1, tool_calls=[call("add", [2, 3])]),
     "messages[1].tool_calls[0].function.arguments", "JSON object"),
    (conversation_with(1, tool_calls=[call("add", "[2, 3]")]),
     "messages[1].tool_calls[0].function.arguments", "got list"),
    (conversation_with(1, tool_calls=[call("add", "{a: 2}")]),
     "messages[1].tool_calls[0].function.arguments", "not JSON"),
    (conversation_with(1, tool_calls=[call("add", '{"a": "\\ud800"}')]),
     "messages[1].tool_calls[0].function.arguments", "UTF-8"),
    (conversation_with(1, tool_calls=[call("add", "[" * 100_000)]),
     "messages[1].tool_calls[0].function.arguments", "cannot be read"),
    (conversation_with(2, content=...), "messages[2].content", "missing field"),
    (conversation_with(2, content=None), "messages[2].content", "string, got null"),
    (conversation_with(2, tool_call_id=7), "messages[2].tool_call_id", "string"),
    (conversation_with(0, tool_calls=[call("add", {})]), "messages[0].tool_calls",
     "only assistant"),
    (conversation_with(3, content=...), "messages[3].content", "missing field"),
    ({**conversation_with(0), "tools": {"add": {}}}, "tools", "must be a list"),
    ({**conversation_with(0), "tools": ["add"]}, "tools[0]", "must be an object"),
])
def test_bad_tool_records_name_file_record_and_field(record, field, words):
    with pytest.raises(InputError) as err:
        tokenize_sft(record, TINY, path="data/tools.jsonl", index=4)
    message = str(err.value)
    assert message.startswith(f"data/tools.jsonl: '{field}': record 4: "), message
    assert words in message


def test_a_template_refusing_the_tool_role_gets_tool_results_as_user_turns():
    refusing = with_template("{% for m in messages %}{% if m['role'] == 'tool' %}"
                             "{{ raise_exception('Unknown role: tool') }}{% endif %}"
                             "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                             "{% if add_generation_prompt %}assistant: {% endif %}")
    conversation = CONVERSATION[:3] + [{"role": "tool", "content": "6"}] + CONVERSATION[3:]
    ex = tokenize_sft({"messages": conversation, "tools": [ADD]}, refusing, path="f.jsonl",
                      max_length=4096)
    text = refusing.decode(ex.tokens.tolist())
    assert "user: <tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>\n" \
        in text and "tool:" not in text  # consecutive results: one user turn
    assert trained_text(refusing, ex) == tool_calls_as_text(CONVERSATION[1]) + "\n" + "5.\n"


def test_a_template_still_refusing_the_tool_role_is_named_at_that_role():
    # refuses only tool messages that answer a call by id: the role probe passes, the data not
    refusing = with_template("{% for m in messages %}{% if m['role'] == 'tool' and "
                             "m['tool_call_id'] %}{{ raise_exception('Unknown role: tool') }}"
                             "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    expected = (r"^f\.jsonl: 'messages\[2\]\.role': record 0: the chat template refuses the "
                r"role 'tool' \(Unknown role: tool\)")
    with pytest.raises(InputError, match=expected):
        tokenize_sft({"messages": CONVERSATION, "tools": [ADD]}, refusing, path="f.jsonl")


def test_hone_sft_exits_2_on_a_bad_tool_call_before_training(tmp_path, capsys):
    bad = conversation_with(1, tool_calls=[call("add", "not json")])
    data = tmp_path / "tools.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATION}) + "\n" + json.dumps(bad) + "\n")
    code = main(["sft", "--config", TINY_CONFIG, f"run_dir={tmp_path / 'run'}",
                 f"data.path={data}", "data.eval_path=null"])
    assert code == 2
    err = capsys.readouterr().err
    assert "tools.jsonl" in err and "record 1" in err
    assert "messages[1].tool_calls[0].function.arguments" in err
    assert not (tmp_path / "run" / "checkpoints").exists()
