"""Greedy decode with hone (`hone.generate`, temperature 0, no EOS so every row runs to the end).

Model: `hone.load_model("smollm2-135m")`: the SmolLM2-135M architecture, random init, fp32.
Prompts are random token-id lists, all of the same length. Prints one JSON line per batch size.

    .venv/bin/python benchmarks/decode_hone.py --repeats 5
"""

from __future__ import annotations

from _measure import decode_args, emit_decode, first_and_median

import jax
import jax.numpy as jnp
import numpy as np

import hone


def main():
    args = decode_args(__doc__.splitlines()[0])

    model = hone.load_model("smollm2-135m", seed=args.seed)
    cfg = model.config
    dtypes = {x.dtype for x in jax.tree.leaves(model) if hasattr(x, "dtype")}
    assert dtypes <= {jnp.dtype(jnp.float32)}, dtypes
    rng = np.random.default_rng(args.seed)

    for b in args.batches:
        prompts = rng.integers(3, cfg.vocab_size, size=(b, args.prompt_len)).tolist()

        def run():
            return hone.generate(model, None, prompts, max_new_tokens=args.new_tokens,
                                 temperature=0.0, eos_ids=())

        def check(out):
            lengths = {len(c.tokens) for c in out}
            assert len(out) == b and lengths == {args.new_tokens}, f"generated lengths {lengths}"

        first, med, _ = first_and_median(run, args.repeats, value=check)
        emit_decode("hone", b, args.new_tokens, first, med)


if __name__ == "__main__":
    main()
