"""hone: JAX-native post-training for large language models (public API, see docs/api.md)."""

from hone.errors import InputError
from hone.models.transformer import Transformer
from hone.sampling.generate import Completion, generate
from hone.weights.hf import save_hf
from hone.weights.loading import load_model


def __getattr__(name):
    # The tokenizer pulls in tokenizers/sentencepiece/jinja2; import it only when asked for.
    if name in ("Tokenizer", "load_tokenizer"):
        from hone import tokenizer
        return getattr(tokenizer, name)
    raise AttributeError(name)


__all__ = ["Completion", "InputError", "Transformer", "Tokenizer", "generate", "load_model",
           "load_tokenizer", "save_hf"]
