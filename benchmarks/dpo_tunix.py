"""DPO step with Tunix's DPOTrainer (run with the Tunix venv, see _venvs.py).

Settings: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape (as train_tunix.py), random
init, fp32, every parameter trained; reference = a second Llama3 holding a copy of the initial
weights (never updated); `tunix.sft.dpo.dpo_trainer.DPOTrainer(policy, reference,
optax.chain(clip_by_global_norm(1.0), adamw(1e-4, b1 0.9, b2 0.999, eps 1e-8, weight decay
0.01)), DPOTrainingConfig(algorithm="dpo", beta=0.1, label_smoothing=0))`: sigmoid DPO.
Batch: Tunix's tokenized `TrainingInput` of --pairs (4) pairs: prompt_ids [B, --prompt-len (64)]
(shared by the pair), chosen_ids / rejected_ids [B, --completion-len (64)], all masks 1 (random
ids, no padding); the loss scores the completion tokens only.

What is timed: one full trainer step as `PeftTrainer.train()`'s loop runs it, without its
Python bookkeeping (metrics buffering, progress bar, no-op checkpointing):
`example = trainer._prepare_inputs(training_input)` (concatenates chosen and rejected, builds
positions and the causal mask, and runs the reference forward: Tunix computes the reference
log-probs here, in a separate nnx.jit call outside the train step), then
`sharding_utils.shard_input`, then the jitted train step obtained as `train()` obtains it
(`jit_train_and_eval_step(cache_nnx_graph=True)`): `loss, aux, grad_norm =
train_step(example); jax.block_until_ready((loss, grad_norm))` (wall clock). First step (trace +
compile + run) is first_s; median_s is the median of the next --repeats steps. Prints one JSON
line (fields as train_*.py; tokens_per_s counts the 2B x L policy tokens; first_loss = log 2).

    benchmarks/.venvs/tunix/bin/python benchmarks/dpo_tunix.py --repeats 5
"""

from __future__ import annotations

from _measure import emit_pairs, pair_args

import jax.numpy as jnp
import numpy as np
from tunix.sft import sharding_utils
from tunix.sft.dpo import dpo_trainer

from _tunix_model import adamw, new_model, reference_copy, time_train_step


def main():
    args = pair_args(__doc__.splitlines()[0])
    policy = new_model(args.seed)
    reference = reference_copy(policy)

    config = dpo_trainer.DPOTrainingConfig(
        algorithm="dpo", beta=0.1, label_smoothing=0.0, eval_every_n_steps=10**9,
        max_steps=args.repeats + 1)
    trainer = dpo_trainer.DPOTrainer(policy, reference, adamw(), config)
    assert not trainer._lora_enabled
    train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)

    rng = np.random.default_rng(args.seed)
    draw = lambda n: jnp.asarray(  # noqa: E731
        rng.integers(1, policy.config.vocab_size, size=(args.pairs, n)).astype(np.int32))
    ones = lambda n: jnp.ones((args.pairs, n), jnp.int32)  # noqa: E731
    training_input = dpo_trainer.TrainingInput(
        prompt_ids=draw(args.prompt_len), prompt_mask=ones(args.prompt_len),
        chosen_ids=draw(args.completion_len), chosen_mask=ones(args.completion_len),
        rejected_ids=draw(args.completion_len), rejected_mask=ones(args.completion_len))

    def one():
        example = trainer._prepare_inputs(training_input)  # includes the reference forward
        example = sharding_utils.shard_input(example, config.data_sharding_axis)
        return train_step(example)

    first, med, loss0 = time_train_step(one, args.repeats)
    emit_pairs("tunix", args, first, med, loss0)


if __name__ == "__main__":
    main()
