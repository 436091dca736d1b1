"""Greedy decode with Tunix's vanilla sampler (run with the Tunix venv, see _venvs.py).

Model: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape, random init, fp32.
Sampler: tunix.generate.sampler.Sampler (greedy: no top_p / beam_size), KV cache sized for
prompt + new tokens. Prompts are random token ids, all of the same length; the tokenizer
(_tunix_model.IdTokenizer) only turns a string of ids back into those ids, and EOS is an id no
token can have, so every row generates all new tokens. Prints one JSON line per batch size.

    benchmarks/.venvs/tunix/bin/python benchmarks/decode_tunix.py --repeats 5
"""

from __future__ import annotations

from _measure import decode_args, emit_decode, first_and_median

import numpy as np
from tunix.generate import sampler as sampler_lib

from _tunix_model import NO_EOS, IdTokenizer, new_model


def main():
    args = decode_args(__doc__.splitlines()[0])

    model = new_model(args.seed, sampling=True)
    cfg = model.config
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
            return sampler(prompts, max_generation_steps=args.new_tokens, temperature=0.0,
                           eos_tokens=[NO_EOS], echo=False)

        def check(out):
            lengths = {len(t) for t in out.tokens}
            assert lengths == {args.new_tokens}, f"generated lengths {lengths}"

        first, med, _ = first_and_median(run, args.repeats, value=check)
        emit_decode("tunix", b, args.new_tokens, first, med)


if __name__ == "__main__":
    main()
