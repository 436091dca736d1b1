"""GRPO step with Tunix's GRPOLearner (run with the Tunix venv, see _venvs.py).

Settings: tunix.models.llama3.model.Llama3 with the SmolLM2-135M shape (as train_tunix.py), random
init, fp32, every parameter trained (actor); reference = a second Llama3 holding a copy of the
initial weights. --prompts (2) prompts of --prompt-len (32) random token ids per step, each
sampled --generations (4) times for --new-tokens (32) tokens. GRPOConfig(num_generations=4,
num_iterations=1, beta=0.04 (Tunix's default), epsilon=0.2, the default "grpo" loss and
advantage estimator). Rollout: Tunix's "vanilla" engine (its Sampler, KV cache of prompt + new
tokens = 64 slots) with Tunix's default RolloutConfig sampling (temperature 0.9, top_p 1.0, no
top_k), EOS set to an id no token has, so every completion is exactly --new-tokens long. Actor,
reference and rollout share one 1-device mesh (so the rollout uses the actor's weights: no weight
sync). Optimizer: optax.chain(clip_by_global_norm(1.0), adamw(1e-4, betas 0.9/0.999, eps 1e-8,
weight decay 0.01)). Reward: a trivial function of the text (the share of even token ids in the
completion), so advantages are non-zero. The tokenizer turns a string of space-separated ids into
those ids and back (_tunix_model.IdTokenizer).

What is timed: the real `GRPOLearner.train()` loop over --repeats + 1 batches (max_steps the same),
with wall-clock timers wrapped around Tunix's own methods:
- step (median_s): `GRPOLearner._run_global_step`, one whole step: rollout, reference per-token
  log-probs, rewards and advantages (in Tunix's data thread, awaited by the main thread), then the
  actor update;
- rollout_s: `RLCluster.generate`, the sampler generating the 2 x 4 completions;
- ref_s: `RLCluster.get_ref_per_token_logps` (the reference forward), blocked until ready;
- update_s: `RLCluster.update_actor` (the jitted GRPO loss + gradient + AdamW step through
  Tunix's trainer loop, which waits for its computations before returning).
The first step (compiles the sampler's prefill/decode, the reference forward and the train step)
is first_s; median_s, rollout_s, ref_s and update_s are medians over the next --repeats steps.
Prints one JSON line with train_*.py's fields (row "grpo"; tokens_per_s counts the 8 sequences x
(prompt + new tokens) of the step; first_loss is the first update's GRPO loss) plus "rollout_s",
"ref_s" and "update_s".

    benchmarks/.venvs/tunix/bin/python benchmarks/grpo_tunix.py --repeats 5
"""

from __future__ import annotations

from _measure import emit_grpo, grpo_args, timed

import jax
import numpy as np
from jax.sharding import AxisType, Mesh
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from _tunix_model import NO_EOS, IdTokenizer, adamw, new_model, reference_copy


def even_share_reward(prompts, completions, **kwargs) -> list[float]:
    """Trivial reward: the share of even token ids in each completion."""
    return [float(np.mean([int(t) % 2 == 0 for t in c.split()] or [0.0])) for c in completions]


def main():
    args = grpo_args(__doc__.splitlines()[0])
    steps = args.repeats + 1

    actor = new_model(args.seed)
    reference = reference_copy(actor)

    # jax.make_mesh would default to Explicit axes; Tunix's models expect Auto.
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=adamw(), eval_every_n_steps=10**9, max_steps=steps)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens, max_prompt_length=args.prompt_len,
        kv_cache_size=args.prompt_len + args.new_tokens, eos_tokens=[NO_EOS])
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=IdTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                                  rl_cluster_lib.Role.REFERENCE,
                                                  rl_cluster_lib.Role.ROLLOUT)},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
            rollout_config=rollout))
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(num_generations=args.generations,
                                            num_iterations=1, beta=args.beta, epsilon=0.2),
        reward_fns=even_share_reward)
    assert not learner.should_sync_weights  # rollout runs on the actor's own weights

    # Timers around Tunix's own methods (instance attributes shadow the class's).
    step_s, rollout_s, ref_s, update_s, losses = [], [], [], [], []
    learner._run_global_step = timed(step_s, learner._run_global_step)
    cluster.generate = timed(rollout_s, cluster.generate)
    cluster.get_ref_per_token_logps = timed(ref_s, cluster.get_ref_per_token_logps,
                                            wait=jax.block_until_ready)
    cluster.update_actor = timed(update_s, cluster.update_actor)
    trainer = cluster.actor_trainer
    buffer_metrics = trainer._buffer_metrics

    def record_loss(metrics_buffer, loss, step, additional_metrics=None):
        losses.append(loss)
        return buffer_metrics(metrics_buffer, loss, step, additional_metrics)
    trainer._buffer_metrics = record_loss

    rng = np.random.default_rng(args.seed)
    # Prompts as a numpy array: the learner repeats each leaf of the batch with np.repeat
    # under jax.tree.map, which would treat a Python list's strings as separate leaves.
    batches = [{"prompts": np.array([" ".join(str(t) for t in row) for row in rng.integers(
        1, actor.config.vocab_size, (args.prompts, args.prompt_len))])} for _ in range(steps)]
    learner.train(batches)

    assert len(step_s) == len(rollout_s) == len(update_s) == steps, (
        len(step_s), len(rollout_s), len(update_s))
    assert len(ref_s) == (steps if args.beta else 0)
    emit_grpo("tunix", args, step_s, rollout_s, ref_s, update_s, losses[0])


if __name__ == "__main__":
    main()
