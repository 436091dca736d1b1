"""HermesParser reads <tool_call> blocks and counts what it cannot read; format writes exactly the
layout the SFT traces use, and parse(format(x)) == x for every JSON-representable call.
Llama3JsonParser reads the JSON objects Llama 3's templates ask for, with the same round trip."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.agents.parsers import HermesParser, Llama3JsonParser, ToolCall, parser_from_name
from hone.errors import InputError

P = HermesParser()


def test_blocks_anywhere_in_order_with_whitespace():
    reply = ('Let me compute. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and\n'
             '<tool_call>\n\n  {"name": "b", "arguments": {}}  \n</tool_call> done')
    assert P.parse(reply) == ([ToolCall("a", {"x": 1}), ToolCall("b", {})], 0)


def test_no_call():
    assert P.parse("The answer is 4.") == ([], 0)
    assert P.parse("") == ([], 0)


def test_arguments_as_json_string_and_missing_arguments():
    reply = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>'
             '<tool_call>{"name": "b"}</tool_call>')
    assert P.parse(reply) == ([ToolCall("a", {"x": [1, 2]}), ToolCall("b", {})], 0)


@pytest.mark.parametrize("block", [
    "{name: 'a'}",  # not JSON
    '{"arguments": {}}',  # no name
    '{"name": 3, "arguments": {}}',  # name not a string
    '{"name": "", "arguments": {}}',  # empty name
    '{"name": "a", "arguments": [1]}',  # arguments not an object
    '{"name": "a", "arguments": "[1]"}',  # a string that holds no object
    '{"name": "a", "arguments": "{oops"}',  # a string that holds no JSON
    '["a", {}]',  # not an object
    '{"name": "a", "arguments": {}} trailing',  # text between the JSON and the closing tag
])
def test_malformed_blocks_are_counted_and_the_next_call_still_read(block):
    reply = f'<tool_call>{block}</tool_call> then <tool_call>{{"name": "ok"}}</tool_call>'
    assert P.parse(reply) == ([ToolCall("ok", {})], 1)


def test_unclosed_block_is_malformed_and_does_not_hide_the_next_one():
    assert P.parse('<tool_call>{"name": "a", "argu') == ([], 1)
    reply = '<tool_call>{"name": "a"\n<tool_call>{"name": "b"}</tool_call>'
    assert P.parse(reply) == ([ToolCall("b", {})], 1)


def test_closing_tag_inside_an_argument_survives():
    call = ToolCall("echo", {"text": "a </tool_call> <tool_call> b"})
    assert P.parse(P.format([call])) == ([call], 0)


def test_format_is_byte_exact():
    calls = [ToolCall("calculator", {"expression": "4821 * 367"}),
             ToolCall("wetter", {"ort": "Zürich"})]
    assert P.format(calls) == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4821 * 367"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "wetter", "arguments": {"ort": "Zürich"}}\n'
        '</tool_call>')
    assert P.format([]) == ""


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)
CALLS = st.lists(st.builds(ToolCall, st.text(min_size=1),
                           st.dictionaries(st.text(), JSON, max_size=4)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(CALLS)
def test_round_trip(calls):
    assert P.parse(P.format(calls)) == (calls, 0)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<tool_call>/{}"name:arguments 1[],\n')), max_size=80))
def test_parse_never_raises(text):
    calls, malformed = P.parse(text)
    assert all(isinstance(c, ToolCall) for c in calls) and malformed >= 0


def test_parser_from_name():
    assert isinstance(parser_from_name("hermes"), HermesParser)
    assert isinstance(parser_from_name("llama3"), Llama3JsonParser)
    assert isinstance(parser_from_name("hone.agents.parsers:HermesParser"), HermesParser)


@pytest.mark.parametrize("name, says", [
    ("nope", "unknown parser 'nope'"),
    ("no_such_module_x:Parser", "cannot import module 'no_such_module_x'"),
    ("hone.agents.parsers:Nope", "has no 'Nope'"),
    ("json:dumps", "has no parse(reply) method"),
])
def test_parser_from_name_errors_name_the_key(name, says):
    with pytest.raises(InputError, match="'agent.parser'") as err:
        parser_from_name(name)
    assert says in str(err.value)


L = Llama3JsonParser()


def test_llama3_reads_the_reply_as_json_objects():
    assert L.parse('{"name": "add", "parameters": {"a": 2, "b": 3}}') == (
        [ToolCall("add", {"a": 2, "b": 3})], 0)
    assert L.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
                   '{"name": "shout", "arguments": {"text": "hi"}}\n') == (
        [ToolCall("add", {"a": 1}), ToolCall("shout", {"text": "hi"})], 0)
    assert L.parse("The sum is 5.") == ([], 0)  # an answer, not a call
    assert L.parse('{"name": "add", "parameters": {"a": 1}} so that is it') == (
        [ToolCall("add", {"a": 1})], 0)
    assert L.parse('{"name": "add", "parameters": {"a": 1') == ([], 1)  # cut off
    assert L.parse('{"name": "add", "parameters": {}}; {"parameters": {}}') == (
        [ToolCall("add", {})], 1)  # the second has no name
    assert L.format([ToolCall("add", {"a": 2}), ToolCall("wetter", {"ort": "Zürich"})]) == (
        '{"name": "add", "parameters": {"a": 2}}; {"name": "wetter", "parameters": {"ort": "Zürich"}}')


@settings(max_examples=200, deadline=None)
@given(CALLS)
def test_llama3_round_trip(calls):
    assert L.parse(L.format(calls)) == (calls, 0)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<|python_tag|>{}"name:parameters 1[],;\n')),
               max_size=80))
def test_llama3_parse_never_raises(text):
    calls, malformed = L.parse(text)
    assert all(isinstance(c, ToolCall) for c in calls) and malformed in (0, 1)
