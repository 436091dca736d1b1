"""DPO step with hone's own DPO machinery (what `hone dpo` runs), SmolLM2-135M shape.

A thin wrapper over `hone.bench.rows.dpo_row` (its docstring says exactly what is built and
timed; `hone bench dpo` runs the same code): model `smollm2-135m` preset (30 layers, width 576,
FFN 1536, 9 heads / 3 KV heads, head dim 64, vocab 49152, tied embeddings), random init, fp32,
every parameter trained (--precision bf16: bf16 compute, fp32 weights, optimizer and loss; row
"dpo-bf16"); reference = frozen copy of the initial weights; sigmoid DPO, beta 0.1;
AdamW (lr 1e-4 constant, betas 0.9/0.999, eps 1e-8, weight decay 0.01) after global-norm clipping
at 1.0. Batch: --pairs (4) pairs; each sequence is a --prompt-len (64) token prompt shared by the
pair plus a --completion-len (64) token completion, random ids, no padding, in `hone dpo`'s
default layout: one row [prompt | chosen | rejected] per pair, the prompt computed once
(`hone.data.shared_prefix`); the loss scores the completion tokens only. One jitted, state-donating step does the policy forward, the reference
forward, the loss, gradients, clipping and AdamW; the first step (trace + compile + run) is
first_s, median_s the median of the next --repeats steps. Prints one JSON line (fields as
train_*.py: tokens_per_s counts the 2B x L tokens of the policy forward; first_loss is
log 2 = 0.6931 since policy == reference at step 0).

    .venv/bin/python benchmarks/dpo_hone.py --repeats 5
    .venv/bin/python benchmarks/dpo_hone.py --precision bf16
"""

from __future__ import annotations

from _measure import emit_pairs, pair_args

from hone.bench.rows import dpo_row


def main():
    args = pair_args(__doc__.splitlines()[0], precision=True)
    got = dpo_row("smollm2-135m", args.pairs, args.prompt_len, args.completion_len,
                  args.repeats, args.precision, args.seed)
    emit_pairs("hone", args, got.first_s, got.median_s, got.first_loss,
               "dpo" if args.precision == "fp32" else "dpo-bf16")


if __name__ == "__main__":
    main()
