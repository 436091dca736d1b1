"""The sampler's draw (inverse transform over blocks of the vocabulary) against the
distribution it is meant to sample: frequencies, truncated tokens, reported log-probs."""

import jax
import jax.numpy as jnp
import numpy as np

from hone.sampling.strategies import BLOCK, SamplingMode, choose, draw


def test_draw_matches_softmax_across_blocks_and_never_draws_a_truncated_token():
    v = 2 * BLOCK + 37  # three blocks, the last partly padding
    probs = np.zeros(v)
    probs[[3, BLOCK - 1, BLOCK, 2 * BLOCK + 36]] = [0.4, 0.1, 0.3, 0.2]
    logits = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), -np.inf).astype(np.float32)
    n = 40_000
    tokens = np.asarray(draw(jax.random.key(7), jnp.broadcast_to(jnp.asarray(logits), (n, v))))
    assert set(np.unique(tokens)) <= {3, BLOCK - 1, BLOCK, 2 * BLOCK + 36}
    freq = np.bincount(tokens, minlength=v) / n
    sigma = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(freq - probs) <= 5 * sigma + 1e-12)


def test_draw_with_a_finite_floor_and_one_token_left():
    v = 300
    floor = float(jnp.finfo(jnp.float32).min)
    logits = jnp.full((64, v), floor).at[:, 299].set(0.0)  # top-k 1 as the truncation writes it
    assert np.all(np.asarray(draw(jax.random.key(0), logits)) == 299)


def test_choose_reports_the_log_probs_of_the_drawn_token():
    logits = jax.random.normal(jax.random.key(1), (16, 700)) * 3
    mode = SamplingMode(greedy=False, top_k=50, use_top_p=False)
    token, lp, slp = choose(logits, jax.random.key(2), mode, jnp.float32(0.7), jnp.float32(1.0))
    rows = np.arange(16)
    full = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    np.testing.assert_allclose(np.asarray(lp), full[rows, np.asarray(token)], atol=1e-5)
    scaled = np.asarray(logits) / 0.7
    kth = np.sort(scaled, axis=-1)[:, -50][:, None]
    kept = np.where(scaled >= kth, scaled, -np.inf)
    ref = kept - np.log(np.sum(np.exp(kept - kept.max(-1, keepdims=True)), -1,
                               keepdims=True)) - kept.max(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(slp), ref[rows, np.asarray(token)], atol=1e-4)
    assert np.all(np.isfinite(ref[rows, np.asarray(token)]))  # drawn from the top 50
