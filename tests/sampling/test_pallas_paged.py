"""The accelerator routes of the rollout engine's attention over pages (JAX's Pallas
paged-attention kernels for GPUs and TPUs, hone/kernels/pallas_paged.py), run in Pallas's
interpreter on the CPU: the same attention as a gathered reference by hand, and the same rollouts
as the CPU path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hone
from hone.kernels.pallas_paged import paged_attention
from hone.sampling.scheduler import PagedEngine, Request

ROUTES = ("gpu-interpret", "tpu-interpret")


def reference(q, k_pool, v_pool, table, lengths, scale, softcap):
    """Row b's pages gathered in order, softmax over its first lengths[b] slots, per kv group."""
    b, n, h = q.shape
    kv = k_pool.shape[0]
    out = np.zeros((b, n, h), np.float64)
    for r in range(b):
        keys = np.concatenate([k_pool[:, p] for p in table[r]], axis=1)[:, :lengths[r]]
        values = np.concatenate([v_pool[:, p] for p in table[r]], axis=1)[:, :lengths[r]]
        for head in range(n):
            g = head // (n // kv)
            x = keys[g] @ q[r, head] * scale
            if softcap is not None:
                x = softcap * np.tanh(x / softcap)
            w = np.exp(x - x.max())
            out[r, head] = (w / w.sum()) @ values[g] if lengths[r] else 0.0
    return out


# The TPU kernel reads keys and values as bfloat16: it is tested (and used) on bfloat16 pools.
POOL_DTYPE = {"gpu-interpret": jnp.float32, "tpu-interpret": jnp.bfloat16,
              "ragged-interpret": jnp.float32, "loop": jnp.float32, "dense": jnp.float32}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_kernel_equals_the_gathered_attention(route, softcap):
    rng = np.random.default_rng(0)
    kv, pool, page, h, b, n, width = 2, 11, 8, 32, 3, 4, 4
    dtype = POOL_DTYPE[route]
    k_pool = jnp.asarray(rng.normal(size=(kv, pool, page, h)), dtype)
    v_pool = jnp.asarray(rng.normal(size=(kv, pool, page, h)), dtype)
    q = rng.normal(size=(b, n, h)).astype(np.float32)
    table = np.stack([rng.permutation(np.arange(1, pool))[:width] for _ in range(b)])
    lengths = np.array([1, 13, 32], np.int32)  # one slot, part of a page, every page full
    got = paged_attention(jnp.asarray(q), k_pool, v_pool, jnp.asarray(table, jnp.int32),
                          jnp.asarray(lengths), 0.25, softcap, route)
    k_pool, v_pool = (np.asarray(x, np.float32) for x in (k_pool, v_pool))
    want = reference(q, k_pool, v_pool, table, lengths, 0.25, softcap)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("route", ROUTES + ("ragged-interpret", "loop", "dense"))
def test_rollouts_through_the_kernel_equal_the_cpu_path(route):
    """Sampled (temperature 1), 2 samples per prompt over small pages: the same tokens, and
    log-probabilities within 1e-5, as the CPU route over pools of the same dtype. The ragged
    route (hone/kernels/ragged_paged.py) runs the prefill blocks through its kernel too; "loop"
    and "dense" are XLA's products over the pages (hone/kernels/paged_xla.py)."""
    from test_generate import mixed_prompts  # here: it imports torch, which a TPU machine lacks
    model = hone.load_model("tiny")
    prompts = mixed_prompts(4, seed=1)
    key = jax.random.key(0)

    def run(attention):
        requests = [Request(p, 10, jax.random.fold_in(key, i), n=2)
                    for i, p in enumerate(prompts)]
        eng = PagedEngine(model, max_seqs=4, page_size=8, attention=attention,
                          cache_dtype=POOL_DTYPE[route])
        return [s for row in eng.run(requests, temperature=1.0) for s in row]

    cpu, kernel = run(None), run(route)
    assert [s.tokens for s in cpu] == [s.tokens for s in kernel]
    for a, b in zip(cpu, kernel):
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


def test_the_tpu_kernel_is_taken_only_when_asked_and_for_wide_heads_only(monkeypatch):
    """On a TPU v5e the Pallas TPU kernel measured slower than XLA's loop (head_dim 128), and it
    failed to lower for SmolLM2's 64-wide heads (Mosaic wants its blocks' last dimension a
    multiple of 128): a TPU takes XLA's loop unless asked, and asking with narrow heads is an
    error that says so, before any program is built."""
    from hone.errors import InputError
    from hone.sampling import paged
    assert paged.paged_route() is None  # the tests run on a CPU
    monkeypatch.setattr(paged.jax, "default_backend", lambda: "tpu")
    assert paged.paged_route() is None
    monkeypatch.setattr(paged.jax, "default_backend", lambda: "gpu")
    assert paged.paged_route() == "gpu"
    monkeypatch.undo()
    model = hone.load_model("tiny")  # head_dim 16
    with pytest.raises(InputError, match="head_dim a multiple of 128.*this model's is 16"):
        PagedEngine(model, attention="tpu")
    assert PagedEngine(model, attention="tpu-interpret").attention == "tpu-interpret"
