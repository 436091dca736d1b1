"""model.attention=cudnn's mapping of a mask spec to `jax.nn.dot_product_attention`'s flags,
checked on CPU by running the same call with XLA's implementation against dense attention at
1e-5 (outputs and gradients): right padding and a sliding window take the fused branch, left
padding the blockwise one, in one compiled function; what cannot be expressed falls back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hone.models.attention import dense_attention
from hone.models.fused_attention import cudnn_attention, expressible
from hone.models.masks import MaskSpec

B, T = 3, 40


def _spec(valid, window=None):
    slots = jnp.broadcast_to(jnp.arange(T), (B, T))
    return MaskSpec(slots, slots, jnp.asarray(valid), window)


RIGHT = np.arange(T)[None, :] < np.array([[40], [35], [22]])  # row 2: queries past the window
LEFT = np.arange(T)[None, :] >= np.array([[0], [5], [3]])


def test_what_cudnn_can_express():
    assert bool(expressible(_spec(RIGHT)))
    assert not bool(expressible(_spec(LEFT)))
    assert not bool(expressible(_spec(np.arange(T)[None, :] < np.array([[40], [35], [0]]))))
    shifted = _spec(RIGHT)
    shifted = MaskSpec(shifted.q_index + 1, shifted.k_index + 1, shifted.k_valid)
    assert not bool(expressible(shifted))


def test_the_xla_run_of_the_cudnn_call_equals_dense():
    rng = np.random.default_rng(0)
    q, d_out = (jnp.asarray(rng.normal(size=(B, T, 4, 8)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(B, T, 2, 8)), jnp.float32) for _ in range(2))

    def run(fn, spec):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v, spec) * d_out)  # noqa: E731
        return fn(q, k, v, spec), jax.grad(loss, (0, 1, 2))(q, k, v)

    fused = jax.jit(lambda q, k, v, spec: run(lambda q, k, v, spec: cudnn_attention(
        q, k, v, spec, scale=0.3, block=16, implementation="xla"), spec))
    for valid in (RIGHT, LEFT):
        spec = _spec(valid, window=9)
        want = run(lambda q, k, v, spec: dense_attention(q, k, v, spec.build(), scale=0.3)[0],
                   spec)
        got = fused(q, k, v, spec)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)


def test_what_it_cannot_express_runs_blockwise_with_a_warning():
    q = jnp.ones((1, 8, 2, 8), jnp.float32)
    spec = MaskSpec(jnp.arange(8)[None], jnp.arange(8)[None], jnp.ones((1, 8), bool))
    with pytest.warns(UserWarning, match="soft-capping"):
        out = cudnn_attention(q, q, q, spec, scale=0.3, softcap=5.0, implementation="xla")
    np.testing.assert_allclose(np.asarray(out), np.ones((1, 8, 2, 8)), atol=1e-6)
