"""The fused kernels' paths against dense attention at 1e-5 (outputs and gradients), on CPU:
model.attention=cudnn's mapping of a mask spec to `jax.nn.dot_product_attention`'s flags, run
with XLA's implementation (right padding and a sliding window take the fused branch, left
padding the blockwise one, in one compiled function); model.attention=splash with the TPU
kernel in Pallas' interpreter (packed runs, padding, a window, soft-capping, a length not a
multiple of its 128-blocks; segments that are not runs take the blockwise branch); what neither
can express falls back to blockwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hone.models.attention import dense_attention
from hone.models.fused_attention import (cudnn_attention, cudnn_expressible, splash_attention,
                                         splash_expressible)
from hone.models.masks import MaskSpec

B, T = 3, 40


def _spec(valid, window=None):
    slots = jnp.broadcast_to(jnp.arange(T), (B, T))
    return MaskSpec(slots, slots, jnp.asarray(valid), window)


RIGHT = np.arange(T)[None, :] < np.array([[40], [35], [22]])  # row 2: queries past the window
LEFT = np.arange(T)[None, :] >= np.array([[0], [5], [3]])


def test_what_cudnn_can_express():
    assert bool(cudnn_expressible(_spec(RIGHT)))
    assert not bool(cudnn_expressible(_spec(LEFT)))
    empty_row = np.arange(T)[None, :] < np.array([[40], [35], [0]])
    assert not bool(cudnn_expressible(_spec(empty_row)))
    shifted = _spec(RIGHT)
    shifted = MaskSpec(shifted.q_index + 1, shifted.k_index + 1, shifted.k_valid)
    assert not bool(cudnn_expressible(shifted))


def test_the_xla_run_of_the_cudnn_call_equals_dense():
    rng = np.random.default_rng(0)
    q, d_out = (jnp.asarray(rng.normal(size=(B, T, 4, 8)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(B, T, 2, 8)), jnp.float32) for _ in range(2))

    def run(fn, spec):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v, spec) * d_out)  # noqa: E731
        return fn(q, k, v, spec), jax.grad(loss, (0, 1, 2))(q, k, v)

    fused = jax.jit(lambda spec: run(lambda q, k, v, spec: cudnn_attention(
        q, k, v, spec, scale=0.3, block=16, implementation="xla"), spec))
    dense = jax.jit(lambda spec: run(lambda q, k, v, spec: dense_attention(
        q, k, v, spec.build(), scale=0.3)[0], spec))
    for valid in (RIGHT, LEFT):
        spec = _spec(valid, window=9)
        for x, y in zip(jax.tree.leaves(fused(spec)), jax.tree.leaves(dense(spec))):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)


def test_what_it_cannot_express_runs_blockwise_with_a_warning():
    q = jnp.ones((1, 8, 2, 8), jnp.float32)
    spec = MaskSpec(jnp.arange(8)[None], jnp.arange(8)[None], jnp.ones((1, 8), bool))
    with pytest.warns(UserWarning, match="soft-capping"):
        out = cudnn_attention(q, q, q, spec, scale=0.3, softcap=5.0, implementation="xla")
    np.testing.assert_allclose(np.asarray(out), np.ones((1, 8, 2, 8)), atol=1e-6)


def test_splash_in_the_interpreter_equals_dense():
    t = 150  # padded to 256 inside
    rng = np.random.default_rng(1)
    q, d_out = (jnp.asarray(rng.normal(size=(2, t, 4, 8)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(2, t, 2, 8)), jnp.float32) for _ in range(2))
    slots = jnp.broadcast_to(jnp.arange(t), (2, t))
    pos = np.arange(t)
    # Row 0: left padding (queries that see no key) and two packed documents; row 1: right
    # padding. Then the same with row 0's documents interleaved (not runs: blockwise).
    valid = jnp.asarray((pos[None] >= np.array([[5], [0]])) & (pos[None] < np.array([[t], [140]])))
    runs = np.stack([np.where(pos < 60, 1, 2), np.ones(t, int)])
    mixed = np.stack([np.where((pos < 60) | (pos > 100), 1, 2), np.ones(t, int)])
    specs = [MaskSpec(slots, slots, valid, 9, jnp.asarray(seg), jnp.asarray(seg))
             for seg in (runs, mixed)]
    assert bool(splash_expressible(specs[0])) and not bool(splash_expressible(specs[1]))

    def run(fn, spec):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v, spec) * d_out)  # noqa: E731
        return fn(q, k, v, spec), jax.grad(loss, (0, 1, 2))(q, k, v)

    fused = jax.jit(lambda spec: run(lambda q, k, v, spec: splash_attention(
        q, k, v, spec, scale=0.7, softcap=2.0, block=32), spec))
    dense = jax.jit(lambda spec: run(lambda q, k, v, spec: dense_attention(
        q, k, v, spec.build(), scale=0.7, softcap=2.0)[0], spec))
    for spec in specs:
        for x, y in zip(jax.tree.leaves(fused(spec)), jax.tree.leaves(dense(spec))):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)


def test_splash_falls_back_for_branches():
    q = jnp.ones((1, 8, 2, 8), jnp.float32)
    idx, ones = jnp.arange(8)[None], jnp.ones((1, 8), bool)
    zeros = jnp.zeros((1, 8), jnp.int32)
    spec = MaskSpec(idx, idx, ones, None, None, None, zeros, zeros)
    with pytest.warns(UserWarning, match="branches"):
        out = splash_attention(q, q, q, spec, scale=0.3)
    np.testing.assert_allclose(np.asarray(out), np.ones((1, 8, 2, 8)), atol=1e-6)
