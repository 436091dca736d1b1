"""Training steps with Tunix's PeftTrainer (run with the Tunix venv, see _venvs.py).

Model: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape, random init, fp32 (Tunix's
Llama3 initialises MLP kernels to zero; a dense matmul costs the same either way). Rows:
- sft: full fine-tuning (PeftTrainer's optimizer over every nnx.Param).
- lora: qwix `apply_lora_to_model(model, LoraProvider(module_path=..., rank=16, alpha=32),
  **model.get_model_input(), rngs=...)` on attn q/k/v/o_proj and mlp gate/up/down_proj, the way
  tunix/cli/utils/model.py applies it; PeftTrainer then trains only nnx.LoRAParam.
Trainer: `tunix.sft.peft_trainer.PeftTrainer(model, optax.chain(clip_by_global_norm(1.0),
adamw(...)), TrainingConfig(...))` with the gen_model_input_fn of tunix/cli/peft_main.py
(positions and causal mask from the pad mask) and Tunix's default loss (next-token NLL, which
scores T-1 targets per row of T tokens).

What is timed: the trainer's own jitted step, obtained the way `PeftTrainer.train()` obtains it
(`jit_train_and_eval_step(cache_nnx_graph=True)`: nnx.jit of `_train_step` with the optimizer
donated, model and optimizer bound by nnx.cached_partial), called on the batch after the
trainer's `_prepare_inputs` and `shard_input`: `loss, aux, grad_norm = train_step(example);
jax.block_until_ready((loss, grad_norm))` (wall clock). This is the body of train()'s loop
without its Python bookkeeping (metrics buffering, progress bar, no-op checkpointing) and without
its overlap of one step's dispatch with the previous step's work (max_inflight_computations=2),
which a per-step wall-clock time cannot show. First step (trace + compile + run) is first_s;
median_s is the median of the next --repeats steps. Batch: B rows of T random ids, all real
tokens, the same batch every step. Prints one JSON line per row.

    benchmarks/.venvs/tunix/bin/python benchmarks/train_tunix.py --repeats 5
"""

from __future__ import annotations

from _measure import emit_train, train_args

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx
from tunix.sft import peft_trainer
from tunix.sft import sharding_utils
from tunix.sft import utils as sft_utils

from _tunix_model import adamw, new_model, time_train_step

LORA_MODULES = r".*/(attn/(q|k|v|o)_proj|mlp/(gate|up|down)_proj)"


def gen_model_input_fn(x: peft_trainer.TrainingInput) -> dict:
    """As in tunix/cli/peft_main.py (token id 0 is padding; the batch has none)."""
    pad_mask = x.input_tokens != 0
    return {"input_tokens": x.input_tokens, "input_mask": x.input_mask,
            "positions": sft_utils.build_positions_from_mask(pad_mask),
            "attention_mask": sft_utils.make_causal_attn_mask(pad_mask)}


def run_row(row: str, args) -> None:
    model = new_model(args.seed)
    cfg = model.config
    if row == "lora":
        provider = qwix.LoraProvider(module_path=LORA_MODULES, rank=16, alpha=32.0)
        model = qwix.apply_lora_to_model(model, provider, **model.get_model_input(),
                                         rngs=nnx.Rngs(args.seed))
        n = len(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
        assert n == 2 * 7 * cfg.num_layers, f"{n} LoRA arrays"
    config = peft_trainer.TrainingConfig(eval_every_n_steps=10**9,
                                         max_steps=args.repeats + 1)
    trainer = peft_trainer.PeftTrainer(model, adamw(), config)
    trainer = trainer.with_gen_model_input_fn(gen_model_input_fn)
    assert trainer._lora_enabled == (row == "lora")
    train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)

    rng = np.random.default_rng(args.seed)
    ids = rng.integers(1, cfg.vocab_size, size=(args.batch, args.seq_len)).astype(np.int32)
    example = peft_trainer.TrainingInput(input_tokens=jnp.asarray(ids),
                                         input_mask=jnp.ones(ids.shape, jnp.bool_))
    example = trainer._prepare_inputs(example)
    example = sharding_utils.shard_input(example, config.data_sharding_axis)

    first, med, loss0 = time_train_step(lambda: train_step(example), args.repeats)
    emit_train("tunix", row, args.batch * args.seq_len, first, med, loss0)


def main():
    args = train_args(__doc__.splitlines()[0])
    if args.remat != "none":  # never time Tunix without the checkpointing it was asked for
        raise SystemExit("train_tunix.py: --remat is not wired to Tunix's Llama3 here")
    for row in args.rows:
        run_row(row, args)


if __name__ == "__main__":
    main()
