"""The rollout engine's compiled programs' temporary memory (XLA's `memory_analysis()`), at a
decode batch of many sequences and two pool sizes: attention reads pages in place (a page of
every row a step), so the temporaries must not grow with the pool or with the page tables'
width, only with the rows.

For each pool (num_pages, and max_len: the tables' width) the decode window (`decode_window`,
--rows sequences, XLA's loop over pages; on a CPU hone's CPU kernel is bypassed so the XLA
route is what is measured) and the largest prefill call (`prefill_chunk`, the engine's blocks a
call) are lowered and compiled, not run, and their argument, output, alias and temporary
bytes printed as one JSON line each. Model: a random-init shape (default SmolLM2-135M's).

    .venv/bin/python benchmarks/paged_memory.py [--model smollm2-135m] [--rows 256]
        [--pools 2304,9216] [--max-len 576,2304] [--dtype bfloat16]
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

from hone.sampling.engine import split_for_sampling  # noqa: E402
from hone.sampling.paged import (PLACE_FIELDS, decode_window, init_pools,  # noqa: E402
                                 prefill_chunk)
from hone.sampling.scheduler import PagedEngine  # noqa: E402
from hone.sampling.strategies import SamplingMode  # noqa: E402
from hone.weights.loading import load_model  # noqa: E402


def analysis(compiled) -> dict:
    m = compiled.memory_analysis()
    return {"argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
            "alias_bytes": m.alias_size_in_bytes, "temp_bytes": m.temp_size_in_bytes}


def measure(model, rows: int, num_pages: int, max_len: int) -> list[dict]:
    eng = PagedEngine(model, max_seqs=rows, num_pages=num_pages, max_len=max_len)
    eng.graphdef, eng.params = split_for_sampling(model)
    eng.mode = SamplingMode(greedy=False, top_k=None, use_top_p=False)
    eng.temperature, eng.top_p, eng.eos = np.float32(1), np.float32(1), np.full(8, -1, np.int32)
    # Shapes only: the pools are never allocated (lowering takes their shapes).
    eng.pools = jax.eval_shape(lambda: init_pools(model, num_pages, eng.page_size,
                                                  eng.cache_dtype))
    eng.places = {name: jax.ShapeDtypeStruct((rows + 1,), dtype)
                  for name, dtype in PLACE_FIELDS.items()}
    key = np.asarray(jax.random.key_data(jax.random.key(0)))
    table = np.zeros((rows, eng.table_width), np.int32)
    st = {"place": np.zeros(rows, np.int32), "fresh": np.ones(rows, bool),
          "host_last": np.zeros(rows, bool), "last": np.zeros(rows, np.int32),
          "length": np.zeros(rows, np.int32), "index": np.zeros(rows, np.int32),
          "limit": np.zeros(rows, np.int32), "key_data": np.stack([key] * rows)}
    out = []
    t0 = time.perf_counter()
    compiled = decode_window.lower(
        eng.graphdef, eng.params, None, eng.pools, eng.places, table, st, eng.eos,
        eng.temperature, eng.top_p, mode=eng.mode, page_size=eng.page_size,
        steps=eng.sync_steps).compile()
    out.append({"program": "decode_window", "rows": rows, **analysis(compiled),
                "compile_s": round(time.perf_counter() - t0, 1)})
    blocks, width = eng.prefill_blocks, eng.prefill_block
    t0 = time.perf_counter()
    compiled = prefill_chunk.lower(
        eng.graphdef, eng.params, eng.pools, np.zeros((blocks, eng.table_width), np.int32),
        np.zeros(blocks, np.int32), np.zeros((blocks, width), np.int32),
        np.zeros(blocks, np.int32), np.zeros(blocks, np.int32),
        page_size=eng.page_size).compile()
    out.append({"program": "prefill_chunk", "blocks": blocks, "block": width,
                **analysis(compiled), "compile_s": round(time.perf_counter() - t0, 1)})
    for row in out:
        row.update(num_pages=num_pages, max_len=max_len, kv_bytes=eng.kv_bytes,
                   backend=jax.default_backend())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--pools", default="2304,9216", help="num_pages of each pool measured")
    ap.add_argument("--max-len", default="576,2304", help="max_len (tables' width) of each")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    model = load_model(args.model, args.dtype)
    for pages, max_len in zip(args.pools.split(","), args.max_len.split(",")):
        for row in measure(model, args.rows, int(pages), int(max_len)):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
