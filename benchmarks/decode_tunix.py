"""Greedy decode with Tunix's vanilla sampler (run with the Tunix venv, see _venvs.py).

Model: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape, random init, fp32.
Sampler: tunix.generate.sampler.Sampler (greedy: no top_p / beam_size), KV cache sized for
prompt + new tokens. Prompts are random token ids, all of the same length; the tokenizer below
only turns a string of ids back into those ids, and EOS is an id no token can have, so every row
generates all new tokens. Prints one JSON line per batch size.

    benchmarks/.venvs/tunix/bin/python benchmarks/decode_tunix.py --repeats 5
"""

from __future__ import annotations

import time

from _measure import decode_args, emit_decode, first_and_median

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.llama3 import model as llama3_lib

PAD_ID = 0     # never in a prompt (prompt ids are drawn from 1..vocab-1)
NO_EOS = -1    # an id the model cannot produce: generation always runs to max_generation_steps


def smollm2_135m_config() -> llama3_lib.ModelConfig:
    return llama3_lib.ModelConfig(
        num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9,
        head_dim=64, num_kv_heads=3, rope_theta=100_000, norm_eps=1e-5, weight_tying=True,
        shd_config=llama3_lib.ShardingConfig.get_default_sharding(is_sampling=True))


class IdTokenizer:
    """The methods Tunix's TokenizerAdapter requires; a prompt is its ids joined by spaces."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self):
        return None  # falsy: Sampler.tokenize adds no BOS

    def eos_id(self) -> int:
        return NO_EOS

    def pad_id(self) -> int:
        return PAD_ID


def main():
    args = decode_args(__doc__.splitlines()[0])

    cfg = smollm2_135m_config()
    model = llama3_lib.Llama3(cfg, rngs=nnx.Rngs(args.seed))
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    # Sampler.__call__ pads prompts to the next power of two; the cache holds prompt + new tokens.
    padded_prompt = 1 << max(args.prompt_len - 1, 0).bit_length()
    cache = sampler_lib.CacheConfig(cache_size=padded_prompt + args.new_tokens,
                                    num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                                    head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(transformer=model, tokenizer=IdTokenizer(), cache_config=cache)
    rng = np.random.default_rng(args.seed)

    for b in args.batches:
        ids = rng.integers(1, cfg.vocab_size, size=(b, args.prompt_len))
        prompts = [" ".join(str(t) for t in row) for row in ids]

        def run():
            t0 = time.perf_counter()
            out = sampler(prompts, max_generation_steps=args.new_tokens, temperature=0.0,
                          eos_tokens=[NO_EOS], echo=False)
            dt = time.perf_counter() - t0
            lengths = {len(t) for t in out.tokens}
            assert lengths == {args.new_tokens}, f"generated lengths {lengths}"
            return dt, None

        first, med, _ = first_and_median(run, args.repeats)
        emit_decode("tunix", b, args.new_tokens, first, med)


if __name__ == "__main__":
    main()
