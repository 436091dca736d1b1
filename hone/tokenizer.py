"""Text <-> token ids for every model hone loads, and the chat prompt around them.

This file owns loading a tokenizer (a Hugging Face folder, the metadata of a GGUF file, or the built-in
byte-level one of the `tiny` preset), encoding, decoding, the special ids a trainer needs (BOS, EOS,
pad, the set of ids that end generation) and saving a folder `transformers` can load. Rendering chat
templates lives in `hone.chat_template`. Design choices:

- One backend for every source: a `tokenizers.Tokenizer`. Folders load their `tokenizer.json` as is;
  GGUF vocabularies are rebuilt into the same kind of object. Encoding is therefore the `tokenizers`
  library's own, and `save()` is always a `tokenizer.json` that `transformers` reads unchanged.
- BOS is added by the backend's post-processor, exactly where `tokenizers`' `encode(text).ids` adds it,
  so ids agree with the reference libraries without a second rule living here.
- GGUF metadata is read by `hone.weights.gguf_format.read_metadata`, hone's one GGUF parser, asking it
  to decode only the two string arrays used here (tokens and merges); it needs well under a second for
  Gemma 3's 262k-token vocabulary, where `gguf.GGUFReader` needs about 10 s.
- A GGUF "llama" (SentencePiece BPE) vocabulary becomes a `tokenizers` BPE whose merges are recovered
  from the pieces, ranked by piece order (for normal pieces the scores fall strictly with the id, so
  this is SentencePiece's own "best score first" rule). Control tokens (`<start_of_turn>`) become
  special added tokens so raw text containing them encodes to their ids; user-defined pieces (runs of
  newlines or spaces) become added tokens that match whole, as SentencePiece's prefix matcher does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from hone.chat_template import render_chat
from hone.errors import InputError
from hone.weights.gguf_format import read_metadata
from hone.weights.shipped import SHIPPED_MODELS, shipped_gguf_path

# Tokens that close a chat turn in common templates. One of them joins `eos_ids` when it is a special
# token of the vocabulary and the chat template writes it (or there is no template to ask, as in
# Gemma 3's base GGUF, whose turns still end with <end_of_turn>).
_END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>")

# GGUF token_type codes used here (llama.cpp's, the same as SentencePiece's piece types; the others
# are 2 unknown, 5 unused, 6 byte).
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

# The metadata string arrays `from_gguf` reads; the parser skips every other one without decoding.
_GGUF_STRING_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")

# Pre-tokenizer regexes for byte-level GGUF vocabularies, keyed by `tokenizer.ggml.pre`. A vocabulary's
# merges only reproduce its training-time ids when text is cut the same way, so an unknown key is an
# error rather than a guess.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_REGEX_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT,
                 "qwen2": _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")}


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special tokens and chat template of one model."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        chat_template: str | None = None,
        extra_eos_ids: Sequence[int] = (),
        source: str = "<memory>",
    ):
        self.backend = backend
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token,
                        "pad_token": pad_token}
        self._chat_template = chat_template
        self.source = source  # where it came from, for error messages
        self.bos_id = self._id(bos_token)
        self.eos_id = self._id(eos_token)
        # Batches need some pad id; eos is the usual stand-in and is masked out of losses anyway.
        pad = self._id(pad_token)
        self.pad_id = pad if pad is not None else self.eos_id
        self.vocab_size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.eos_ids = self._collect_eos_ids(extra_eos_ids)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def _collect_eos_ids(self, extra: Sequence[int]) -> tuple[int, ...]:
        ids = [self.eos_id, *extra]
        specials = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
        for token in _END_OF_TURN_TOKENS:
            if token in specials and (self._chat_template is None or token in self._chat_template):
                ids.append(self.backend.token_to_id(token))
        return tuple(dict.fromkeys(int(i) for i in ids if i is not None))  # ordered, no repeats

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    # ---- encoding ----------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids ([T]) of `text`; `add_special_tokens` adds BOS where the post-processor does."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` ([T] ints)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """The prompt for `messages`, as transformers' `apply_chat_template(..., tokenize=False)`."""
        if self._chat_template is None:
            raise InputError("this tokenizer has no chat template; load a chat model or add "
                             "chat_template.jinja to its folder", path=self.source, key="chat_template")
        specials = {k: v for k, v in self._tokens.items() if v is not None}
        return render_chat(self._chat_template, messages, add_generation_prompt=add_generation_prompt,
                           special_tokens=specials, origin=self.source, **extra)

    # ---- saving ------------------------------------------------------------------------------------

    def save(self, out_dir: str | Path) -> None:
        """Write a folder that `transformers.AutoTokenizer.from_pretrained` loads with the same ids."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        specials = {k: v for k, v in self._tokens.items() if v is not None}
        config: dict[str, Any] = {
            # The generic class keeps tokenizer.json's pipeline; model-specific classes may rebuild it.
            "tokenizer_class": "PreTrainedTokenizerFast",
            # transformers' default would strip spaces before punctuation when decoding.
            "clean_up_tokenization_spaces": False,
            **specials,
        }
        if self._chat_template is not None:
            config["chat_template"] = self._chat_template
            (out / "chat_template.jinja").write_text(self._chat_template, encoding="utf-8")
        _write_json(out / "tokenizer_config.json", config)
        _write_json(out / "special_tokens_map.json", specials)

    # ---- loading -----------------------------------------------------------------------------------

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        """Load a Hugging Face tokenizer folder (tokenizer.json plus optional config files)."""
        folder = Path(path)
        if not folder.is_dir():
            raise InputError("no such tokenizer folder", path=str(folder))
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise InputError("missing; hone reads the fast-tokenizer file tokenizer.json", path=str(file))
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as err:  # the library raises a bare Exception for every parse problem
            raise InputError(f"the tokenizers library cannot read it ({err})", path=str(file)) from err
        config = _read_json(folder / "tokenizer_config.json")
        special_map = _read_json(folder / "special_tokens_map.json")
        generation = _read_json(folder / "generation_config.json")

        def token(name: str) -> str | None:
            value = config.get(name) or special_map.get(name)
            if isinstance(value, dict):  # older files store AddedToken objects
                value = value.get("content")
            return value if isinstance(value, str) else None

        # generation_config.json lists every id that stops generation (Gemma: <eos> and <end_of_turn>).
        stop = generation.get("eos_token_id")
        extra_eos = [stop] if isinstance(stop, int) else [i for i in stop or () if isinstance(i, int)]
        return cls(backend, bos_token=token("bos_token"), eos_token=token("eos_token"),
                   pad_token=token("pad_token"), unk_token=token("unk_token"),
                   chat_template=_folder_template(folder, config), extra_eos_ids=extra_eos,
                   source=str(folder))

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Rebuild the tokenizer described by a GGUF file's `tokenizer.*` metadata."""
        path = str(path)
        meta = read_metadata(path, arrays=_GGUF_STRING_ARRAYS)

        def need(key: str) -> Any:
            if key not in meta:
                raise InputError("the file has no tokenizer metadata under this key", path=path, key=key)
            return meta[key]

        kind = need("tokenizer.ggml.model")
        tokens = list(need("tokenizer.ggml.tokens"))
        types = np.asarray(meta.get("tokenizer.ggml.token_type", np.full(len(tokens), _NORMAL)))
        if len(types) != len(tokens):
            raise InputError(f"has {len(types)} entries for {len(tokens)} tokens", path=path,
                             key="tokenizer.ggml.token_type")
        if kind == "gpt2":
            default_bos = False
            backend = _byte_level_bpe(tokens, types, need("tokenizer.ggml.merges"),
                                      meta.get("tokenizer.ggml.pre", "gpt2"), path)
        elif kind == "llama":
            default_bos = True  # llama.cpp adds BOS to SentencePiece vocabularies that do not say
            tokens = _respell_spaces(tokens)
            prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            backend = _sentencepiece_bpe(tokens, types, meta, add_space_prefix=prefix)
        else:
            raise InputError(f"tokenizer kind {kind!r} is not supported; hone rebuilds 'gpt2' (byte-level "
                             "BPE) and 'llama' (SentencePiece BPE)", path=path, key="tokenizer.ggml.model")

        def token(key: str) -> str | None:
            index = meta.get(f"tokenizer.ggml.{key}")
            if index is None:
                return None
            if not 0 <= int(index) < len(tokens):
                raise InputError(f"id {index} is outside the {len(tokens)}-token vocabulary", path=path,
                                 key=f"tokenizer.ggml.{key}")
            return tokens[int(index)]

        bos = token("bos_token_id")
        if bos is not None and bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)):
            bos_id = int(meta["tokenizer.ggml.bos_token_id"])
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
        extra_eos = [int(meta[k]) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                     if k in meta]
        return cls(backend, bos_token=bos, eos_token=token("eos_token_id"),
                   pad_token=token("padding_token_id"), unk_token=token("unknown_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"), extra_eos_ids=extra_eos, source=path)

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """The `tiny` preset's tokenizer: ids 0..255 are UTF-8 bytes, 256..263 special tokens.

        Encoding adds no BOS: its ChatML template marks turns with <|im_start|>, and pretraining-style
        text can ask for BOS explicitly. Every string survives encode/decode unchanged.
        """
        backend = byte_level_backend(["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>",
                                      *(f"<|reserved_{k}|>" for k in range(3))])
        chatml = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                  "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
        return cls(backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", chat_template=chatml,
                   extra_eos_ids=[backend.token_to_id("<|im_end|>")], source="byte_level")


