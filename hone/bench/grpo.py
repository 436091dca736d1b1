"""How `hone bench grpo` (and benchmarks/grpo_hone.py) builds and times one GRPO step.

Settings: the `model` preset (random init, fp32), every parameter trained; `prompts` prompts of
`prompt_len` random ids (1..V-1, fresh every step), each sampled `generations` times for
`new_tokens` tokens at temperature 0.9 (no top-k / top-p) with no EOS id (token-id prompts, no
tokenizer), so every completion is full length. GRPOConfig via `load_config`: group_size =
generations, beta (0.04 = Tunix's default; 0 = no reference at all), clip_eps 0.2, one
iteration, kl_kind k1, loss_agg seq-mean-token-mean; AdamW (lr 1e-4 constant) after global-norm
clipping at 1.0. Reward: the share of even token ids in each completion, so advantages are
non-zero.

Wired as hone/recipes/grpo.py's `run_grpo` wires it (its objective from
hone/rl/grpo_objective.py): `build_model`, `split_model`,
`rl_optimizer`, `new_train_state`, the reference aux (a copy of the parameters when
`reference_mode` is "copy", i.e. beta > 0) and `make_rl_step(..., make_grpo_loss(cfg), ...,
score=make_scoring(...))`: one jitted, state-donating program running the reference forward,
the policy forward, the loss, gradients, clipping and AdamW. One iteration: no old-log-prob
forward (ratio 1).

The update scores the rollout as `run_grpo` does by default: one tree row per prompt, its
samples sharing it (`pack_tree_rows`, grpo.shared_prompt; `shared_prompt=False`: a row per
sample, `pack_rows`, as Tunix runs it).

Timed per step (wall clock): rollout_s = `nnx.merge` of the current weights (no copy) +
`hone.rl.rollout.sample` (prefill + decode) + rewards + `grpo_advantages` + the packing;
update_s = `step(state, frozen, rows, aux)` until its metrics are ready, INCLUDING the reference
forward; the step = rollout + update. ref_s is measured after the steps (and after peak RSS is
read): `make_scoring`'s reference forward jitted alone over the last rows, first call dropped;
it is part of update_s, not extra; 0.0 when beta = 0. The first step (compiles the sampler and
the update program) is first_s; medians are over the next `repeats` steps.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.bench import flops
from hone.bench.rows import Measured, assert_fp32, quiet, step_remat
from hone.bench.timing import finite, peak_rss_mb, timed

PAD_ID = 0  # what generate pads with when there is no tokenizer; never in a prompt


def even_share(samples) -> np.ndarray:
    """Trivial reward: the share of even token ids in each completion."""
    return np.array([np.mean(np.asarray(c.tokens) % 2 == 0) if len(c.tokens) else 0.0
                     for c in samples.completions], np.float32)


def _config(model: str, prompts: int, generations: int, prompt_len: int, new_tokens: int,
            steps: int, beta: float, precision: str, seed: int, shared_prompt: bool = True,
            remat: str = "none"):
    from hone.config import GRPOConfig, load_config
    return load_config(GRPOConfig, None, [
        f"model.source={model}", "model.dtype=float32",
        f"train.batch_size={prompts * generations}", "train.grad_accum=1",
        f"train.max_steps={steps}", "train.lr=1e-4", "train.schedule=constant",
        "train.warmup_steps=0", "train.weight_decay=0.01", "train.b1=0.9", "train.b2=0.999",
        "train.eps=1e-8", "train.max_grad_norm=1.0", f"train.seed={seed}",
        f"train.precision={precision}", f"train.remat={remat}", f"grpo.group_size={generations}",
        f"grpo.max_prompt_tokens={prompt_len}", f"grpo.max_new_tokens={new_tokens}",
        "grpo.temperature=0.9", f"grpo.beta={beta}", "grpo.clip_eps=0.2",
        "grpo.iterations=1", "grpo.kl_kind=k1", "grpo.loss_agg=seq-mean-token-mean",
        f"grpo.shared_prompt={str(shared_prompt).lower()}"])


def grpo_row(model: str = "smollm2-135m", prompts: int = 2, generations: int = 4,
             prompt_len: int = 32, new_tokens: int = 32, repeats: int = 5, beta: float = 0.04,
             precision: str = "fp32", seed: int = 0, shared_prompt: bool = True,
             remat: str = "none", log: Callable = quiet) -> Measured:
    """One GRPO step, repeated; series holds the per-step seconds (step_s, rollout_s, update_s,
    ref_s), extra their medians (first dropped), beta / ref_in_update and the remat (train.remat)
    the policy was built with."""
    from hone.losses.rl import grpo_advantages, policy_loss_denominator
    from hone.rl.grpo_objective import make_grpo_loss, make_scoring
    from hone.rl.rollout import pack_rows, pack_tree_rows, sample, step_seed, tree_layout
    from hone.rl.step import make_rl_step
    from hone.train.build import build_model
    from hone.train.optimizer import rl_optimizer
    from hone.train.reference import reference_mode
    from hone.train.state import new_train_state, split_model, train_params, unflatten

    steps = repeats + 1
    log(f"grpo: building {model}, {prompts} prompts x {generations} generations, "
        f"{prompt_len} + {new_tokens} tokens, beta {beta}, {precision}, remat {remat}")
    cfg = _config(model, prompts, generations, prompt_len, new_tokens, steps, beta, precision,
                  seed, shared_prompt, remat)
    grpo = cfg.grpo
    tree = tree_layout(cfg)
    assert tree == shared_prompt
    net, trainable = build_model(cfg, log=quiet)
    assert trainable is nnx.Param
    assert_fp32(net)
    arch = net.config

    mode = reference_mode(cfg)
    assert mode == ("copy" if beta > 0 else None), mode
    graphdef, params, frozen = split_model(net, trainable)
    built_remat = step_remat(graphdef, params, frozen)  # build_model set it from train.remat
    optimizer, schedule = rl_optimizer(cfg.train, grpo.iterations)
    state = new_train_state(train_params(net, params), optimizer, cfg.train.seed)
    aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
    score = make_scoring(cfg, graphdef, params, mode)
    assert (score is None) == (mode is None)
    step = make_rl_step(
        graphdef, params, make_grpo_loss(cfg),
        lambda b: policy_loss_denominator(b["loss_mask"], grpo.loss_agg,
                                          max_len=grpo.max_new_tokens),
        optimizer, schedule, accum=cfg.train.grad_accum, precision=cfg.train.precision,
        epochs=grpo.iterations, score=score)
    del net

    rng = np.random.default_rng(seed)
    step_s, rollout_s, update_s, losses = [], [], [], []
    rows = None
    log(f"timing: 1 first step (compile + run), then {repeats} step(s)")
    for i in range(steps):
        ids = rng.integers(1, arch.vocab_size, (prompts, prompt_len)).tolist()
        t0 = time.perf_counter()
        policy = nnx.merge(graphdef, unflatten(params, state["params"]), frozen)
        samples = sample(policy, None, ids, [""] * prompts, {}, group_size=generations,
                         max_new_tokens=new_tokens, temperature=grpo.temperature,
                         top_k=grpo.top_k, top_p=grpo.top_p, seed=step_seed(cfg.train.seed, i),
                         prompt_bucket=grpo.max_prompt_tokens)
        adv, _ = grpo_advantages(jnp.asarray(even_share(samples)), generations,
                                 scale=grpo.scale, leave_one_out=grpo.leave_one_out)
        rows = (pack_tree_rows if tree else pack_rows)(samples, grpo.max_prompt_tokens,
                                                       grpo.max_new_tokens, PAD_ID)
        adv = np.asarray(adv, np.float32)
        rows["advantages"] = adv.reshape(prompts, generations) if tree else adv
        t1 = time.perf_counter()
        del policy  # its arrays are the state's, which the step donates
        state, metrics = step(state, frozen, rows, aux)
        jax.block_until_ready(metrics)
        t2 = time.perf_counter()
        assert all(len(c.tokens) == new_tokens for c in samples.completions)
        losses.append(finite(metrics["loss"]))
        rollout_s.append(t1 - t0)
        update_s.append(t2 - t1)
        step_s.append(t2 - t0)
        if i == 0:
            log(f"first step {step_s[0]:.2f} s")
    peak = peak_rss_mb()  # before the separate reference measurement below

    ref_s = []
    if score is not None:  # the update's in-jit reference forward, jitted alone
        ref_fwd = timed(ref_s, jax.jit(score),
                        wait=lambda out: jax.block_until_ready(out[0]["ref_logp"]))
        for _ in range(steps):
            ref_fwd(state, frozen, rows, aux)

    med = lambda xs: statistics.median(xs[1:]) if len(xs) > 1 else 0.0  # noqa: E731
    log(f"median step {med(step_s):.4f} s (rollout {med(rollout_s):.4f} s, update "
        f"{med(update_s):.4f} s)")
    seqs, seq = prompts * generations, prompt_len + new_tokens
    return Measured(
        step_s[0], med(step_s), seqs * seq,
        flops.grpo_flops(arch, prompts, generations, prompt_len, new_tokens,
                         reference=score is not None, shared_prompt=tree),
        losses[0], peak,
        extra={"rollout_s": med(rollout_s), "ref_s": med(ref_s), "update_s": med(update_s),
               "beta": beta, "ref_in_update": score is not None, "remat": built_remat},
        series={"step_s": step_s, "rollout_s": rollout_s, "ref_s": ref_s,
                "update_s": update_s})
