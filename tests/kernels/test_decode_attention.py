"""hone/kernels: the decode step's attention kernel against a float64 softmax attention, and
against `Attention.attend_step`'s XLA operations on the same cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.kernels.decode_attention import decode_attention, paged_decode_attention
from hone.models.attention import Attention, make_mask
from hone.models.config import ModelConfig

TOL = 1e-5  # of max |v|: float32 sums of <= 200 terms in another order; fixed, never loosened


def _reference(q, k, v, mask, used, scale, softcap):
    """float64 attention of q [B, N, H] over the first `used` slots of k/v [B, K, S, H]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, n, h = q.shape
    kv = k.shape[1]
    qg = q.reshape(b, kv, n // kv, h)
    scores = np.einsum("bkgh,bksh->bkgs", qg, k[:, :, :used]) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    keep = np.asarray(mask)[:, None, None, :used]
    scores = np.where(keep, scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgs,bksh->bkgh", p, v[:, :, :used]).reshape(b, n, h)


def _case(b, n, kv, s, h, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, n, h)) * 2.0
    k = rng.standard_normal((b, kv, s, h))
    v = rng.standard_normal((b, kv, s, h))
    mask = rng.random((b, s)) < 0.8
    mask[:, 0] = True  # every row sees a key
    k, v = jnp.asarray(k, dtype), jnp.asarray(v, dtype)
    return jnp.asarray(q, jnp.float32), k, v, jnp.asarray(mask)


@pytest.mark.parametrize("b,n,kv,s,h", [
    (1, 1, 1, 1, 8),     # one slot
    (3, 6, 2, 21, 64),   # SmolLM2's head size, G = 3
    (2, 4, 4, 40, 12),   # head size not a whole vector: the scalar tail
    (2, 8, 2, 17, 40),   # whole vectors, not a whole group of four
    (2, 2, 1, 9, 256),   # Gemma's head size
])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_float32_cache_against_float64(b, n, kv, s, h, softcap):
    q, k, v, mask = _case(b, n, kv, s, h)
    scale = h ** -0.5
    got = decode_attention(q, k, v, mask, jnp.int32(s), scale, softcap)
    want = _reference(q, k, v, mask, s, scale, softcap)
    assert got.dtype == jnp.float32 and got.shape == (b, n, h)
    assert np.abs(np.asarray(got, np.float64) - want).max() <= TOL


def test_bfloat16_cache_is_widened_exactly():
    """bfloat16 keys and values are widened to float32 in registers: the result is the float64
    attention of the same bfloat16 numbers."""
    q, k, v, mask = _case(4, 9, 3, 50, 64, dtype=jnp.bfloat16, seed=1)
    got = decode_attention(q, k, v, mask, jnp.int32(50), 0.125, None)
    assert np.abs(np.asarray(got, np.float64) - _reference(q, k, v, mask, 50, 0.125, None)).max() \
        <= TOL


def test_slots_past_used_are_not_read():
    """Slots at and past `used` hold huge numbers and are marked visible: they must not count."""
    q, k, v, mask = _case(2, 4, 2, 30, 16, seed=2)
    k = k.at[:, :, 11:].set(1e30)
    v = v.at[:, :, 11:].set(1e30)
    got = decode_attention(q, k, v, jnp.ones_like(mask), jnp.int32(11), 0.25, None)
    want = _reference(q, k, v, np.ones(mask.shape, bool), 11, 0.25, None)
    assert np.abs(np.asarray(got, np.float64) - want).max() <= TOL


def test_row_that_sees_nothing_is_the_mean_of_its_values():
    """Batch padding: every slot masked. As XLA's softmax over float32's lowest value, the
    weights are equal (finite output, no NaN)."""
    q, k, v, mask = _case(2, 2, 1, 13, 8, seed=3)
    mask = mask.at[1].set(False)
    got = np.asarray(decode_attention(q, k, v, mask, jnp.int32(10), 1.0, None))
    mean = np.asarray(v, np.float64)[1, 0, :10].mean(0)
    assert np.abs(got[1] - mean[None]).max() <= TOL


def test_many_rows_across_threads():
    """Enough work to be shared out to the thread pool: every row and head checked."""
    q, k, v, mask = _case(32, 9, 3, 96, 64, seed=4)
    got = decode_attention(q, k, v, mask, jnp.int32(70), 0.125, None)
    want = _reference(q, k, v, mask, 70, 0.125, None)
    assert np.abs(np.asarray(got, np.float64) - want).max() <= TOL


def test_attend_step_with_and_without_the_kernel():
    """The model's decode attention (masks from make_mask, a sliding window, left padding, the
    output projection) is the same through the kernel and through XLA's operations."""
    cfg = ModelConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_layers=1,
                      num_heads=6, num_kv_heads=2, head_dim=8)
    attn = Attention(cfg, jnp.float32, nnx.Rngs(0))
    b, s = 3, 27
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (b, 1, 6, 8)) * 2.0
    k = jax.random.normal(ks[1], (b, 2, s, 8))
    v = jax.random.normal(ks[2], (b, 2, s, 8))
    valid = np.ones((b, s), bool)
    valid[1, :20] = False
    q_index = jnp.full((b, 1), 22, jnp.int32)
    k_index = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    mask = make_mask(q_index, k_index, jnp.asarray(valid), None)
    mask = mask.at[2].set(make_mask(q_index, k_index, jnp.asarray(valid), 5)[2])
    want = attn.attend_step(q, k, v, mask, jnp.int32(23), block=8)
    got = jax.jit(lambda q, k, v, m: attn.attend_step(q, k, v, m, jnp.int32(23), kernel=True))(
        q, k, v, mask)
    assert np.abs(np.asarray(got - want)).max() <= TOL


