"""`Attention.attend_step`, the decode step's attention over a kv-head-major cache read in
blocks with a running softmax, against `Attention.attend` (the training forward's attention) on
the same keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.models.attention import Attention, make_mask
from hone.models.config import ModelConfig

TOL = 1e-5  # fixed; never loosened


def _case(softcap, seed=0, b=4, s=27, at=26):
    cfg = ModelConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_layers=1,
                      num_heads=6, num_kv_heads=2, head_dim=8, attn_logit_softcap=softcap)
    attn = Attention(cfg, jnp.float32, nnx.Rngs(seed))
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, 1, 6, 8)) * 2.0
    k = jax.random.normal(ks[1], (b, s, 2, 8)) * 2.0
    v = jax.random.normal(ks[2], (b, s, 2, 8))
    # Row 0 sees every slot; row 1's first 20 slots are left padding (whole blocks of 8 that
    # hold nothing); row 2 sees a sliding window of 5; row 3 sees nothing (batch padding).
    valid = np.ones((b, s), bool)
    valid[1, :20] = False
    valid[3] = False
    q_index = jnp.full((b, 1), at, jnp.int32)  # the query's slot
    k_index = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    mask = make_mask(q_index, k_index, jnp.asarray(valid), None)
    mask = mask.at[2].set(make_mask(q_index, k_index, jnp.asarray(valid), 5)[2])
    return attn, q, k, v, mask


@pytest.mark.parametrize("softcap", [None, 7.0])
@pytest.mark.parametrize("block", [4, 8, 27, 64])
def test_blocks_equal_one_softmax(softcap, block):
    attn, q, k, v, mask = _case(softcap)
    want = attn.attend(q, k, v, mask)
    heads_first = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731
    got = attn.attend_step(q, heads_first(k), heads_first(v), mask, block=block)
    assert np.abs(np.asarray(got[:3] - want[:3])).max() <= TOL
    assert np.isfinite(np.asarray(got)).all()  # the row that sees nothing stays finite


@pytest.mark.parametrize("block", [4, 8])
def test_slots_past_used_are_not_read(block):
    # Slots at and after `used` hold garbage: the blocks past it are never read and the partial
    # block gives them zero weight, so the output is that of the first `used` slots.
    used = 22
    attn, q, k, v, mask = _case(None, seed=1, at=used - 1)
    poison = lambda a: a.at[:, used:].set(1e4).transpose(0, 2, 1, 3)  # noqa: E731
    want = attn.attend(q, k[:, :used], v[:, :used], mask[:, :, :used])
    got = attn.attend_step(q, poison(k), poison(v), mask, jnp.int32(used), block=block)
    assert np.abs(np.asarray(got[:3] - want[:3])).max() <= TOL
