"""GRPO step with hone's own GRPO machinery (what `hone grpo` runs), SmolLM2-135M shape.

Settings (as grpo_tunix.py): model `smollm2-135m` preset (30 layers, width 576, FFN 1536, 9 heads /
3 KV heads, head dim 64, vocab 49152, tied embeddings), random init, fp32, every parameter
trained (no LoRA). --prompts (2) prompts of --prompt-len (32) random token ids (1..vocab-1, fresh
every step), each sampled --generations (4) times for --new-tokens (32) tokens at temperature 0.9
(no top-k, no top-p) with no EOS id (no tokenizer, token-id prompts: `hone.sampling.generate`
then stops on nothing), so every completion is exactly --new-tokens long. GRPOConfig from
`hone.config.load_config(GRPOConfig, None, overrides)`: train.batch_size = prompts x generations,
grpo.group_size = generations, grpo.beta = --beta (0.04, Tunix's default; 0 = no reference at
all), grpo.clip_eps 0.2, grpo.iterations 1, grpo.kl_kind k1 and grpo.loss_agg
seq-mean-token-mean (Tunix's defaults "kl" and "sequence-mean-token-mean"); AdamW (lr 1e-4
constant, betas 0.9/0.999, eps 1e-8, weight decay 0.01) after global-norm clipping at 1.0.
Reward: the share of even token ids in each completion (numpy), so advantages are non-zero.

The pieces are wired exactly as hone/recipes/grpo.py's `run_grpo` wires them: `build_model(cfg)`,
`split_model(model, nnx.Param)`, `rl_optimizer`, `new_train_state`, the reference aux
`jax.tree.map(jnp.copy, state["params"])` when `reference_mode(...)` is "copy" (beta > 0) and
None otherwise, and `make_rl_step(graphdef, params, make_grpo_loss(cfg), normalizer, optimizer,
schedule, accum=1, precision="fp32", epochs=1, prepare=make_prepare(cfg, graphdef, params,
mode))`: one jitted, state-donating program that runs the reference forward (beta > 0), the
policy forward, the GRPO loss, gradients, clipping and AdamW. With one iteration no old-log-prob
forward is run (ratio 1, as in TRL), and with beta = 0 `prepare` is None: no reference forward.

What is timed, per step (wall clock):
- rollout_s: `nnx.merge(graphdef, unflatten(params, state["params"]), frozen)` (the policy over
  the current weights, no copy, no recompile), `hone.rl.rollout.sample` (KV-cache prefill +
  decode of the 8 completions), the rewards, `hone.losses.rl.grpo_advantages` and
  `hone.rl.rollout.pack_rows` (+ the advantages column);
- update_s: `state, metrics = step(state, frozen, rows, aux)` until metrics are ready; this
  INCLUDES the reference forward (hone runs it inside the update program, so it cannot be timed
  apart within a step);
- median_s: the whole step, rollout + update.
- ref_s: measured separately, after the timed steps (and after peak RSS is read): the same
  `make_prepare(...)` function jitted on its own (reference forward only, no gradients) over the
  last step's rows, first call dropped, median of --repeats calls. It is a part of update_s, not
  extra time; 0.0 when beta = 0 (no reference exists).
The first step (compiles the sampler's prefill/decode and the update program) is first_s; the
medians are over the next --repeats steps. Prints one JSON line with grpo_tunix.py's fields
(impl "hone", row "grpo", first_s, median_s, tokens_per_s over the 8 x (prompt + new tokens)
sequences, peak_rss_mb, first_loss = the first update's loss, rollout_s, ref_s, update_s) plus
"beta" and "ref_in_update" (true when a reference forward runs inside update_s).

    .venv/bin/python benchmarks/grpo_hone.py --repeats 5
    .venv/bin/python benchmarks/grpo_hone.py --repeats 5 --beta 0
"""

from __future__ import annotations

import time

from _measure import emit_grpo, grpo_args, peak_rss_mb, timed

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import GRPOConfig, load_config
from hone.losses.rl import grpo_advantages, policy_loss_denominator
from hone.recipes.grpo import make_grpo_loss, make_prepare, reference_mode
from hone.recipes.rl_common import rl_optimizer
from hone.recipes.sft import build_model
from hone.rl.rollout import pack_rows, sample, step_seed
from hone.rl.step import make_rl_step
from hone.train.state import flatten, new_train_state, split_model, unflatten

