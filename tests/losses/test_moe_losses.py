"""Router losses of mixture-of-experts models against float64 numpy transcriptions of their
published formulas (transformers' load_balancing_loss_func; ST-MoE's z-loss), and against
transformers' own function."""

import numpy as np
import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from hone.losses.moe import load_balancing_loss, router_loss, router_sums, z_loss

L, N, E, K = 3, 10, 6, 2


def case(seed=0):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((L, N, E)) * 2).astype(np.float32)  # [L, N, E]
    valid = np.ones(N, np.float32)
    valid[[2, 7, 8]] = 0  # padding: counts in neither f nor P
    return logits, valid


def reference(logits, valid):
    """Float64: f_e = top-k choices of e over the real tokens of every layer / rows,
    P_e = their mean router probability, aux = E sum f_e P_e; z = mean logsumexp^2."""
    x = logits.astype(np.float64)
    probs = np.exp(x - x.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)  # [L, N, E]
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :K]  # [L, N, K]
    counts = np.zeros(E)
    for l in range(L):
        for n in range(N):
            for e in top[l, n]:
                counts[e] += valid[n]
    rows = valid.sum() * L
    f, p = counts / rows, (probs * valid[None, :, None]).sum((0, 1)) / rows
    lse = np.log(np.exp(x).sum(-1))  # [L, N]
    return E * np.sum(f * p), np.sum(lse ** 2 * valid[None]) / rows, counts


def sums_of(logits, valid):
    import jax
    import jax.numpy as jnp
    per_layer = []
    for l in range(L):
        chosen = jax.lax.top_k(jax.nn.softmax(jnp.asarray(logits[l]), -1), K)[1]
        per_layer.append(router_sums(jnp.asarray(logits[l]), chosen, jnp.asarray(valid)))
    return jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)


@pytest.mark.parametrize("seed", [0, 1])
def test_router_losses_equal_float64_formulas_and_transformers(seed):
    logits, valid = case(seed)
    aux, z, counts = reference(logits, valid)
    sums = sums_of(logits, valid)
    assert float(load_balancing_loss(sums)) == pytest.approx(aux, abs=1e-6)
    assert float(z_loss(sums)) == pytest.approx(z, abs=1e-6)
    theirs = load_balancing_loss_func(
        tuple(torch.tensor(logits[l]) for l in range(L)), E, K,
        attention_mask=torch.tensor(valid[None, :]))
    assert float(theirs) == pytest.approx(aux, abs=1e-6)
    total, metrics = router_loss(sums, 0.25, 0.5)
    assert float(total) == pytest.approx(0.25 * aux + 0.5 * z, abs=1e-6)
    assert float(metrics["moe/load_mean"]) == pytest.approx(valid.sum() * K / E)
    assert float(metrics["moe/dropped"]) == 0.0


def test_uniform_router_scores_k_and_all_padding_is_finite():
    """Equal logits: every expert gets P = 1/E; the top-k counts sum to k per token, so the
    loss is E * sum f_e / E = k. A batch of padding only gives zeros, not NaN."""
    import jax.numpy as jnp
    logits = jnp.zeros((N, E))
    chosen = jnp.tile(jnp.arange(K), (N, 1))
    sums = router_sums(logits, chosen, jnp.ones(N))
    assert float(load_balancing_loss(sums)) == pytest.approx(K)
    assert float(z_loss(sums)) == pytest.approx(np.log(E) ** 2, rel=1e-6)
    empty = router_sums(logits, chosen, jnp.zeros(N))
    assert float(load_balancing_loss(empty)) == 0.0 and float(z_loss(empty)) == 0.0
