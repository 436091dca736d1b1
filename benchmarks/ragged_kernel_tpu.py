"""On a TPU: hone's ragged paged-attention Pallas kernel (hone/kernels/ragged_paged.py) compiled
for the chip, against its dense reference and against XLA's loop over pages
(hone/kernels/paged_xla.py) on the rollout engine's shapes.

1. Exactness: the compiled kernel against `ragged_reference` (matmuls at "highest" precision)
   for head_dim 64 and 128, float32 and bfloat16 pools, decode rows (T=1) and prefill blocks
   (T=32), with a sliding window and a soft-cap on one case: the largest difference relative to
   the reference's largest output.
2. Speed: one attention call (jitted, the mean of --repeats after a compiling one) of R rows
   over pages of 64 slots holding rows of random lengths up to --max-len: the kernel against
   XLA's loop, decode (R = --rows, T = 1) and prefill (R = 32 blocks of T = 32). SmolLM2-135M's
   heads (9 query heads, 3 kv heads, head_dim 64) and qwen3-0.6b's (16, 8, 128), bfloat16 pools.

Prints one JSON line per measurement.

    python benchmarks/ragged_kernel_tpu.py [--rows 256] [--max-len 576] [--repeats 20]
        [--impl tpu] [--skip-exactness]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hone.kernels.paged_xla import ragged_attention  # noqa: E402
from hone.kernels.ragged_paged import ragged_paged_attention, ragged_reference  # noqa: E402

HEADS = {"smollm2": (9, 3, 64), "qwen3": (16, 8, 128)}
IMPL = ["tpu"]  # --impl: "tpu-interpret" checks this script on a CPU


def case(rng, rows, t, n_heads, kv, h, page, width, dtype, lengths):
    pool = rows * width + 1
    table = rng.permutation(pool)[:rows * width].reshape(rows, width).astype(np.int32)
    k = jnp.asarray(rng.standard_normal((kv, pool, page, h)), dtype)
    v = jnp.asarray(rng.standard_normal((kv, pool, page, h)), dtype)
    q = jnp.asarray(rng.standard_normal((rows, t, n_heads, h)), jnp.float32)
    q_pos = np.asarray(lengths)[:, None] - t + np.arange(t)[None]
    return q, k, v, jnp.asarray(table), jnp.asarray(q_pos, jnp.int32), jnp.asarray(lengths,
                                                                                    jnp.int32)


def exactness(out: list) -> None:
    rng = np.random.default_rng(0)
    for h in (64, 128):
        for dtype in (jnp.float32, jnp.bfloat16):
            for t, window, softcap in ((1, None, None), (32, None, None), (32, 40, 30.0)):
                lengths = rng.integers(t, 8 * 64, 6)
                q, k, v, table, q_pos, kv_len = case(rng, 6, t, 4, 2, h, 64, 8, dtype, lengths)
                kw = dict(scale=h ** -0.5, softcap=softcap, window=window)
                row = {"check": "exactness", "head_dim": h, "dtype": jnp.dtype(dtype).name,
                       "T": t, "window": window, "softcap": softcap}
                try:
                    got = np.asarray(ragged_paged_attention(q, k, v, table, q_pos, kv_len,
                                                            impl=IMPL[0], **kw))
                    with jax.default_matmul_precision("highest"):
                        want = np.asarray(ragged_reference(q, k, v, table, q_pos, kv_len, **kw))
                    row["rel_err"] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                except Exception as e:  # noqa: BLE001  (a lowering failure is the finding)
                    row["error"] = f"{type(e).__name__}: {e}"[:800]
                print(json.dumps(row), flush=True)
                out.append(row)


def timed(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        got = fn(*args)
    jax.block_until_ready(got)
    return (time.perf_counter() - start) / repeats


def speed(out: list, rows: int, max_len: int, repeats: int) -> None:
    rng = np.random.default_rng(1)
    page = 64
    width = -(-max_len // page)
    for model, (n_heads, kv, h) in HEADS.items():
        for label, r, t in (("decode", rows, 1), ("prefill", 32, 32)):
            lengths = rng.integers(t, max_len, r)
            args = case(rng, r, t, n_heads, kv, h, page, width, jnp.bfloat16, lengths)
            scale = h ** -0.5
            kernel = jax.jit(lambda q, k, v, tb, qp, kl: ragged_paged_attention(
                q, k, v, tb, qp, kl, scale=scale, impl=IMPL[0]))
            xla = jax.jit(lambda q, k, v, tb, qp, kl: ragged_attention(
                q.astype(jnp.bfloat16), k, v, tb, qp, scale=scale))
            row = {"check": "speed", "model": model, "kind": label, "rows": r, "T": t,
                   "max_len": max_len}
            for name, fn in (("kernel", kernel), ("xla", xla)):
                try:
                    row[f"{name}_ms"] = round(timed(fn, args, repeats) * 1e3, 4)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:800]
            print(json.dumps(row), flush=True)
            out.append(row)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=576)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--impl", default="tpu", choices=("tpu", "tpu-interpret"))
    ap.add_argument("--skip-exactness", action="store_true")
    args = ap.parse_args(argv)
    IMPL[0] = args.impl
    out: list = []
    if not args.skip_exactness:
        exactness(out)
    speed(out, args.rows, args.max_len, args.repeats)


if __name__ == "__main__":
    main()
