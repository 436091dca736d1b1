"""hone/kernels/ragged_paged.py: the Pallas ragged paged-attention kernel, run in Pallas's TPU
interpreter on the CPU, against ragged_reference (a dense gather of each row's pages).

The interpreter fills uninitialised VMEM with NaN, so a stale page-buffer slot that leaked into a
sum would show as NaN. Slots that no query may read (pages no row uses, slots past a row's
kv_len, pages wholly before its window) are NaN in the kernel's pools and zero in the
reference's; the interpreter also raises on a copy from outside the pool, which
test_unread_pages_never_touched uses to show that unneeded pages are never copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hone.kernels.ragged_paged import ragged_paged_attention, ragged_reference

TOL = 1e-5  # float32 pools: max |diff| over max |reference|; sums in another order
TOL_BF16 = 2e-2  # bfloat16 pools: the kernel's products take bfloat16 q and weights


def _case(*, R, T, N, K, H, page, n, kv_len, q_pos, dtype=jnp.float32, seed=0, window=None):
    """Pools with each row's pages shuffled through the pool; every slot no query may read
    (spare pages, slots past kv_len, pages wholly before the window) is NaN in `dirty`."""
    rng = np.random.default_rng(seed)
    P = R * n + 3  # three pages no row uses
    table = rng.permutation(P)[:R * n].reshape(R, n)
    k = rng.standard_normal((K, P, page, H))
    v = rng.standard_normal((K, P, page, H))
    readable = np.zeros((P, page), bool)  # slots of needed pages
    for r in range(R):
        hi = -(-kv_len[r] // page)
        first = min([p for p in q_pos[r] if p >= 0], default=0)
        lo = 0 if window is None else max(first - window + 1, 0) // page
        for j in range(lo, hi):
            readable[table[r, j]] = np.arange(j * page, (j + 1) * page) < kv_len[r]
    dirty_k, dirty_v = (np.where(readable[None, :, :, None], x, np.nan) for x in (k, v))
    q = rng.standard_normal((R, T, N, H)) * 2.0
    arrays = dict(q=jnp.asarray(q, jnp.float32), table=jnp.asarray(table, jnp.int32),
                  q_pos=jnp.asarray(q_pos, jnp.int32), kv_len=jnp.asarray(kv_len, jnp.int32))
    clean = tuple(jnp.asarray(np.nan_to_num(x), dtype) for x in (dirty_k, dirty_v))
    dirty = tuple(jnp.asarray(x, dtype) for x in (dirty_k, dirty_v))
    return arrays, clean, dirty


def _check(arrays, clean, dirty, tol=TOL, **kw):
    """Run the kernel on the NaN-dirty pools, the reference on the clean ones; return both."""
    a = arrays
    scale = a["q"].shape[-1] ** -0.5
    got = ragged_paged_attention(a["q"], *dirty, a["table"], a["q_pos"], a["kv_len"],
                                 scale=scale, impl="tpu-interpret", **kw)
    kw.pop("pages_per_block", None)
    with jax.default_matmul_precision("highest"):
        want = ragged_reference(a["q"], *clean, a["table"], a["q_pos"], a["kv_len"],
                                scale=scale, **kw)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.float32 and got.shape == a["q"].shape
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tol, err
    return got, want


def _prefill_positions(kv_len, T, pad_tail=0):
    """Each row's last T slots as its query block (a row shorter than T: padding -1 first),
    the last pad_tail tokens of row 0 turned into padding too."""
    pos = np.array([[L - T + t if L - T + t >= 0 else -1 for t in range(T)] for L in kv_len])
    if pad_tail:
        pos[0, -pad_tail:] = -1
    return pos


@pytest.mark.parametrize("H", [64, 128])
def test_decode_rows_of_different_lengths(H):
    kv_len = [13, 0, 40, 1]  # row 1 is padding: kv_len 0
    q_pos = np.array([[12], [0], [39], [0]])
    arrays, clean, dirty = _case(R=4, T=1, N=4, K=2, H=H, page=8, n=6, kv_len=kv_len,
                                 q_pos=q_pos, seed=H)
    got, _ = _check(arrays, clean, dirty)
    assert (got[1] == 0).all()


@pytest.mark.parametrize("H", [64, 128])
def test_prefill_block_several_pages_per_step(H):
    kv_len = [40, 0, 21]
    arrays, clean, dirty = _case(R=3, T=16, N=4, K=2, H=H, page=8, n=6, kv_len=kv_len,
                                 q_pos=_prefill_positions(kv_len, 16, pad_tail=3), seed=1)
    got, want = _check(arrays, clean, dirty, pages_per_block=2)
    assert (got[1] == 0).all() and (got[0, -3:] == 0).all()  # padding row, padding tokens


def test_sliding_window_and_softcap():
    kv_len = [48, 30, 5]
    window = 12  # row 0's pages 0..1 lie wholly before its first query's window: NaN there
    arrays, clean, dirty = _case(R=3, T=16, N=4, K=1, H=64, page=8, n=6, kv_len=kv_len,
                                 q_pos=_prefill_positions(kv_len, 16), seed=2, window=window)
    _check(arrays, clean, dirty, window=window, softcap=3.0, pages_per_block=2)
    # T=1 decode with a window: only the last page or two are read
    q_pos = np.array([[47], [29], [4]])
    arrays, clean, dirty = _case(R=3, T=1, N=4, K=2, H=128, page=8, n=6, kv_len=kv_len,
                                 q_pos=q_pos, seed=3, window=window)
    _check(arrays, clean, dirty, window=window, softcap=30.0, pages_per_block=1)


@pytest.mark.parametrize("page", [16, 8])  # 8: a bfloat16 page narrower than a tile
def test_bfloat16_pools(page):
    kv_len = [50, 17, 0]
    arrays, clean, dirty = _case(R=3, T=16, N=4, K=2, H=128, page=page, n=64 // page,
                                 kv_len=kv_len, q_pos=_prefill_positions(kv_len, 16),
                                 dtype=jnp.bfloat16, seed=4)
    got, _ = _check(arrays, clean, dirty, tol=TOL_BF16, pages_per_block=2)
    assert (got[2] == 0).all()


def test_unread_pages_never_touched():
    """NaN everywhere a query may not look (pages no row uses, the tails of last pages), and
    table entries past a row's needed pages (and, with a window, wholly before it) pointing
    outside the pool: the interpreter raises on any copy from such an entry, so this passes
    only if the kernel copies no page it does not need. The reference reads the valid table."""
    kv_len, window = [9, 30], 10
    q_pos = np.array([[8], [29]])
    arrays, clean, dirty = _case(R=2, T=1, N=2, K=2, H=64, page=8, n=5, kv_len=kv_len,
                                 q_pos=q_pos, seed=5)
    for w, ppb in ((None, 3), (window, 1)):
        outside = np.array(arrays["table"])
        pool_pages = dirty[0].shape[1]
        outside[0, 2:] = pool_pages + 100  # row 0 needs pages 0..1
        outside[1, 4:] = pool_pages + 100  # row 1 needs pages 0..3 (2..3 with the window)
        if w is not None:
            outside[1, :2] = pool_pages + 100
        got = ragged_paged_attention(arrays["q"], *dirty, jnp.asarray(outside),
                                     arrays["q_pos"], arrays["kv_len"], scale=0.125, window=w,
                                     impl="tpu-interpret", pages_per_block=ppb)
        want = ragged_reference(arrays["q"], *clean, arrays["table"], arrays["q_pos"],
                                arrays["kv_len"], scale=0.125, window=w)
        assert np.isfinite(np.asarray(got)).all()
        assert np.abs(got - want).max() / np.abs(want).max() <= TOL


def test_unknown_impl():
    q = jnp.zeros((1, 1, 2, 64))
    pool = jnp.zeros((1, 2, 8, 64))
    with pytest.raises(ValueError, match="unknown"):
        ragged_paged_attention(q, pool, pool, jnp.zeros((1, 2), jnp.int32),
                               jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32),
                               scale=1.0, impl="gpu")


@pytest.mark.parametrize("window, softcap", [(None, None), (11, 5.0)])
def test_xla_loop_over_pages_equals_the_reference(window, softcap):
    """hone/kernels/paged_xla.py, the engine's prefill path off the kernel's route: the same
    attention over rows of different lengths (real queries; padding queries' outputs are
    ignored there), pages wholly before every window skipped."""
    from hone.kernels.paged_xla import ragged_attention
    q_pos = [[20, 21, 22, 23], [3, 4, -1, -1], [37, 38, 39, 40]]
    kv_len = [24, 5, 41]
    arrays, clean, _ = _case(R=3, T=4, N=4, K=2, H=16, page=8, n=6, kv_len=kv_len, q_pos=q_pos,
                             window=window)
    a = arrays
    with jax.default_matmul_precision("highest"):
        got = ragged_attention(a["q"], *clean, a["table"], a["q_pos"], scale=0.25,
                               softcap=softcap, window=window)
        want = ragged_reference(a["q"], *clean, a["table"], a["q_pos"], a["kv_len"],
                                scale=0.25, softcap=softcap, window=window)
    real = np.asarray(q_pos) >= 0
    got, want = np.asarray(got)[real], np.asarray(want)[real]
    assert np.max(np.abs(got - want)) <= TOL * np.max(np.abs(want))
