"""A small mixture-of-experts model beside the dense model of equal active parameters: one SFT
step (seconds, peak memory) and greedy decode (tokens per second).

Models (random init, float32), SmolLM2-135M's attention (hidden 576, 9 heads / 3 KV heads,
vocabulary 49152, tied embeddings) with --layers blocks:
  dense        the SmolLM2-135M MLP, width 1536
  moe          8 experts of width 768, top-2 (the same active MLP parameters as dense), grouped
               compute as hone runs it on this backend (on CPU: the tile loop of grouped.py)
  moe-ragged   the same MoE through jax.lax.ragged_dot (what XLA:CPU runs as a masked product
               over every expert)
  moe-dense    the same MoE with every expert computed on every token (dense_experts)
Each row runs in its own process (so peak memory is the row's own), as the SFT step `hone sft`
runs (AdamW, the chunked LM head, router aux loss 0.001). A step is timed as wall-clock
seconds (median) and as CPU seconds (process time over all threads, mean): on a machine shared
with other jobs the second is the steadier one. Prints one JSON line per row, then a table for
benchmarks/RESULTS.md.

    nice -n 5 .venv/bin/python benchmarks/moe_step.py --layers 12 --batch 2 --seq-len 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's hone, whatever the environment points at
ROWS = ("dense", "moe", "moe-ragged", "moe-dense")


def model_config(row: str, layers: int):
    from hone.models.config import PRESETS, MoE
    base = PRESETS["smollm2-135m"]
    cfg = base.replace(num_layers=layers, layer_types=base.layer_types[:layers])
    if row == "dense":
        return cfg
    return cfg.replace(moe=MoE(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=768))


def build(row: str, layers: int, seed: int):
    from flax import nnx

    from hone.config.schema import ModelSection, TrainSection
    from hone.models.moe import RoutedMLP
    from hone.models.transformer import Transformer
    net = Transformer(model_config(row, layers), rngs=nnx.Rngs(seed))
    net.attention = ModelSection().attention
    net.head_chunk = TrainSection().head_chunk
    for _, m in nnx.iter_modules(net):
        if isinstance(m, RoutedMLP):
            m.grouped = row != "moe-dense"
            m.method = "ragged" if row == "moe-ragged" else None
    return net


def measure(row: str, args) -> dict:
    """One row, in this process: the SFT step's first and median seconds and peak RSS, then
    decode tokens/s at each batch size."""
    import numpy as np

    from hone.bench.rows import decode_row, sft_step, train_batch
    from hone.bench.timing import finite, first_and_median, peak_rss_mb

    import jax
    from flax import nnx
    net = build(row, args.layers, args.seed)
    cfg = net.config
    out = {"row": row, "layers": args.layers, "params": sum(
        int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(net, nnx.Param))),
        "matmul_params_active": cfg.matmul_params()}
    if row not in ("moe-dense", "moe-ragged"):  # decode first: the step donates the weights
        for b in args.decode_batches:
            got = decode_row(net, b, args.prompt_len, args.new_tokens, args.decode_repeats,
                             seed=args.seed)
            out[f"decode_b{b}_tok_s"] = round(b * args.new_tokens / got.median_s, 1)
    if not args.no_step:
        step, state, frozen = sft_step(net, args.seed)
        del net
        data = train_batch(np.random.default_rng(args.seed), args.batch, args.seq_len,
                           cfg.vocab_size)

        def one():
            nonlocal state
            state, metrics = step(state, frozen, data)
            return metrics

        first, _, loss = first_and_median(one, 0, wait=jax.block_until_ready,
                                          value=lambda m: finite(m["loss"]))
        cpu0 = time.process_time()
        _, med, _ = first_and_median(one, args.repeats, wait=jax.block_until_ready)
        cpu = (time.process_time() - cpu0) / (args.repeats + 1)
        out.update(step_first_s=round(first, 2), step_s=round(med, 3), step_cpu_s=round(cpu, 3),
                   step_peak_rss_mb=round(peak_rss_mb()), loss=round(loss, 3))
    return out


def table(results: list[dict]) -> str:
    dense = next((r for r in results if r["row"] == "dense"), None)
    lines = ["| model | parameters | SFT step (s) | CPU s / step | vs dense (CPU s) |"
             " peak RSS (MiB) | decode b1 (tok/s) | decode b8 (tok/s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['step_cpu_s'] / dense['step_cpu_s']:.2f}x" if dense else ""
        lines.append(f"| {r['row']} | {r['params'] / 1e6:.0f}M | {r['step_s']:.2f} | "
                     f"{r['step_cpu_s']:.2f} | {ratio} | "
                     f"{r['step_peak_rss_mb']} | {r.get('decode_b1_tok_s', '')} | "
                     f"{r.get('decode_b8_tok_s', '')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--decode-repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run this row here (the child process)
    args = ap.parse_args()
    args.decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    if args.one:
        print(json.dumps(measure(args.one, args)), flush=True)
        return
    from _driver import run_row
    results = [run_row(__file__, row) for row in args.rows.split(",")]
    print(table(results))


if __name__ == "__main__":
    main()
