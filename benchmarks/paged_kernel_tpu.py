"""On a TPU: the rollout engine through JAX's Pallas TPU paged-attention kernel against the same
engine through XLA's loop over pages, on a model whose heads are 128 wide (the kernel's route,
hone.sampling.paged.paged_route; SmolLM2's 64-wide heads do not lower): random-init qwen3-0.6b
in bfloat16 (pools bfloat16 too).

1. Exactness: greedy rollouts of both routes (8 prompts of 32 random tokens, 32 new tokens):
   the share of equal tokens and the largest log-prob difference over the common prefix.
2. Speed: `hone bench rollout`'s rows (hone.bench.rollout.rollout_row: --prompts prompts x 8
   samples, one timed rollout after a compiling one) for the static sampler, the paged engine
   through the kernel and through XLA, on --workloads. 16 prompts, not the bench's 32: the
   static sampler's cache for 256 rows of 576 slots of this model (16.9 GB) is more than a
   v5e chip holds.

Prints one JSON line per measurement. TPU only (elsewhere the kernel's route is never taken).

    python benchmarks/paged_kernel_tpu.py [--workloads long-tail,uniform] [--model qwen3-0.6b]
        [--prompts 16] [--uniform-limit 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hone.bench.rollout import rollout_row  # noqa: E402
from hone.sampling import scheduler  # noqa: E402


@contextmanager
def xla_route():
    """The engine's decode step reads pages through XLA's loop, whatever the backend."""
    chosen = scheduler.paged_route
    scheduler.paged_route = lambda *args: None
    try:
        yield
    finally:
        scheduler.paged_route = chosen


def greedy(model, prompts, new_tokens: int):
    engine = scheduler.PagedEngine(model, max_seqs=len(prompts), max_len=64 + new_tokens)
    key = jax.random.key(0)
    out = engine.run([scheduler.Request(p, new_tokens, jax.random.fold_in(key, i))
                      for i, p in enumerate(prompts)], temperature=0.0)
    return engine.attention, [row[0] for row in out]


def exactness(model_name: str, new_tokens: int = 32) -> dict:
    from hone.weights.loading import load_model
    model = load_model(model_name, "bfloat16")
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, model.config.vocab_size, size=(8, 32)).tolist()
    route, kernel = greedy(model, prompts, new_tokens)
    with xla_route():
        other, xla = greedy(model, prompts, new_tokens)
    same, diff = 0, 0.0
    for a, b in zip(kernel, xla):
        n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                 min(len(a.tokens), len(b.tokens)))
        same += n
        if n:
            diff = max(diff, float(np.max(np.abs(np.subtract(a.logprobs[:n], b.logprobs[:n])))))
    total = sum(len(a.tokens) for a in kernel)
    return {"check": "greedy", "model": model_name, "routes": [route, other],
            "head_dim": model.config.head_dim, "equal_prefix_share": same / total,
            "max_logprob_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--workloads", default="long-tail,uniform")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--uniform-limit", type=int, default=128,
                    help="new tokens of every uniform sample (hone bench rollout's --seq)")
    ap.add_argument("--skip-exactness", action="store_true")
    args = ap.parse_args()
    if jax.default_backend() != "tpu":
        raise SystemExit(f"paged_kernel_tpu: needs a TPU (this backend: {jax.default_backend()})")
    if not args.skip_exactness:
        print(json.dumps(exactness(args.model)), flush=True)
    for workload in args.workloads.split(","):
        limit = args.uniform_limit if workload == "uniform" else 512
        for engine, label in (("static", "static"), ("paged", "paged-kernel"),
                              ("paged", "paged-xla")):
            start = time.perf_counter()
            if label == "paged-xla":
                with xla_route():
                    row = rollout_row(args.model, workload, engine, prompts=args.prompts,
                                      limit=limit, precision="bf16")
            else:
                row = rollout_row(args.model, workload, engine, prompts=args.prompts,
                                  limit=limit, precision="bf16")
            print(json.dumps({"workload": workload, "engine": label, "prompts": args.prompts,
                              "limit": limit,
                              "first_s": round(row.first_s, 2), "s": round(row.median_s, 2),
                              "tokens_per_s": round(row.tokens / row.median_s, 1),
                              "kv_bytes": row.extra["kv_bytes"],
                              "wall_s": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
