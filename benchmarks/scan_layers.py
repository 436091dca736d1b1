"""Compile time and step time of the SFT step with the blocks as a Python loop and as a scan
(train.scan_layers), at 16, 28, 32 and 48 layers.

Model: a Llama-shaped stack of small width (hidden 256, MLP 768, 4 heads / 2 KV heads,
vocabulary 4096, untied), random init, float32; batch 2 x 256 tokens; AdamW; the step `hone sft`
runs. Compile time is the time of `lower(...).compile()` of the jitted step (tracing included,
no compilation cache); step time the median of --repeats steps after one warm-up. Both as
wall-clock seconds and as CPU seconds (process time over all threads: the steadier figure on a
machine shared with other jobs; compiling runs on one thread). Each row runs in its own process. Prints one JSON line per row,
then a table for benchmarks/RESULTS.md.

    nice -n 5 .venv/bin/python benchmarks/scan_layers.py [--layers 16,28,32,48] [--remat none,full]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's hone, whatever the environment points at


def model_config(layers: int):
    from hone.models.config import PRESETS
    return PRESETS["tiny"].replace(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=layers,
        num_heads=4, num_kv_heads=2, head_dim=64, tie_embeddings=False,
        layer_types=("global",) * layers)


def measure(layers: int, mode: str, remat: str, args) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    from hone.bench.rows import sft_step, train_batch
    from hone.config.schema import ModelSection, TrainSection
    from hone.models.scan_layers import scan_setting
    from hone.models.transformer import Transformer

    cfg = model_config(layers)
    net = Transformer(cfg, rngs=nnx.Rngs(args.seed))
    net.attention = ModelSection().attention
    net.head_chunk = TrainSection().head_chunk
    net.remat = remat
    net.scan_layers = scan_setting(mode, remat)
    step, state, frozen = sft_step(net, args.seed)
    del net
    data = train_batch(np.random.default_rng(args.seed), args.batch, args.seq_len,
                       cfg.vocab_size)
    t0, c0 = time.perf_counter(), time.process_time()
    compiled = step.lower(state, frozen, data).compile()
    compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    state, metrics = compiled(state, frozen, data)  # warm-up
    jax.block_until_ready(metrics)
    walls, cpus = [], []
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        state, metrics = compiled(state, frozen, data)
        jax.block_until_ready(metrics)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"layers": layers, "mode": mode, "remat": remat, "compile_s": round(compile_s, 2),
            "compile_cpu_s": round(compile_cpu_s, 2),
            "step_s": round(float(np.median(walls)), 4),
            "step_cpu_s": round(float(np.median(cpus)), 4),
            "loss": round(float(metrics["loss"]), 4)}


def table(results: list[dict]) -> str:
    lines = ["| layers | remat | compile, loop (CPU s) | compile, scan (CPU s) | step, loop (CPU s) |"
             " step, scan (CPU s) | scan / loop step |", "|---|---|---|---|---|---|---|"]
    key = {(r["layers"], r["remat"], r["mode"]): r for r in results}
    for layers, remat in sorted({(r["layers"], r["remat"]) for r in results}):
        loop, scan = key.get((layers, remat, "loop")), key.get((layers, remat, "scan"))
        if not (loop and scan):
            continue
        lines.append(f"| {layers} | {remat} | {loop['compile_cpu_s']:.1f} | "
                     f"{scan['compile_cpu_s']:.1f} | "
                     f"{loop['step_cpu_s']:.3f} | {scan['step_cpu_s']:.3f} | "
                     f"{scan['step_cpu_s'] / loop['step_cpu_s']:.3f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="16,28,32,48")
    ap.add_argument("--remat", default="none,full")
    ap.add_argument("--modes", default="loop,scan")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # "layers,mode,remat": run it here
    args = ap.parse_args()
    if args.one:
        layers, mode, remat = args.one.split(",")
        print(json.dumps(measure(int(layers), mode, remat, args)), flush=True)
        return
    from _driver import run_row
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    results = [run_row(__file__, f"{layers},{mode},{remat}", env)
               for remat in args.remat.split(",") for layers in args.layers.split(",")
               for mode in args.modes.split(",")]
    print(table(results))


if __name__ == "__main__":
    main()
