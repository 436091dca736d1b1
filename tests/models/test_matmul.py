"""hone.models.matmul: float32 is a plain dot; bfloat16 inputs give float32-accumulated products
in the forward pass and in both backward products."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hone.models.matmul import low_rank, matmul

BF16 = jnp.bfloat16


def _inputs(m=96, k=320, n=48):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, m // 2, k)), BF16)  # leading axes are kept
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16)
    g = jnp.asarray(rng.standard_normal((2, m // 2, n)), BF16)
    return x, w, g


def test_float32_is_a_plain_dot():
    x, w, _ = _inputs()
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(matmul(x, w)), np.asarray(jnp.dot(x, w)))


def test_bf16_products_accumulate_in_float32():
    """Each product equals the float64 product of the same bfloat16 numbers rounded once to
    the output dtype: at most half a bfloat16 ulp (2^-8 relative: 8 significant bits) plus
    float32 summation error. A sum accumulated in bfloat16 over k = 320 terms would be off by
    many ulps."""
    x, w, g = _inputs()
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    y, vjp = jax.vjp(matmul, x, w)
    dx, dw = vjp(g)
    assert y.dtype == dx.dtype == dw.dtype == BF16
    want = {"y": x64 @ w64, "dx": g64 @ w64.T,
            "dw": np.einsum("bmk,bmn->kn", x64, g64)}
    for name, got in (("y", y), ("dx", dx), ("dw", dw)):
        got, ref = np.asarray(got, np.float64), want[name]
        err = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-3 * np.abs(ref).max())
        assert err.max() <= 2.0 ** -8 + 1e-6, (name, err.max())


def test_float32_output_for_logits():
    x, w, _ = _inputs()
    y = matmul(x, w, out_dtype=jnp.float32)
    assert y.dtype == jnp.float32
    ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
    dx, dw = jax.grad(lambda a, b: jnp.sum(matmul(a, b, out_dtype=jnp.float32)), (0, 1))(x, w)
    assert dx.dtype == dw.dtype == BF16


def test_low_rank_value_and_gradients_match_autodiff_of_the_plain_products():
    """`low_rank` (LoRA's update) writes its backward pass out; float32 values and all three
    gradients equal float64 products of the same numbers, and bfloat16 ones stay within what
    one rounding of the [M, r] intermediate and the outputs allows."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 40, 96))  # leading axes are kept
    a = rng.standard_normal((96, 8)) / np.sqrt(96)
    b = rng.standard_normal((8, 56)) / np.sqrt(8)
    g = rng.standard_normal((3, 40, 56))
    scale = 2.0
    h = np.einsum("bmi,ir->bmr", x, a) * scale
    dh = np.einsum("bmo,ro->bmr", g, b) * scale
    want = {"y": h @ b, "dx": np.einsum("bmr,ir->bmi", dh, a),
            "da": np.einsum("bmi,bmr->ir", x, dh), "db": np.einsum("bmr,bmo->ro", h, g)}
    for dtype, tol in ((jnp.float32, 1e-5), (BF16, 3e-2)):
        args = [jnp.asarray(v, dtype) for v in (x, a, b)]
        @jax.jit  # as in a train step: XLA:CPU picks other kernels than op-by-op dispatch
        def value_and_grads(x, a, b, g):
            y, vjp = jax.vjp(lambda x, a, b: low_rank(x, a, b, scale), x, a, b)
            return (y, *vjp(g))

        y, dx, da, db = value_and_grads(*args, jnp.asarray(g, dtype))
        got = {"y": y, "dx": dx, "da": da, "db": db}
        for k, v in got.items():
            assert v.dtype == dtype, k
            err = np.abs(np.asarray(v, np.float64) - want[k]).max() / np.abs(want[k]).max()
            assert err <= tol, (dtype, k, err)


def test_float32_gradients_equal_the_float64_products():
    """The float32 backward pass is written out (module doc); both gradients match float64."""
    x, w, g = (a.astype(jnp.float32) for a in _inputs())
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    y, vjp = jax.vjp(matmul, x, w)
    dx, dw = vjp(g)
    want = {"dx": g64 @ w64.T, "dw": np.einsum("bmk,bmn->kn", x64, g64)}
    for k, v in {"dx": dx, "dw": dw}.items():
        assert v.dtype == jnp.float32 and v.shape == want[k].shape, k
        err = np.abs(np.asarray(v, np.float64) - want[k]).max() / np.abs(want[k]).max()
        assert err <= 1e-6, (k, err)
