"""Greedy decode with hone (`hone.generate`, temperature 0, no EOS so every row runs to the end).

A thin wrapper over `hone.bench.rows.decode_row` (`hone bench decode` runs the same code):
model `hone.load_model("smollm2-135m")`, the SmolLM2-135M architecture, random init, fp32,
loaded once for every batch size. Prompts are random token-id lists, all of the same length.
Prints one JSON line per batch size.

    .venv/bin/python benchmarks/decode_hone.py --repeats 5
    .venv/bin/python benchmarks/decode_hone.py --precision bf16   # bfloat16 weights ("hone-bf16")
"""

from __future__ import annotations

from _measure import decode_args, emit_decode

import hone
from hone.bench.rows import decode_row


def main():
    args = decode_args(__doc__.splitlines()[0], precision=True)
    dtype = "bfloat16" if args.precision == "bf16" else "float32"
    model = hone.load_model("smollm2-135m", seed=args.seed, dtype=dtype)
    impl = "hone" if args.precision == "fp32" else f"hone-{args.precision}"
    for b in args.batches:
        got = decode_row(model, b, args.prompt_len, args.new_tokens, args.repeats,
                         args.precision, args.seed)
        emit_decode(impl, b, args.new_tokens, got.first_s, got.median_s)


if __name__ == "__main__":
    main()
