"""Training steps with hone's own train step (the one `hone sft` builds), SmolLM2-135M shape.

A thin wrapper over `hone.bench.rows.train_row` (its docstring says exactly what is built and
timed; `hone bench sft` / `hone bench lora` run the same code): model `smollm2-135m`, random init,
fp32; rows sft (every parameter trained) and lora (rank 16, alpha 32 on q/k/v/o and
gate/up/down, base frozen). The first step (trace + compile + run) is first_s; median_s is the
median of the next --repeats steps. peak_rss_mb is the process's peak resident set so far (run
one row per process for a per-row figure, as train.py does). Prints one JSON line per row.

    .venv/bin/python benchmarks/train_hone.py --repeats 5
    .venv/bin/python benchmarks/train_hone.py --rows sft --precision bf16
    .venv/bin/python benchmarks/train_hone.py --rows sft --batch 1 --seq-len 2048 --remat full
"""

from __future__ import annotations

from _measure import emit_train, train_args

from hone.bench.rows import train_row


def main():
    args = train_args(__doc__.splitlines()[0], precision=True)
    for row in args.rows:
        got = train_row(row, "smollm2-135m", args.batch, args.seq_len, args.repeats,
                        args.precision, args.seed, remat=args.remat)
        name = row if args.precision == "fp32" else f"{row}-{args.precision}"
        emit_train("hone", name, got.tokens, got.first_s, got.median_s, got.first_loss)


if __name__ == "__main__":
    main()
