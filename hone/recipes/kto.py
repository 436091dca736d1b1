"""`hone kto`: KTO (Ethayarajh et al. 2024) on examples labelled desirable or undesirable.

Each batch holds B examples and their B KL rows (`hone.data.kto`: [prompt | another example's
completion]). One jitted step:
1. scores the whole batch's KL rows with the policy and the reference, without gradients (in
   chunks of one micro-batch), and takes the reference point z0 = max(0, mean log-ratio) over
   all of them: the whole batch, on every device, whatever train.grad_accum is (as
   `hone.rl.step` scores a rollout before its updates);
2. runs the usual accumulated update (`hone.train.step.update_fn`) with z0 handed to every
   micro-batch, each summing its examples' KTO losses over the batch's example count, so the
   split into micro-batches and devices never changes the update.
Evaluation batches are scored whole, so the loss computes their z0 itself.

The reference log-probabilities come from a frozen copy, the base with adapters off, or one
pass before training ("precomputed", cached in run_dir/reference_logps.npz for the examples and
their KL rows: the KL partners are fixed, so both can be); `hone.train.reference` decides.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import KTOConfig
from hone.data.collate import KEYS
from hone.data.kto import class_balance, load_kto
from hone.data.shared_prefix import work_tokens
from hone.losses.kto import kto_reference_point, kto_terms
from hone.losses.preference import pair_count, sequence_logprobs
from hone.rl.step import chunked
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, compile_steps, make_layout, open_run, summed_eval
from hone.train.loop import LoopSpec, run_loop
from hone.train.reference import cached_halves, reference_mode, reference_model
from hone.train.scoring import row_logprobs
from hone.train.state import tree_bytes, unflatten
from hone.train.step import merge, pair_split, update_fn

_CLASS_SUMS = ("rewards_desirable", "rewards_undesirable", "logps_desirable",
               "logps_undesirable")


def _logps(model, rows) -> jax.Array:
    """Summed completion log-probs [R] of rows [R, L]."""
    return sequence_logprobs(row_logprobs(model, rows)[0], rows["loss_mask"])


def _half(mb, part: int) -> dict:
    """The example rows (part 0) or the KL rows (part 1) of a batch: [B, L] each."""
    b = mb["pair_valid"].shape[0]
    return {k: mb[k][part * b:(part + 1) * b] for k in KEYS}


def make_kto_loss(cfg: KTOConfig, mode: str):
    k = cfg.kto

    def reference_logps(model, rows, aux):
        return jax.lax.stop_gradient(_logps(reference_model(model, mode, aux), rows))

    def loss_fn(model, mb, normalizer, key, aux):
        valid = mb["pair_valid"]  # [b]
        b = valid.shape[0]
        metrics = {}
        if "kto_z0" in mb:  # training: z0 of the whole batch, from the step's scoring pass
            examples = _half(mb, 0)
            policy = _logps(model, examples)  # [b]
            ref = mb["ref_logp"] if mode == "precomputed" else reference_logps(model, examples,
                                                                               aux)
            z0 = mb["kto_z0"][0]
        else:  # evaluation: one whole batch, its KL rows scored here
            rows = {name: mb[name] for name in KEYS}  # examples, then their KL rows
            both = _logps(model, rows)  # [2b]
            if mode == "precomputed":
                ref_both = jnp.concatenate([mb["ref_logp"], mb["ref_kl_logp"]])
            else:
                ref_both = reference_logps(model, rows, aux)
            policy, ref = both[:b], ref_both[:b]
            z0 = kto_reference_point(both[b:], ref_both[b:], valid)
            metrics = {"kl_sum": jnp.sum((both[b:] - ref_both[b:]) * valid),
                       "kl_rows": jnp.sum(valid)}
        losses, rewards = kto_terms(policy, ref, mb["desirable"], z0, beta=k.beta,
                                    desirable_weight=k.desirable_weight,
                                    undesirable_weight=k.undesirable_weight)  # [b] each
        good, bad = valid * mb["desirable"], valid * (1.0 - mb["desirable"])
        rewards, policy_sg = jax.lax.stop_gradient(rewards), jax.lax.stop_gradient(policy)
        metrics.update(examples=jnp.sum(valid), desirable=jnp.sum(good),
                       undesirable=jnp.sum(bad),
                       rewards_desirable_sum=jnp.sum(rewards * good),
                       rewards_undesirable_sum=jnp.sum(rewards * bad),
                       logps_desirable_sum=jnp.sum(policy_sg * good),
                       logps_undesirable_sum=jnp.sum(policy_sg * bad))
        return jnp.sum(losses * valid) / normalizer, metrics

    return loss_fn


def make_kto_step(cfg: KTOConfig, graphdef, template, loss_fn, optimizer, schedule, mode: str,
                  accum: int, layout):
    """The jitted `step(state, frozen, batch, aux) -> (state, metrics)` (module docstring)."""
    precision = cfg.train.precision
    update = update_fn(graphdef, template, loss_fn, pair_count, optimizer, schedule,
                       accum=accum, precision=precision, split=pair_split, layout=layout)

    def reference_point(state, frozen, batch, aux):
        def score(rows):  # one micro-batch of KL rows, [B / accum, L]
            model = merge(graphdef, template, state["params"], frozen, precision)
            out = {"policy": _logps(model, rows)}
            if mode != "precomputed":
                out["ref"] = _logps(reference_model(model, mode, aux), rows)
            return jax.lax.stop_gradient(out)

        out = chunked(score, _half(batch, 1), accum)  # [B] each
        ref = batch["ref_kl_logp"] if mode == "precomputed" else out["ref"]
        valid = batch["pair_valid"]
        z0 = kto_reference_point(out["policy"], ref, valid)
        return z0, {"kl_sum": jnp.sum((out["policy"] - ref) * valid), "kl_rows": jnp.sum(valid),
                    "z0": z0}

    def step(state, frozen, batch, aux=None):
        z0, pre = reference_point(state, frozen, batch, aux)
        batch = dict(batch, kto_z0=jnp.broadcast_to(z0, batch["pair_valid"].shape))
        state, metrics = update(state, frozen, batch, aux)
        return state, dict(metrics, **pre)

    return jax.jit(step, donate_argnums=(0,))


def means(row: dict, prefix: str = "") -> dict:
    """Per-class means of the summed metrics of a logged row: rewards (β·r) and the policy's
    log-probs of each class, their margin, and kl = the mean log-ratio of the KL rows."""
    out = {}
    for name in _CLASS_SUMS:
        if prefix + name + "_sum" in row:
            count = row[prefix + name.split("_")[1]]
            out[prefix + name] = row[prefix + name + "_sum"] / max(float(count), 1.0)
    if prefix + "rewards_desirable" in out:
        out[prefix + "margin"] = out[prefix + "rewards_desirable"] - out[
            prefix + "rewards_undesirable"]
    if prefix + "kl_sum" in row:
        out[prefix + "kl"] = row[prefix + "kl_sum"] / max(float(row[prefix + "kl_rows"]), 1.0)
    return out


def reference_scorer(model, lora: bool):
    """`score(batch) -> [2B]` summed log-probs of a batch's rows under the reference of
    "precomputed": the model with adapters off (LoRA) or as it starts. Jitted once, for the
    training and the held-out examples."""
    graphdef, state = nnx.split(reference_model(model, "adapters_off") if lora else model)
    score = jax.jit(lambda state, rows: _logps(nnx.merge(graphdef, state), rows))
    return lambda batch: score(state, {k: batch[k] for k in KEYS})


def precompute_reference(score, data, run_dir: Path, log, source: str) -> None:
    """Reference log-probs of every example and its KL row (`score`: `reference_scorer`),
    computed once and cached in run_dir."""
    cache = run_dir / "reference_logps.npz"
    digest = hashlib.sha256(source.encode())
    for key in ("tokens", "loss_mask"):
        digest.update(np.ascontiguousarray(data.pairs[key]).tobytes())
    fingerprint = digest.hexdigest()
    got, reused = cached_halves(cache, fingerprint, score, data.batches(), data.num_pairs,
                                ("examples", "kl"))
    data.add_pair_arrays(ref_logp=got["examples"], ref_kl_logp=got["kl"])
    log(f"reference log-probs: reusing {cache}" if reused else
        f"reference log-probs: computed for {data.num_pairs} examples and their KL rows, "
        f"cached in {cache}")


def run_kto(cfg: KTOConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state, reference bytes)."""
    tokenizer = load_tokenizer(cfg.model.source)
    train_data, eval_data = load_kto(cfg, tokenizer, log)
    k = cfg.kto
    note = class_balance(train_data.num_desirable, train_data.num_undesirable,
                         k.desirable_weight, k.undesirable_weight)
    if note:
        log(note)
    layout = make_layout(cfg, rows_per_example=2)
    model, trainable = build_model(cfg, layout=layout)
    run_dir = open_run(cfg)

    mode = reference_mode(cfg)
    loss_fn = make_kto_loss(cfg, mode)
    graphdef, params, frozen, state, step, eval_step = compile_steps(
        cfg, model, trainable, loss_fn, pair_count, split=pair_split, layout=layout,
        make_step=lambda graphdef, params, optimizer, schedule, accum: make_kto_step(
            cfg, graphdef, params, loss_fn, optimizer, schedule, mode, accum, layout))
    # The starting weights, never updated: a real copy (the train state's buffers are donated).
    aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
    if mode == "precomputed":
        score = reference_scorer(model, cfg.model.lora.rank > 0)
        precompute_reference(score, train_data, run_dir, log, cfg.model.source)
        if eval_data is not None:
            precompute_reference(score, eval_data, run_dir / "eval", log, cfg.model.source)
    log(f"reference: {mode} ({tree_bytes(aux) / 2**20:.1f} MiB of extra weights)")
    eval_fn = None
    if eval_data is not None:
        eval_fn = summed_eval(eval_step, frozen, eval_data, place=layout.place_batch, aux=aux,
                              max_batches=cfg.train.eval_batches, means=lambda t: means(t, "eval_") | {
                                  "eval_examples": t.get("eval_examples", 0.0)})
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=train_data.iterator(),
        eval_fn=eval_fn, place_batch=layout.place_batch, tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(cfg.data.max_length), extra_metrics=means)
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final, tree_bytes(aux)
