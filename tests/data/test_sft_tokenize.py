"""tokenize_sft: loss masks per format, the chat boundary policy, truncation policies and errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hone
from hone.data.sft import Stats, detect_format, tokenize_sft
from hone.datasets import BUILTIN
from hone.errors import InputError

TINY = hone.load_tokenizer("tiny")
IM_END = 260


def trained_text(tok, example) -> str:
    return tok.decode(example.tokens[example.loss_mask].tolist())


def chat(*turns):
    roles = ["user", "assistant"] * len(turns)
    return {"messages": [{"role": r, "content": c} for r, c in zip(roles, turns)]}


# ---- messages ------------------------------------------------------------------------------

contents = st.text(max_size=40).filter(lambda s: "<|" not in s)  # no special-token spellings
replies = contents.filter(str.strip)  # an empty reply skips the record (tested separately)


@settings(max_examples=150, deadline=None)
@given(system=st.none() | contents, turns=st.lists(st.tuples(contents, replies), min_size=1,
                                                    max_size=4),
       trailing_user=st.none() | contents)
def test_chat_mask_is_exactly_assistant_contents_and_end_of_turn(system, turns, trailing_user):
    messages = [] if system is None else [{"role": "system", "content": system}]
    for user, reply in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    if trailing_user is not None:
        messages.append({"role": "user", "content": trailing_user})
    example = tokenize_sft({"messages": messages}, TINY, max_length=10_000)
    assert trained_text(TINY, example) == "".join(reply + "<|im_end|>" for _, reply in turns)
    # The byte-level tokenizer cannot merge across a boundary: the segments equal the whole.
    full = TINY.apply_chat_template(messages, add_generation_prompt=False)
    assert example.tokens.tolist() == TINY.encode(full, add_special_tokens=False)
    assert example.tokens.dtype == np.int32 and example.loss_mask.dtype == np.bool_
    assert not example.loss_mask[0]


def test_chat_mask_positions_tiny():
    example = tokenize_sft(chat("Hi", "Yo"), TINY)
    prompt = TINY.apply_chat_template(chat("Hi")["messages"], add_generation_prompt=True)
    n = len(TINY.encode(prompt))
    assert example.loss_mask.tolist() == [False] * n + [True, True, True, False]
    assert example.tokens[n + 2] == IM_END and TINY.decode(example.tokens[-1:]) == "\n"


def test_chat_loss_on_all():
    example = tokenize_sft(chat("Hi", "Yo"), TINY, loss_on="all")
    assert example.loss_mask.tolist() == [False] + [True] * (len(example) - 1)


def test_chat_without_assistant_is_skipped():
    stats = Stats()
    assert tokenize_sft({"messages": [{"role": "user", "content": "hi"}]}, TINY, stats=stats) is None
    assert stats.skipped_empty == 1 and stats.kept == 0


def with_template(template):
    return hone.Tokenizer(TINY.backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                          chat_template=template)


def test_template_without_end_of_turn_token_trains_its_closing_text():
    tok = with_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant: {% endif %}")
    example = tokenize_sft(chat("Hi", "Yo", "More", "Ok"), tok)
    assert trained_text(tok, example) == "Yo\nOk\n"


def test_template_that_trims_content():
    tok = with_template("{% for m in messages %}<|im_start|>{{ m['content'] | trim }}<|im_end|>"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>{% endif %}")
    example = tokenize_sft(chat("Hi", "  Yo  "), tok)
    assert trained_text(tok, example) == "Yo<|im_end|>"


def test_template_not_rendering_prefixes_is_an_input_error():
    tok = with_template("{{ messages | length }}{% for m in messages %}{{ m['content'] }}"
                        "<|im_end|>{% endfor %}")
    with pytest.raises(InputError, match=r"f\.jsonl: 'messages': record 2: .*prefix by prefix"):
        tokenize_sft(chat("Hi", "Yo"), tok, path="f.jsonl", index=2)
    assert tokenize_sft(chat("Hi", "Yo"), tok, loss_on="all") is not None
    rejecting = with_template("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InputError, match="rejects this conversation.*roles must alternate"):
        tokenize_sft(chat("Hi", "Yo"), rejecting)


@pytest.mark.real_model
def test_chat_segments_match_whole_rendering_smollm2():
    tok = hone.load_tokenizer("smollm2-135m-instruct")
    records = BUILTIN["arithmetic"]()[:50] + [
        chat("Hello", " Hi there!", "and now?", "Tokens   with  spaces\n\nand lines ")]
    for record in records:
        example = tokenize_sft(record, tok, max_length=4096)
        full = tok.apply_chat_template(record["messages"], add_generation_prompt=False)
        assert example.tokens.tolist() == tok.encode(full, add_special_tokens=False)
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert trained_text(tok, example) == "".join(r + "<|im_end|>" for r in replies)
        # The default system prompt the template adds is context, never a target.
        assert "SmolLM" in tok.decode(example.tokens) and "SmolLM" not in trained_text(tok, example)


# ---- prompt + completion, text ---------------------------------------------------------------

def test_prompt_completion_is_not_wrapped_in_chat_template():
    example = tokenize_sft({"prompt": "2+2=", "completion": "4"}, TINY)
    assert example.tokens.tolist() == TINY.encode("2+2=") + TINY.encode("4") + [TINY.eos_id]
    assert example.loss_mask.tolist() == [False] * 4 + [True, True]
    assert 259 not in example.tokens  # no <|im_start|>: the prompt is raw text
    everything = tokenize_sft({"prompt": "2+2=", "completion": "4"}, TINY, loss_on="all")
    assert everything.loss_mask.tolist() == [False] + [True] * 5


def test_conversational_prompt_completion_equals_messages():
    pair = {"prompt": [{"role": "user", "content": "Hi"}], "completion": "Yo"}
    listed = {"prompt": pair["prompt"], "completion": [{"role": "assistant", "content": "Yo"}]}
    reference = tokenize_sft(chat("Hi", "Yo"), TINY)
    for record in (pair, listed):
        example = tokenize_sft(record, TINY)
        assert example.tokens.tolist() == reference.tokens.tolist()
        assert example.loss_mask.tolist() == reference.loss_mask.tolist()


def test_text_trains_every_token_and_ends_with_eos():
    example = tokenize_sft({"text": "abc"}, TINY)
    assert example.tokens.tolist() == [97, 98, 99, TINY.eos_id]
    assert example.loss_mask.tolist() == [False, True, True, True]


def test_detect_format():
    assert detect_format(chat("a", "b")) == "messages"
    assert detect_format({"prompt": "a", "completion": "b", "extra": 1}) == "prompt_completion"
    assert detect_format({"text": "a"}) == "text"
    with pytest.raises(InputError, match=r"f\.jsonl.*record 4.*'prompt'"):
        detect_format({"prompt": "only"}, "f.jsonl", 4)


# ---- policies --------------------------------------------------------------------------------

@pytest.mark.parametrize("record", [
    {"prompt": "p", "completion": "  "}, {"text": ""}, chat("q", "a", "q2", " \n"),
])
def test_empty_targets_are_skipped_and_counted(record):
    stats = Stats()
    assert tokenize_sft(record, TINY, stats=stats) is None
    assert stats.as_dict() == {"kept": 0, "skipped_empty": 1, "dropped_overlong": 0, "truncated": 0}


def test_overlong_truncate_keeps_the_start():
    record = {"prompt": "x" * 6, "completion": "y" * 6}
    whole = tokenize_sft(record, TINY)
    stats = Stats()
    cut = tokenize_sft(record, TINY, max_length=9, stats=stats)
    assert cut.tokens.tolist() == whole.tokens[:9].tolist()
    assert cut.loss_mask.tolist() == whole.loss_mask[:9].tolist()
    assert stats.truncated == 1 and stats.kept == 1


def test_overlong_drop_and_no_target_left():
    record = {"prompt": "x" * 6, "completion": "y" * 6}
    stats = Stats()
    assert tokenize_sft(record, TINY, max_length=9, overlong="drop", stats=stats) is None
    # Truncation that leaves only prompt tokens: nothing to train, dropped too.
    assert tokenize_sft(record, TINY, max_length=6, stats=stats) is None
    assert stats.as_dict() == {"kept": 0, "skipped_empty": 0, "dropped_overlong": 2, "truncated": 0}
    # Exactly max_length fits.
    assert len(tokenize_sft(record, TINY, max_length=13, overlong="drop", stats=stats)) == 13


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("record, fmt, field, words", [
    ({"messages": "hi"}, "auto", "messages", "non-empty list"),
    ({"messages": []}, "auto", "messages", "non-empty list"),
    ({"messages": ["hi"]}, "auto", "messages[0]", "must be an object"),
    ({"messages": [{"content": "hi"}]}, "auto", "messages[0].role", "missing field"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "auto", "messages[0].role", "one of"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}, "auto",
     "messages[1].content", "missing field"),
    ({"messages": [{"role": "user", "content": 3}]}, "auto", "messages[0].content", "string"),
    ({"prompt": "p", "completion": None}, "auto", "completion", "got null"),
    ({"prompt": 1, "completion": "c"}, "auto", "prompt", "string"),
    ({"text": "t"}, "messages", "messages", "missing field"),
    ({"prompt": "p"}, "prompt_completion", "completion", "missing field"),
    ({"text": ["a"]}, "text", "text", "string"),
])
def test_bad_records_name_file_record_and_field(record, fmt, field, words):
    with pytest.raises(InputError) as err:
        tokenize_sft(record, TINY, format=fmt, path="data/train.jsonl", index=7)
    message = str(err.value)
    assert message.startswith(f"data/train.jsonl: '{field}': record 7: ")
    assert words in message
