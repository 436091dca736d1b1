"""How far a bfloat16 KV cache moves the sampler's log-probabilities from a float32 one
(SmolLM2-135M-Instruct, float32 weights).

For a few chat prompts the sampler generates with `cache_dtype=jnp.bfloat16`, at temperature 1
(seed 0) and greedily. The sampled tokens are then scored teacher-forced by one float32 forward
(what a float32 cache gives, to 1e-4: tests/sampling/test_generate.py), so the drift is measured
on the very same tokens. Greedy: the float32-cache completion beside the bfloat16 one, how many
rows differ and where the first difference falls. Prints one summary line per mode.

    .venv/bin/python benchmarks/cache_dtype.py [--prompts 4] [--new-tokens 96]
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import numpy as np

import hone
from hone.losses.common import token_logprobs
from hone.sampling.generate import encode_prompt

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in two sentences why the sky is blue.", "List three uses of a paperclip.",
           "What is 17 times 23?", "Give me a short tip for learning to cook.",
           "Describe a cat to someone who has never seen one.", "Why do leaves change colour?"]


def teacher_forced(model, prompt_ids: list[int], tokens: list[int]) -> np.ndarray:
    """log p of each completion token under one float32 forward over prompt + completion."""
    ids = prompt_ids + tokens
    x = jnp.asarray([ids[:-1]], jnp.int32)
    lp = np.asarray(token_logprobs(model(x), jnp.asarray([ids[1:]])))[0]
    return lp[len(prompt_ids) - 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args()
    source = "smollm2-135m-instruct"
    tok = hone.load_tokenizer(source)
    model = hone.load_model(source, dtype="float32")
    texts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                     add_generation_prompt=True)
             for p in PROMPTS[:args.prompts]]
    ids = [encode_prompt(tok, t) for t in texts]
    t0 = time.time()
    sampled = hone.generate(model, tok, ids, max_new_tokens=args.new_tokens, temperature=1.0,
                            seed=0, cache_dtype=jnp.bfloat16)
    drift = np.concatenate([np.abs(teacher_forced(model, p, o.tokens) - np.array(o.logprobs))
                            for p, o in zip(ids, sampled)])
    print(f"sampled (T=1, bf16 cache) vs float32 teacher-forced: {len(drift)} tokens, "
          f"max |dlogp| {drift.max():.2e}, mean {drift.mean():.2e}")
    g32 = hone.generate(model, tok, ids, max_new_tokens=args.new_tokens)
    g16 = hone.generate(model, tok, ids, max_new_tokens=args.new_tokens,
                        cache_dtype=jnp.bfloat16)
    firsts, gaps, same = [], [], 0
    for a, b in zip(g32, g16):
        k = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
        same += k is None and len(a.tokens) == len(b.tokens)
        firsts.append("-" if k is None else str(k))
        stop = min(len(a.tokens), len(b.tokens)) if k is None else k + 1
        gaps.append(np.abs(np.array(a.logprobs[:stop]) - np.array(b.logprobs[:stop])))
    gaps = np.concatenate(gaps)
    print(f"greedy: {same}/{len(ids)} rows identical (first differing token per row: "
          f"{', '.join(firsts)}); |dlogp| up to the first difference: max {gaps.max():.2e}, "
          f"mean {gaps.mean():.2e}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
