"""Greedy decode with hone (`hone.generate`, temperature 0, no EOS so every row runs to the end).

Model: `hone.load_model("smollm2-135m")`: the SmolLM2-135M architecture, random init, fp32.
Prompts are random token-id lists, all of the same length. Prints one JSON line per batch size.

    .venv/bin/python benchmarks/decode_hone.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hone


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    model = hone.load_model("smollm2-135m", seed=args.seed)
    cfg = model.config
    dtypes = {x.dtype for x in jax.tree.leaves(model) if hasattr(x, "dtype")}
    assert dtypes <= {jnp.dtype(jnp.float32)}, dtypes
    rng = np.random.default_rng(args.seed)

    for b in [int(x) for x in args.batches.split(",")]:
        prompts = rng.integers(3, cfg.vocab_size, size=(b, args.prompt_len)).tolist()

        def run():
            t0 = time.perf_counter()
            out = hone.generate(model, None, prompts, max_new_tokens=args.new_tokens,
                                temperature=0.0, eos_ids=())
            dt = time.perf_counter() - t0
            lengths = {len(c.tokens) for c in out}
            assert len(out) == b and lengths == {args.new_tokens}, f"generated lengths {lengths}"
            return dt

        first = run()
        times = [run() for _ in range(max(1, args.repeats))]
        med = statistics.median(times)
        print(json.dumps({"impl": "hone", "batch": b, "first_s": round(first, 4),
                          "median_s": round(med, 4),
                          "tokens_per_s": round(b * args.new_tokens / med, 2)}), flush=True)


if __name__ == "__main__":
    main()
