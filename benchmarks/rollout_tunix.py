"""A rollout workload of `hone bench rollout` with Tunix's vanilla sampler (run with the Tunix venv,
see _venvs.py): the row Tunix gets beside hone's static and paged engines in benchmarks/rollouts.py.

Model: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape, random init, fp32.
Sampler: tunix.generate.sampler.Sampler, as Tunix's RL rollouts call it (RolloutConfig's
defaults: temperature 1.0 with top_p 1.0, its sampling mode; the prompts padded to
--prompt-len), every prompt written --generations times (Tunix samples a group as that many rows),
one batch of prompts x generations rows decoding in lockstep over a KV cache of prompt + --limit
slots. EOS is an id no token can have, so every row decodes --limit tokens: like hone's static
sampler, Tunix cannot end a row at its drawn length, and the driver counts the same drawn lengths
(hone/bench/rollout.py) for every engine. Prints one JSON line.

    benchmarks/.venvs/tunix/bin/python benchmarks/rollout_tunix.py --workload long-tail
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np
from tunix.generate import sampler as sampler_lib

from _measure import first_and_median, peak_rss_mb
from _tunix_model import NO_EOS, IdTokenizer, new_model

LIMITS = {"long-tail": 512, "uniform": 128}  # hone bench rollout's --seq per workload


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="long-tail", choices=tuple(LIMITS))
    for name, default in (("prompts", 32), ("generations", 8), ("prompt-len", 64),
                          ("limit", 0), ("repeats", 1), ("seed", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    args = ap.parse_args()
    limit = args.limit or LIMITS[args.workload]
    model = new_model(args.seed, sampling=True)
    cfg = model.config
    rows = args.prompts * args.generations
    cache = sampler_lib.CacheConfig(cache_size=args.prompt_len + limit,
                                    num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                                    head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(transformer=model, tokenizer=IdTokenizer(), cache_config=cache)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(3, cfg.vocab_size, size=(args.prompts, args.prompt_len))
    prompts = [" ".join(str(t) for t in row) for row in ids for _ in range(args.generations)]

    def run():
        return sampler(prompts, max_generation_steps=limit, max_prompt_length=args.prompt_len,
                       temperature=1.0, top_p=1.0, eos_tokens=[NO_EOS], echo=False,
                       seed=args.seed)

    def check(out):
        lengths = {len(t) for t in out.tokens}
        assert lengths == {limit}, f"generated lengths {lengths}"

    first, median, _ = first_and_median(run, args.repeats, value=check)
    kv = 2 * cfg.num_layers * rows * (args.prompt_len + limit) * cfg.num_kv_heads \
        * cfg.head_dim * 4
    print(json.dumps({"impl": "tunix", "workload": args.workload, "rows": rows, "limit": limit,
                      "first_s": first, "median_s": median, "kv_bytes": kv,
                      "peak_rss_mb": peak_rss_mb(), "devices": str(jax.devices())}), flush=True)


if __name__ == "__main__":
    main()
