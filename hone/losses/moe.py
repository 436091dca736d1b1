"""The router losses of mixture-of-experts models, from the router's per-layer sums.

A routed MLP (hone/models/moe.py) reduces what its router did over the real tokens of a batch
to a few sums (`router_sums`); the losses and metrics here are functions of those sums only, so
a step never keeps [tokens, experts] arrays of every layer, and sums from several forward
passes of one step (chosen and rejected rows scored apart) simply add.

- Load balancing (Switch Transformer eq. 4-6, in the form transformers'
  `load_balancing_loss_func` computes for Mixtral and Qwen-MoE): over the real tokens of every
  routed layer together, f_e = (top-k choices of expert e) / rows and P_e = mean router
  probability of e; loss = E * sum_e f_e P_e. sum_e f_e = k, so a uniform router scores k.
  Padding (attention_mask 0) counts in neither. Only P carries a gradient (f comes from top-k).
- Router z-loss (ST-MoE, Zoph et al. 2022): the mean over real tokens and routed layers of
  logsumexp(router logits)^2; it keeps the logits small, which keeps the softmax stable.

Letters: N tokens, E experts, k experts per token, L routed layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Sums of one layer (or, stacked, of L layers: a leading [L] axis on every entry).
RouterSums = dict[str, jax.Array]


def router_sums(logits: jax.Array, chosen: jax.Array, valid: jax.Array) -> RouterSums:
    """What one routed layer's router did on the tokens `valid` marks.

    logits [N, E] (float32), chosen [N, k] expert indices, valid [N] (bool or 0/1). Returns
    count [E] (top-k choices per expert), prob [E] (router probabilities summed), z [] (sum of
    logsumexp^2), entropy [] (sum of the router distribution's entropy), tokens [] (real
    tokens)."""
    w = valid.astype(jnp.float32)  # [N]
    logp = jax.nn.log_softmax(logits, axis=-1)  # [N, E]
    probs = jnp.exp(logp)  # [N, E]
    lse = jax.nn.logsumexp(logits, axis=-1)  # [N]
    count = jnp.zeros(logits.shape[-1], jnp.float32).at[chosen].add(
        jnp.broadcast_to(w[:, None], chosen.shape))  # [E]
    return {"count": jax.lax.stop_gradient(count),
            "prob": jnp.sum(probs * w[:, None], axis=0),
            "z": jnp.sum(lse * lse * w),
            "entropy": jax.lax.stop_gradient(-jnp.sum(jnp.sum(probs * logp, axis=-1) * w)),
            "tokens": jnp.sum(w)}


def _rows(sums: RouterSums) -> jax.Array:
    """Real tokens over every layer (transformers' total_rows); at least 1 for an all-padding
    batch, whose sums are all zero."""
    return jnp.maximum(jnp.sum(sums["tokens"]), 1.0)


def load_balancing_loss(sums: RouterSums) -> jax.Array:
    """E * sum_e f_e P_e over every routed layer's real tokens (stacked sums, [L, E])."""
    rows = _rows(sums)
    f = jnp.sum(sums["count"].reshape(-1, sums["count"].shape[-1]), axis=0) / rows  # [E]
    p = jnp.sum(sums["prob"].reshape(-1, sums["prob"].shape[-1]), axis=0) / rows  # [E]
    return f.shape[0] * jnp.sum(f * p)


def z_loss(sums: RouterSums) -> jax.Array:
    """Mean of logsumexp(router logits)^2 over every routed layer's real tokens."""
    return jnp.sum(sums["z"]) / _rows(sums)


def router_loss(sums: RouterSums, aux_coef: float, z_coef: float) -> tuple[jax.Array, dict]:
    """(aux_coef * load balancing + z_coef * z-loss, metrics) from stacked sums [L, ...].

    Metrics: moe/aux_loss and moe/z_loss (unscaled), moe/load_max and moe/load_mean (top-k
    choices per expert in a layer: the busiest expert and the average, averaged over layers; a
    balanced router has max = mean), moe/router_entropy (mean per token, nats) and moe/dropped
    (always 0: the grouped compute drops no token)."""
    count = sums["count"].reshape(-1, sums["count"].shape[-1])  # [L, E]
    aux, z = load_balancing_loss(sums), z_loss(sums)
    metrics = {"moe/aux_loss": aux, "moe/z_loss": z,
               "moe/load_max": jnp.mean(jnp.max(count, axis=-1)),
               "moe/load_mean": jnp.mean(count),
               "moe/router_entropy": jnp.sum(sums["entropy"]) / _rows(sums),
               "moe/dropped": jnp.zeros((), jnp.float32)}
    return aux_coef * aux + z_coef * z, metrics
