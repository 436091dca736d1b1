"""Training steps with hone's own train step (the one `hone sft` builds), SmolLM2-135M shape.

Model: `hone.load_model("smollm2-135m")`: random init, fp32. Rows:
- sft: full fine-tuning, every `nnx.Param` trainable.
- lora: `apply_lora(rank 16, alpha 32)` on attn q/k/v/o and mlp gate/up/down, base frozen,
  trainable filter `LoRAParam`.
The step is exactly what hone/recipes/sft.py wires: `split_model`, `build_optimizer` (AdamW,
constant lr, global-norm clipping at 1.0), `new_train_state(flatten(params))` and
`make_train_step(..., sft_step_loss, target_tokens, accum=1, precision=...)`: one jitted,
state-donating function doing forward, masked next-token loss, gradients, clipping and the AdamW
update.

Batch: B rows of T random token ids (all real tokens, one document per row) with their random
next tokens as targets, loss on all B*T tokens; the same batch every step. Timed per step:
`state, metrics = step(state, frozen, batch); jax.block_until_ready(metrics)` (wall clock).
The first step (trace + compile + run) is reported alone as first_s; median_s is the median of
the next --repeats steps. peak_rss_mb is the process's peak resident set so far (run one row per
process for a per-row figure, as train.py does). Prints one JSON line per row.

    .venv/bin/python benchmarks/train_hone.py --repeats 5
    .venv/bin/python benchmarks/train_hone.py --rows sft --precision bf16
"""

from __future__ import annotations

from types import SimpleNamespace

from _measure import emit_train, finite, first_and_median, train_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import hone
from hone.models.lora import LoRAParam, apply_lora
from hone.recipes.sft import sft_step_loss, target_tokens
from hone.train.optimizer import build_optimizer
from hone.train.state import flatten, new_train_state, split_model
from hone.train.step import make_train_step

LORA_TARGETS = r".*/(attn/(q|k|v|o)|mlp/(gate|up|down))"
# The same AdamW settings in all three implementations.
OPTIM = SimpleNamespace(lr=1e-4, schedule="constant", warmup_steps=0, max_steps=1000,
                        min_lr_ratio=0.0, max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8,
                        weight_decay=0.01)


def make_batch(rng: np.random.Generator, b: int, t: int, vocab: int) -> dict:
    ids = rng.integers(3, vocab, size=(b, t + 1))
    ones = np.ones((b, t), np.int32)
    batch = {
        "tokens": ids[:, :-1].astype(np.int32),
        "targets": ids[:, 1:].astype(np.int32),
        "loss_mask": np.ones((b, t), np.float32),
        "attention_mask": ones,
        "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        "segment_ids": ones,
    }
    return {k: jnp.asarray(v) for k, v in batch.items()}


def run_row(row: str, args) -> None:
    model = hone.load_model("smollm2-135m", seed=args.seed)
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    trainable = nnx.Param
    if row == "lora":
        apply_lora(model, rank=16, alpha=32.0, targets=LORA_TARGETS, rngs=nnx.Rngs(args.seed))
        trainable = LoRAParam
    graphdef, params, frozen = split_model(model, trainable)
    flat = flatten(params)
    if row == "lora":
        assert all("lora_" in k for k in flat) and len(flat) == 2 * 7 * model.config.num_layers
    optimizer, schedule = build_optimizer(OPTIM)
    state = new_train_state(flat, optimizer, args.seed)
    step = make_train_step(graphdef, params, sft_step_loss, target_tokens, optimizer, schedule,
                           accum=1, precision=args.precision)
    batch = make_batch(np.random.default_rng(args.seed), args.batch, args.seq_len,
                       model.config.vocab_size)
    del model, params, flat

    def one():
        nonlocal state
        state, metrics = step(state, frozen, batch)
        return metrics

    first, med, loss0 = first_and_median(one, args.repeats, wait=jax.block_until_ready,
                                         value=lambda metrics: finite(metrics["loss"]))
    name = row if args.precision == "fp32" else f"{row}-{args.precision}"
    emit_train("hone", name, args.batch * args.seq_len, first, med, loss0)


def main():
    args = train_args(__doc__.splitlines()[0], precision=True)
    for row in args.rows:
        run_row(row, args)


if __name__ == "__main__":
    main()
