"""hone/kernels: the CPU decode product. Its sums are XLA's float32 sums in another order, so it
is held to a float64 reference at float32 rounding (relative to the largest output), and to the
packed layout's shape rules; a bad build reports why instead of failing later."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hone.kernels import compiler as build, packed

REL = 2e-6  # of max |y|: float32 sums of <= 600 terms of unit size; XLA's dot lands within 1e-6


def _case(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    w = jnp.asarray(rng.standard_normal((k, n)), dtype)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    return x, w, want


def _close(got, want):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL * np.abs(want).max()


def test_kernel_builds_here():
    """CI's machine has a C++ compiler and an x86-64 CPU with AVX2: the kernel must load there,
    or every other test below would only test the fallback."""
    assert build.library() is not None
    assert build.panel_width() in (24, 48)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 32])
@pytest.mark.parametrize("k,n", [(64, 97), (576, 192), (37, 1000), (160, 24)])
def test_float32_product_against_float64(m, k, n):
    x, w, want = _case(m, k, n, jnp.float32)
    got = jax.jit(lambda x, p: packed.matmul(x, p, n))(x, packed.pack(w))
    assert got.dtype == jnp.float32
    _close(got, want)


@pytest.mark.parametrize("m,k,n", [(1, 64, 97), (8, 576, 1536), (11, 100, 50)])
def test_bfloat16_product_accumulates_in_float32(m, k, n):
    """bfloat16 x and weights: each product of two bfloat16 numbers is exact in float32 and the
    sums are float32, so the result matches float64 on the same bfloat16 values."""
    x, w, want = _case(m, k, n, jnp.bfloat16)
    got = packed.matmul(x, packed.pack(w), n)
    assert got.dtype == jnp.float32
    _close(got, want)


def test_large_matrix_across_threads():
    """A matrix big enough to be shared out to the thread pool (the LM head's shape, fewer
    columns) gives the same numbers as on one thread would: every column is checked."""
    x, w, want = _case(8, 576, 24 * 700 + 5, jnp.float32, seed=3)
    _close(packed.matmul(x, packed.pack(w), w.shape[1]), want)


def test_leading_axes_are_kept():
    x, w, want = _case(6, 64, 40, jnp.float32)
    got = packed.matmul(x.reshape(2, 3, 64), packed.pack(w), 40)
    _close(got.reshape(6, 40), want)


def test_pack_layout():
    """Panel p holds columns p*BW .. p*BW+BW-1 of every row, zero columns pad the last."""
    bw = build.panel_width()
    w = jnp.arange(5 * (bw + 3), dtype=jnp.float32).reshape(5, bw + 3)
    p = np.asarray(packed.pack(w))
    assert p.shape == (2, 5, bw)
    np.testing.assert_array_equal(p[0], np.asarray(w)[:, :bw])
    np.testing.assert_array_equal(p[1, :, :3], np.asarray(w)[:, bw:])
    assert not p[1, :, 3:].any()


def _act(g, activation):
    if activation == "silu":
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m,k,f", [(1, 64, 97), (8, 576, 1536), (13, 40, 24), (32, 96, 50)])
def test_gated_pair_against_float64(activation, m, k, f):
    """act(x @ gate) * (x @ up) in one call, gate and up packed in pairs of panels."""
    rng = np.random.default_rng(m + f)
    x = jnp.asarray(rng.standard_normal((m, k)) / np.sqrt(k) * 3.0, jnp.float32)
    gate, up = (jnp.asarray(rng.standard_normal((k, f)), jnp.float32) for _ in range(2))
    xd, gd, ud = (np.asarray(a, np.float64) for a in (x, gate, up))
    want = _act(xd @ gd, activation) * (xd @ ud)
    got = jax.jit(lambda x, p: packed.gated(x, p, f, activation))(x, packed.pack_pair(gate, up))
    assert got.dtype == jnp.float32
    _close(got, want)


def test_gated_bfloat16_weights():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((4, 64)) / 8.0, jnp.bfloat16)
    gate, up = (jnp.asarray(rng.standard_normal((64, 100)), jnp.bfloat16) for _ in range(2))
    xd, gd, ud = (np.asarray(a, np.float64) for a in (x, gate, up))
    _close(packed.gated(x, packed.pack_pair(gate, up), 100, "silu"),
           _act(xd @ gd, "silu") * (xd @ ud))


def test_mismatched_panels_are_an_error():
    x, w, _ = _case(2, 64, 48, jnp.float32)
    with pytest.raises(Exception, match="hone_packed_matmul: w must be packed as"):
        jax.block_until_ready(packed.matmul(x[:, :32], packed.pack(w), 48))
    with pytest.raises(Exception, match="y's shape does not match"):
        jax.block_until_ready(packed.matmul(x, packed.pack(w), 48 + build.panel_width()))


def test_failed_build_says_why(tmp_path, monkeypatch):
    bad = tmp_path / "packed_matmul.cc"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(build, "SOURCES", [bad])
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(build.Unavailable, match="compiling hone's kernels failed(.|\n)*not C"):
        build.build()
    assert not list((tmp_path / "cache" / "kernels").glob("*.so*"))  # no half-written build


def test_build_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("HONE_CACHE", str(tmp_path))
    first = build.build()
    stamp = first.stat().st_mtime_ns
    assert build.build() == first and first.stat().st_mtime_ns == stamp