def byte_level_backend(specials: Sequence[str]) -> tokenizers.Tokenizer:
    """A byte-level BPE without merges: ids 0..255 are the UTF-8 bytes (each byte its own token),
    then `specials` as special tokens from id 256 on."""
    vocab = {char: byte for byte, char in enumerate(_byte_chars())}
    vocab.update({token: 256 + k for k, token in enumerate(specials)})
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return backend


# ---- Hugging Face folder helpers ----------------------------------------------------------------------

def load_tokenizer(source: str | Path):
    """The hone.Tokenizer that belongs to a model source."""
    src = str(source)
    if src in SHIPPED_MODELS:
        return Tokenizer.from_gguf(shipped_gguf_path(src))
    if src in ("tiny", "tiny-moe"):  # the test presets: 264 = 256 bytes + 8 specials
        return Tokenizer.byte_level()
    path = Path(src)
    if path.suffix == ".gguf":
        return Tokenizer.from_gguf(path)
    if path.is_dir():
        return Tokenizer.from_hf_folder(path)
    raise InputError("no tokenizer for this source: give a Hugging Face folder with "
                     "tokenizer.json, a .gguf file, 'tiny', 'tiny-moe' or a shipped model",
                     path=src, key="model.source")


def _read_json(file: Path) -> dict[str, Any]:
    """The object in `file`, or {} when the file is absent."""
    if not file.is_file():
        return {}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"not readable JSON ({err})", path=str(file)) from err
    if not isinstance(value, dict):
        raise InputError("expected a JSON object", path=str(file))
    return value


