"""Blockwise attention against dense attention (`dense_attention`, the code `Attention.attend`
runs): outputs and gradients w.r.t. q, k and v at 1e-5 absolute on O(1) values in float32, for
every mask the models build (causal, left and right padding, packed segments, shared-prefix
branches with explicit positions, sliding windows), soft-capping, GQA ratios 1, 2 and 8, queries
of a chunk against longer keys, and bfloat16 inputs; lengths are never multiples of the block.
Every row dense defines is compared, padding rows too (a query that sees no key averages all the
values in both). Then the skipped block pairs by hand, the path choice, and the tiny transformer
with blockwise attention (several blocks, remat) against the dense one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.models.attention import attention_path, dense_attention
from hone.models.blockwise import blockwise_attention, visible_blocks
from hone.models.config import preset
from hone.models.masks import MaskSpec
from hone.models.transformer import Transformer

BLOCK = 16


def _mixed_spec(t: int, window: int | None = None) -> MaskSpec:
    """Four rows, one mask kind each, under one spec (so one compile covers them all): left
    padding, right padding, packed documents with a pad segment, and a shared prefix with two
    branches (explicit positions that restart where the prefix ends) and padding."""
    slots = np.arange(t)
    index = np.tile(slots, (4, 1))
    valid = np.ones((4, t), bool)
    segment = np.ones((4, t), np.int32)
    branch = np.zeros((4, t), np.int32)
    valid[0, :t // 7] = False  # left padding: its queries see no key at all
    valid[1, t - t // 5:] = False  # right padding: its queries still see the row
    a, b, c = t // 3, t // 3 + t // 4, t - t // 9  # packed: [1 ... | 2 ... | 3 ... | pad 0]
    segment[2] = np.select([slots < a, slots < b, slots < c], [1, 2, 3], 0)
    valid[2, c:] = False
    p, q1 = t // 4, t // 4 + t // 3  # prefix [0, p), branch 1 [p, q1), branch 2 [q1, t - 3)
    branch[3] = np.select([slots < p, slots < q1, slots < t - 3], [0, 1, 2], 3)
    index[3] = np.select([slots < q1, slots < t - 3], [slots, slots - q1 + p], 0)
    valid[3, t - 3:] = False
    j = lambda x: jnp.asarray(x)  # noqa: E731
    return MaskSpec(j(index), j(index), j(valid), window, j(segment), j(segment), j(branch),
                    j(branch))


def _qkv(b, t, s, n, kv, h, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((b, t, n, h), (b, s, kv, h), (b, s, kv, h), (b, t, n, h))
    return [jnp.asarray(rng.normal(size=shape), jnp.float32).astype(dtype) for shape in shapes]


def _out_and_grads(fn, q, k, v, d_out):
    """fn(q, k, v) [B, T, N, H] and the gradients of <fn(q, k, v), d_out> w.r.t. q, k, v."""
    loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * d_out)  # noqa: E731
    return jax.jit(lambda q, k, v: (fn(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)))(q, k, v)


def _check(spec, q, k, v, d_out, *, scale, softcap=None, atol=1e-5, steps=None):
    """Blockwise against dense: output and gradients within atol, or (bf16) within `steps` bf16
    steps (2^-8 each, relative) of each array's largest magnitude."""
    dense = lambda q, k, v: dense_attention(q, k, v, spec.build(), scale=scale,  # noqa: E731
                                            softcap=softcap)[0]
    blocks = lambda q, k, v: blockwise_attention(q, k, v, spec, scale=scale,  # noqa: E731
                                                 softcap=softcap, block_q=BLOCK, block_k=BLOCK)
    want, want_grads = _out_and_grads(dense, q, k, v, d_out)
    got, got_grads = _out_and_grads(blocks, q, k, v, d_out)
    assert got.dtype == want.dtype and got.shape == want.shape
    for name, x, y in zip(("out", "dq", "dk", "dv"), (got, *got_grads), (want, *want_grads)):
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
        tol = atol if steps is None else steps * 2.0 ** -8 * float(jnp.max(jnp.abs(y)))
        err = float(jnp.max(jnp.abs(x - y)))
        assert err <= tol, f"{name}: max abs error {err:.2e} > {tol:.2e}"


def test_every_mask_kind_gqa_2():
    t = 37
    q, k, v, d_out = _qkv(4, t, t, 4, 2, 8)
    _check(_mixed_spec(t), q, k, v, d_out, scale=8 ** -0.5)


def test_sliding_window_with_softcap_gqa_8():
    """Gemma 2/3 style: a window much shorter than the row, scores soft-capped (a small cap and a
    large scale, so the cap bends the scores and its derivative matters)."""
    t = 70
    q, k, v, d_out = _qkv(4, t, t, 8, 1, 8, seed=1)
    _check(_mixed_spec(t, window=9), q, k, v, d_out, scale=0.7, softcap=2.0)


def test_a_chunk_of_queries_against_longer_keys_gqa_1():
    """Prefill of a chunk: 20 queries at slots 30..49 against 50 cache slots (the first left
    padding in row 0), as the sampler would call it."""
    q, k, v, d_out = _qkv(2, 20, 50, 2, 2, 8, seed=2)
    q_index = jnp.broadcast_to(30 + jnp.arange(20), (2, 20))
    k_index = jnp.broadcast_to(jnp.arange(50), (2, 50))
    k_valid = jnp.arange(50)[None, :] >= jnp.array([[3], [0]])
    _check(MaskSpec(q_index, k_index, k_valid, 24), q, k, v, d_out, scale=8 ** -0.5)