PAD_ID = 0  # what generate pads with when there is no tokenizer; never in a prompt


def even_share(samples) -> np.ndarray:
    """Trivial reward: the share of even token ids in each completion."""
    return np.array([np.mean(np.asarray(c.tokens) % 2 == 0) if len(c.tokens) else 0.0
                     for c in samples.completions], np.float32)


def main():
    args = grpo_args(__doc__.splitlines()[0])
    steps = args.repeats + 1
    g_size, p_len, m_new = args.generations, args.prompt_len, args.new_tokens

    cfg = load_config(GRPOConfig, None, [
        "model.source=smollm2-135m", "model.dtype=float32",
        f"train.batch_size={args.prompts * g_size}", "train.grad_accum=1",
        f"train.max_steps={steps}", "train.lr=1e-4", "train.schedule=constant",
        "train.warmup_steps=0", "train.weight_decay=0.01", "train.b1=0.9", "train.b2=0.999",
        "train.eps=1e-8", "train.max_grad_norm=1.0", f"train.seed={args.seed}",
        "train.precision=fp32", f"grpo.group_size={g_size}",
        f"grpo.max_prompt_tokens={p_len}", f"grpo.max_new_tokens={m_new}",
        "grpo.temperature=0.9", f"grpo.beta={args.beta}", "grpo.clip_eps=0.2",
        "grpo.iterations=1", "grpo.kl_kind=k1", "grpo.loss_agg=seq-mean-token-mean"])
    g = cfg.grpo

    model, trainable = build_model(cfg, log=lambda *_: None)
    assert trainable is nnx.Param
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    vocab = model.config.vocab_size

    mode = reference_mode(cfg, g, needed=g.beta > 0)
    assert mode == ("copy" if args.beta > 0 else None), mode
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = rl_optimizer(cfg.train, g.iterations)
    state = new_train_state(flatten(params), optimizer, cfg.train.seed)
    aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
    prepare = make_prepare(cfg, graphdef, params, mode)
    assert (prepare is None) == (mode is None)
    step = make_rl_step(
        graphdef, params, make_grpo_loss(cfg),
        lambda b: policy_loss_denominator(b["loss_mask"], g.loss_agg, max_len=g.max_new_tokens),
        optimizer, schedule, accum=cfg.train.grad_accum, precision=cfg.train.precision,
        epochs=g.iterations, prepare=prepare)
    del model

    rng = np.random.default_rng(args.seed)
    step_s, rollout_s, update_s, losses = [], [], [], []
    rows = None
    for i in range(steps):
        prompts = rng.integers(1, vocab, (args.prompts, p_len)).tolist()
        t0 = time.perf_counter()
        policy = nnx.merge(graphdef, unflatten(params, state["params"]), frozen)
        samples = sample(policy, None, prompts, [""] * args.prompts, {}, group_size=g_size,
                         max_new_tokens=m_new, temperature=g.temperature, top_k=g.top_k,
                         top_p=g.top_p, seed=step_seed(cfg.train.seed, i),
                         prompt_bucket=g.max_prompt_tokens)
        rewards = even_share(samples)
        adv, _ = grpo_advantages(jnp.asarray(rewards), g_size, scale=g.scale,
                                 leave_one_out=g.leave_one_out)
        rows = pack_rows(samples, g.max_prompt_tokens, g.max_new_tokens, PAD_ID)
        rows["advantages"] = np.asarray(adv, np.float32)
        t1 = time.perf_counter()
        del policy  # its arrays are the state's, which the step donates
        state, metrics = step(state, frozen, rows, aux)
        jax.block_until_ready(metrics)
        t2 = time.perf_counter()
        assert all(len(c.tokens) == m_new for c in samples.completions)
        losses.append(float(metrics["loss"]))
        rollout_s.append(t1 - t0)
        update_s.append(t2 - t1)
        step_s.append(t2 - t0)
    peak = peak_rss_mb()  # before the separate reference measurement below

    ref_s = []
    if prepare is not None:  # the update's in-jit reference forward, jitted alone
        ref_fwd = timed(ref_s, jax.jit(prepare),
                        wait=lambda out: jax.block_until_ready(out[0]["ref_logp"]))
        for _ in range(steps):
            ref_fwd(state, frozen, rows, aux)

    emit_grpo("hone", args, step_s, rollout_s, ref_s, update_s, losses[0], peak,
              beta=args.beta, ref_in_update=prepare is not None)


if __name__ == "__main__":
    main()