def _write_json(file: Path, value: dict[str, Any]) -> None:
    file.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _folder_template(folder: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja (transformers 5.x) or tokenizer_config.json's chat_template (older)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one is the chat template
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# ---- GGUF vocabularies ----------------------------------------------------------------------------------

def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255 (byte-level BPE vocabularies)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    chars, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:  # control bytes and space move above 255 so every token is visible text
            chars.append(chr(256 + shifted))
            shifted += 1
    return chars


def _added_tokens(tokens: list[str], types: np.ndarray, normalized_user: bool) -> list[AddedToken]:
    """Control tokens as special added tokens, user-defined ones as plain added tokens (matched whole)."""
    added = [AddedToken(tokens[i], special=True, normalized=False)
             for i in np.flatnonzero(types == _CONTROL)]
    added += [AddedToken(tokens[i], special=False, normalized=normalized_user)
              for i in np.flatnonzero(types == _USER_DEFINED)]
    return added


def _byte_level_bpe(tokens: list[str], types: np.ndarray, merges: list[str], pre: str,
                    path: str) -> tokenizers.Tokenizer:
    """Byte-level BPE from GGUF tokens (already in GPT-2's byte alphabet) and "left right" merges."""
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    if pre == "gpt2":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre == "smollm":
        # SmolLM splits every digit off first; its merges never join digits (or spaces before them).
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre in _REGEX_SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_REGEX_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise InputError(f"pre-tokenizer {pre!r} is not known to hone (known: gpt2, smollm, "
                         f"{', '.join(_REGEX_SPLITS)})", path=path, key="tokenizer.ggml.pre")
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens(_added_tokens(tokens, types, normalized_user=False))
    return backend


def _respell_spaces(tokens: list[str]) -> list[str]:
    """Spaces back to U+2581: llama.cpp stores SentencePiece's whitespace-only pieces with real spaces."""
    taken = set(tokens)
    out = []
    for token in tokens:
        if " " in token:
            respelled = token.replace(" ", "\u2581")
            token = token if respelled in taken else respelled  # never merge two ids into one string
        out.append(token)
    return out


def _sentencepiece_merges(tokens: list[str], types: np.ndarray, scores: Any) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece BPE vocabulary, best first.

    SentencePiece merges the adjacent pair whose joined string is the best-scoring normal piece; a
    pair (left, right) can only form when both halves are themselves pieces. So every split of a
    normal piece into two normal pieces is a merge, ranked by the piece's score (ties: by id).
    """
    ids = np.flatnonzero(types == _NORMAL)
    if scores is not None:
        ids = ids[np.argsort(-np.asarray(scores, dtype=np.float64)[ids], kind="stable")]
    normal = {tokens[i] for i in ids}
    merges = []
    for i in ids:
        piece = tokens[i]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((left, right))
    return merges


def _sentencepiece_bpe(tokens: list[str], types: np.ndarray, meta: dict[str, Any],
                       add_space_prefix: bool) -> tokenizers.Tokenizer:
    """A `tokenizers` BPE that encodes like SentencePiece BPE with byte fallback (Gemma, Llama 2)."""
    merges = _sentencepiece_merges(tokens, types, meta.get("tokenizer.ggml.scores"))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    model = models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                       unk_token=None if unk_id is None else tokens[int(unk_id)],
                       byte_fallback=True, fuse_unk=True)
    backend = tokenizers.Tokenizer(model)
    # No pre-tokenizer: SentencePiece's BPE encoder merges over the whole text, not word by word.
    escape = normalizers.Replace(" ", "\u2581")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:  # Llama 2 style; Gemma has none. Untested against a real file.
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), escape])
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        backend.normalizer = escape
    backend.decoder = decoders.Sequence(steps)
    # User-defined pieces are matched after the space escape, so "▁▁" finds a run of two spaces.
    backend.add_special_tokens(_added_tokens(tokens, types, normalized_user=True))
    return backend
