"""The rollout engine's decode step through each attention route, on the engine itself: what one
decode step of R running sequences costs, and what its programs take to compile.

R sequences, each a prompt of --prompt tokens (random ids, SmolLM2-135M's shape, random init),
all admitted at once (max_seqs = R, pages for every row's whole --max-len): the engine's
warm-up compiles its programs (`warmup_s`), a run of --short new tokens takes the rest
(`compile_s`, its wall time); then a run of --short
and one of --short + --extra new tokens, whose difference is --extra decode steps of R rows
(prefill and the first window cancel): `ms_per_step`. Routes (PagedEngine's `attention`):
default (attend_step's loop of float32 sums), loop and dense (XLA's products over the pages,
hone/kernels/paged_xla.py), ragged (hone's Pallas TPU kernel, TPU only).

Prints one JSON line per (rows, route).

    python benchmarks/paged_decode_routes.py [--rows 64,256] [--routes default,loop,dense]
        [--precision bf16] [--prompt 320] [--max-len 576]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hone.sampling.scheduler import PagedEngine, Request  # noqa: E402
from hone.weights.loading import load_model  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", default="64,256")
    p.add_argument("--routes", default="default,loop,dense")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--prompt", type=int, default=320)
    p.add_argument("--max-len", type=int, default=576)
    p.add_argument("--short", type=int, default=33)
    p.add_argument("--extra", type=int, default=128)
    p.add_argument("--window", type=int, default=32)
    args = p.parse_args(argv)
    net = load_model(args.model, "bfloat16" if args.precision == "bf16" else "float32")
    rng = np.random.default_rng(0)
    for rows in (int(r) for r in args.rows.split(",")):
        prompts = [rng.integers(3, net.config.vocab_size, args.prompt).tolist()
                   for _ in range(rows)]
        key = jax.random.key(0)
        for route in args.routes.split(","):
            eng = PagedEngine(net, max_seqs=rows, max_len=args.max_len, sync_steps=args.window,
                              attention=None if route == "default" else route)
            if route == "default":
                eng.attention = None

            def once(limit):
                reqs = [Request(pr, limit, jax.random.fold_in(key, i))
                        for i, pr in enumerate(prompts)]
                start = time.perf_counter()
                eng.run(reqs, temperature=1.0)
                return time.perf_counter() - start

            row = {"rows": rows, "route": route, "backend": jax.default_backend(),
                   "precision": args.precision, "prompt": args.prompt, "window": args.window}
            try:
                start = time.perf_counter()
                eng.warmup(temperature=1.0)
                row["warmup_s"] = round(time.perf_counter() - start, 2)
                row["compile_s"] = round(once(args.short), 2)
                short = min(once(args.short) for _ in range(2))
                long = once(args.short + args.extra)
                row.update(short_s=round(short, 4), long_s=round(long, 4),
                           ms_per_step=round(1000 * (long - short) / args.extra, 3),
                           row_steps_per_s=round(rows * args.extra / (long - short), 1))
            except Exception as e:  # noqa: BLE001 - a route that fails is a row too
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            del eng


if __name__ == "__main__":
    main()