def test_a_query_block_that_sees_nothing_in_any_row():
    """Long left padding in every row: the first query block visits no key block at all and
    still gives dense's uniform average (and its gradient into v)."""
    t = 40
    q, k, v, d_out = _qkv(2, t, t, 2, 1, 8, seed=4)
    slots = jnp.broadcast_to(jnp.arange(t), (2, t))
    valid = jnp.arange(t)[None, :] >= jnp.array([[20], [18]])
    _check(MaskSpec(slots, slots, valid), q, k, v, d_out, scale=8 ** -0.5)


def test_bfloat16_against_dense_bfloat16():
    """bf16 q/k/v: both paths score and softmax in float32 and cast the probabilities to bf16
    for the product with the values, but sum in different orders and round at different
    places; outputs and gradients (bf16) agree within 4 bf16 steps of their largest magnitude
    (measured: at most 2; each path is about as far from the float32 result)."""
    t = 37
    q, k, v, d_out = _qkv(4, t, t, 4, 2, 8, dtype=jnp.bfloat16, seed=3)
    _check(_mixed_spec(t), q, k, v, d_out.astype(jnp.float32), scale=8 ** -0.5, steps=4)


def test_only_visible_block_pairs_are_visited():
    """Pairs a query block cannot see are skipped: causal rows the upper triangle, a window all
    but a band, packed documents all but their own blocks, padding its key blocks."""
    t = 64  # 4 x 4 blocks of 16
    slots = jnp.broadcast_to(jnp.arange(t), (1, t))
    ones = jnp.ones((1, t), bool)
    causal = np.tril(np.ones((4, 4), bool))
    assert (np.asarray(visible_blocks(MaskSpec(slots, slots, ones), BLOCK, BLOCK))
            == causal).all()
    # Window 16: query block i sees key blocks i - 1 and i only (query 16i sees key 16i - 15).
    band = causal & ~np.tril(np.ones((4, 4), bool), -2)
    assert (np.asarray(visible_blocks(MaskSpec(slots, slots, ones, 16), BLOCK, BLOCK))
            == band).all()
    # Two packed documents of 32 tokens: block-diagonal halves of the triangle.
    seg = jnp.asarray(np.repeat([[1, 2]], 32, axis=1))
    packed = causal & np.kron(np.eye(2, dtype=bool), np.ones((2, 2), bool))
    got = visible_blocks(MaskSpec(slots, slots, ones, None, seg, seg), BLOCK, BLOCK)
    assert (np.asarray(got) == packed).all()
    # 20 tokens of left padding: key block 0 holds none of the row's keys.
    left = jnp.arange(t)[None, :] >= 20
    got = np.asarray(visible_blocks(MaskSpec(slots, slots, left), BLOCK, BLOCK))
    assert (got == causal & np.array([False, True, True, True])).all()
    # Over a batch a pair is visited when any row needs it.
    two = MaskSpec(jnp.concatenate([slots, slots]), jnp.concatenate([slots, slots]),
                   jnp.concatenate([left, ones]))
    assert (np.asarray(visible_blocks(two, BLOCK, BLOCK)) == causal).all()


def test_attention_path():
    assert attention_path("auto", 512, 512, 512) == "dense"  # one block: dense
    assert attention_path("auto", 512, 513, 512) == "blockwise"  # on CPU
    assert attention_path("dense", 4096, 4096, 512) == "dense"
    assert attention_path("blockwise", 8, 8, 512) == "blockwise"
    assert attention_path("cudnn", 8, 8, 512) == "cudnn"  # each falls back by itself
    assert attention_path("splash", 8, 8, 512) == "splash"
    with pytest.raises(ValueError, match="flash"):
        attention_path("flash", 8, 8, 512)


def test_tiny_transformer_blockwise_equals_dense():
    """Logits and parameter gradients of the tiny model (a sliding layer and a global one, left
    and right padding) with blockwise attention over blocks of 16, under full remat, against
    dense attention without remat."""
    cfg = dataclasses.replace(preset("tiny"), sliding_window=11,
                              layer_types=("sliding", "global"))
    dense, blocks = (Transformer(cfg, rngs=nnx.Rngs(0)) for _ in range(2))
    blocks.attention, blocks.attention_block, blocks.remat = "blockwise", BLOCK, "full"
    rng = np.random.default_rng(4)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, 45)), jnp.int32)
    mask = jnp.asarray(np.arange(45)[None, :] >= np.array([[6], [0]]))
    mask = mask & jnp.asarray(np.arange(45)[None, :] < np.array([[45], [38]]))
    weights = jnp.asarray(rng.normal(size=(2, 45, cfg.vocab_size)), jnp.float32)

    @nnx.jit
    def run(model):
        def loss(model):
            logits = model(tokens, attention_mask=mask)
            return jnp.sum(logits * weights) / logits.size, logits
        return nnx.grad(loss, has_aux=True)(model)

    (want_grads, want), (got_grads, got) = run(dense), run(blocks)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
    flat_want, flat_got = jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)
    assert len(flat_got) == len(flat_want)
    for x, y in zip(flat_got, flat_want):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-5)
