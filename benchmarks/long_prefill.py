"""Blockwise and chunked prefill against the dense one on a real model (SmolLM2-135M-Instruct,
float32): one prompt of --prompt-tokens tokens (English prose from docs/guides), greedy
--new-tokens tokens after a dense prefill (`model.attention=dense`), a blockwise one (`auto`:
the prompt is longer than one block) and one in chunks of --chunk positions. Prints whether the
tokens are the same and the largest log-prob difference. Times include compilation.

    .venv/bin/python benchmarks/long_prefill.py [--prompt-tokens 1000] [--chunk 256]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import hone

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--chunk", type=int, default=256)
    args = ap.parse_args()
    source = "smollm2-135m-instruct"
    model = hone.load_model(source, dtype="float32")
    tok = hone.load_tokenizer(source)
    text = "\n".join(p.read_text() for p in sorted((ROOT / "docs/guides").glob("[a-z]*.md")))
    ids = tok.encode(text)[:args.prompt_tokens]
    runs = {}
    for name, attention, chunk in (("dense", "dense", None), ("blockwise", "auto", None),
                                   (f"chunks of {args.chunk}", "auto", args.chunk)):
        model.attention = attention
        t0 = time.time()
        runs[name] = hone.generate(model, tok, [ids], max_new_tokens=args.new_tokens,
                                   eos_ids=(), prefill_chunk=chunk)[0]
        print(f"{name}: {time.time() - t0:.1f} s")
    ref = runs.pop("dense")
    for name, out in runs.items():
        gap = np.abs(np.array(out.logprobs) - np.array(ref.logprobs)).max()
        print(f"{name} vs dense ({len(ids)}-token prompt, {args.new_tokens} greedy tokens): "
              f"same tokens {out.tokens == ref.tokens}, max |dlogp| {gap:.1e}")


if __name__ == "__main__":
    main()