def test_bad_shapes_are_an_error():
    q, k, v, mask = _case(2, 4, 2, 10, 8)
    with pytest.raises(Exception, match="hone_decode_attention: k .* does not fit q"):
        jax.block_until_ready(decode_attention(q[:, :3], k, v, mask, jnp.int32(10), 1.0, None))
    with pytest.raises(Exception, match="v must have k's shape"):
        jax.block_until_ready(decode_attention(q, k, v[:, :, :9], mask, jnp.int32(10), 1.0,
                                               None))
    with pytest.raises(Exception, match=r"mask must be \[B, S\]"):
        jax.block_until_ready(decode_attention(q, k, v, mask[:, :9], jnp.int32(10), 1.0, None))


def _paged_case(lengths, page=8, pages=5, kv=2, n=6, h=16, seed=5):
    """Pools [K, P, page, H] holding one row per length in scattered pages, the table, and a
    prefix mask per row; every slot past a row's length holds 1e30 (it must get no weight)."""
    rng = np.random.default_rng(seed)
    b, p = len(lengths), 1 + len(lengths) * pages
    k = np.full((kv, p, page, h), 1e30, np.float32)
    v = np.full((kv, p, page, h), 1e30, np.float32)
    table = 1 + rng.permutation(b * pages).reshape(b, pages).astype(np.int32)
    dense_k = rng.standard_normal((b, kv, pages * page, h)).astype(np.float32)
    dense_v = rng.standard_normal((b, kv, pages * page, h)).astype(np.float32)
    mask = np.zeros((b, pages * page), bool)
    for r, length in enumerate(lengths):
        mask[r, :length] = True
        for s in range(length):
            k[:, table[r, s // page], s % page] = dense_k[r, :, s]
            v[:, table[r, s // page], s % page] = dense_v[r, :, s]
    q = rng.standard_normal((b, n, h)).astype(np.float32) * 2.0
    return q, k, v, table, mask, dense_k, dense_v


def test_paged_rows_read_their_own_length_only():
    """Rows of different lengths in one call: each against float64 over its own slots (the
    slots past its length, up to the batch's `used`, hold 1e30 and get no weight), and each
    bit for bit the same as when it is decoded alone: a row's sums do not depend on how long
    the other rows of its batch are."""
    lengths = [3, 37, 9, 40, 17]
    q, k, v, table, mask, dense_k, dense_v = _paged_case(lengths)
    used = jnp.int32(max(lengths))
    got = np.asarray(paged_decode_attention(q, k, v, table, mask, used, 0.25, None))
    for r, length in enumerate(lengths):
        want = _reference(q[r:r + 1], dense_k[r:r + 1], dense_v[r:r + 1], mask[r:r + 1],
                          length, 0.25, None)
        assert np.abs(got[r:r + 1].astype(np.float64) - want).max() <= TOL
        alone = paged_decode_attention(q[r:r + 1], k, v, table[r:r + 1], mask[r:r + 1],
                                       jnp.int32(length), 0.25, None)
        assert np.array_equal(np.asarray(alone), got[r:r + 1])
    idle = mask.copy()
    idle[2] = False  # an idle slot of the decode batch: finite, never used
    assert np.isfinite(np.asarray(paged_decode_attention(
        q, k, np.zeros_like(v), table, idle, used, 0.25, None))).all()
