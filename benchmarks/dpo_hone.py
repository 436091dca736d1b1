"""DPO step with hone's own DPO machinery (what `hone dpo` runs), SmolLM2-135M shape.

Settings: model `smollm2-135m` preset (30 layers, width 576, FFN 1536, 9 heads / 3 KV heads, head
dim 64, vocab 49152, tied embeddings), random init, fp32, every parameter trained; reference =
frozen copy of the initial weights (`dpo.reference: copy`); sigmoid DPO, beta 0.1; AdamW (lr 1e-4
constant, betas 0.9/0.999, eps 1e-8, weight decay 0.01) after global-norm clipping at 1.0.
Batch: --pairs (4) pairs; each sequence is a --prompt-len (64) token prompt shared by the pair
plus a --completion-len (64) token completion (chosen and rejected differ), random ids, no
padding; the loss scores the completion tokens only.

The step is wired exactly as hone/recipes/dpo.py's `run_dpo` does: `build_model(cfg)`,
`compile_steps(cfg, model, nnx.Param, make_dpo_loss(cfg, "copy"), pair_count)` (one jitted,
state-donating function: policy forward on the 2B rows, reference forward on the frozen copy,
DPO loss, gradients, clipping, AdamW) and `aux = jax.tree.map(jnp.copy, state["params"])`
passed as the step's aux. The batch is built with hone's own pair layout (`Pair`, `pair_rows`,
`pair_batch`: [2B, L], rows 0..B-1 chosen, B..2B-1 rejected). Timed per step (wall clock):
`state, metrics = step(state, frozen, batch, aux); jax.block_until_ready(metrics)`; the first
step (trace + compile + run) is first_s, median_s the median of the next --repeats steps.
Prints one JSON line (fields as train_*.py: tokens_per_s counts the 2B x L tokens of the policy
forward; first_loss is log 2 = 0.6931 since policy == reference at step 0).

    .venv/bin/python benchmarks/dpo_hone.py --repeats 5
"""

from __future__ import annotations

from _measure import emit_pairs, finite, first_and_median, pair_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import DPOConfig
from hone.config.schema import DPOSection, ModelSection, TrainSection
from hone.data.preference import Pair, pair_batch, pair_rows
from hone.recipes.common import compile_steps
from hone.recipes.dpo import make_dpo_loss, pair_count
from hone.recipes.sft import build_model

PAD_ID = 2  # SmolLM2's; the batch has no padding


def make_batch(rng: np.random.Generator, args, vocab: int) -> dict:
    """B random pairs in hone's layout: [2B, P + C] rows, loss on the C completion tokens."""
    draw = lambda n: rng.integers(3, vocab, size=n).astype(np.int32)  # noqa: E731
    pairs = [Pair(draw(args.prompt_len), draw(args.completion_len), draw(args.completion_len))
             for _ in range(args.pairs)]
    stored = pair_rows(pairs, args.prompt_len + args.completion_len, PAD_ID)
    batch = pair_batch(stored)
    assert batch["tokens"].shape == (2 * args.pairs, args.prompt_len + args.completion_len)
    assert batch["loss_mask"].sum() == 2 * args.pairs * args.completion_len
    return {k: jnp.asarray(v) for k, v in batch.items()}


def main():
    args = pair_args(__doc__.splitlines()[0])
    cfg = DPOConfig(
        model=ModelSection(source="smollm2-135m", dtype="float32"),
        train=TrainSection(batch_size=args.pairs, grad_accum=1, lr=1e-4, schedule="constant",
                           weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0,
                           seed=args.seed, precision="fp32"),
        dpo=DPOSection(loss_type="sigmoid", beta=0.1, reference="copy"))
    model, trainable = build_model(cfg, log=lambda *_: None)
    assert trainable is nnx.Param
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    _, _, frozen, state, step, _ = compile_steps(cfg, model, trainable,
                                                 make_dpo_loss(cfg, "copy"), pair_count)
    aux = jax.tree.map(jnp.copy, state["params"])  # the frozen reference, as run_dpo makes it
    batch = make_batch(np.random.default_rng(args.seed), args, model.config.vocab_size)
    del model

    def one():
        nonlocal state
        state, metrics = step(state, frozen, batch, aux)
        return metrics

    first, med, loss0 = first_and_median(one, args.repeats, wait=jax.block_until_ready,
                                         value=lambda metrics: finite(metrics["loss"]))
    emit_pairs("hone", args, first, med, loss0)


if __name__ == "__main__":
    main()
