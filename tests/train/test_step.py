"""The train step: accumulation equals one large batch; bf16 compute; schedules."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hone
from hone.losses import sft_loss
from hone.train.optimizer import build_optimizer, learning_rate_schedule
from hone.train.state import flatten, new_train_state, split_model
from hone.train.step import make_train_step

TRAIN = SimpleNamespace(lr=1e-2, schedule="cosine", warmup_steps=2, max_steps=10,
                        min_lr_ratio=0.1, max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8,
                        weight_decay=0.01)


def loss_fn(model, mb, normalizer, key, aux=None):
    logits = model(mb["tokens"], attention_mask=mb["attention_mask"])
    return sft_loss(logits, mb["targets"], mb["loss_mask"], normalizer)


def normalizer(batch):
    return jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)


def batch(b=4, t=16, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    mask[1, 10:] = 0
    mask[3, 4:] = 0  # rows with very different token counts: per-micro-batch means would differ
    loss_mask = (mask * (rng.random((b, t)) < 0.7)).astype(np.float32)
    return {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1), "loss_mask": loss_mask,
            "attention_mask": mask}


def one_step(accum, precision="fp32", steps=1):
    model = hone.load_model("tiny")
    graphdef, params, frozen = split_model(model, nnx.Param)
    opt, sched = build_optimizer(TRAIN)
    state = new_train_state(flatten(params), opt, seed=0)
    step = make_train_step(graphdef, params, loss_fn, normalizer, opt, sched, accum=accum,
                           precision=precision)
    for i in range(steps):
        state, metrics = step(state, frozen, batch(seed=i))
    return jax.device_get(state), jax.device_get(metrics)


def test_accumulation_equals_one_large_batch():
    big, m1 = one_step(accum=1)
    acc, m4 = one_step(accum=4)
    assert m1["loss"] == pytest.approx(m4["loss"], rel=1e-6)
    for k in big["params"]:
        a, b = big["params"][k], acc["params"][k]
        assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max(), k


def test_loss_is_the_token_mean_nll():
    model = hone.load_model("tiny")
    b = batch()
    logits = np.asarray(model(b["tokens"], attention_mask=b["attention_mask"]), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, b["targets"][..., None], -1)[..., 0]
    expected = (nll * b["loss_mask"]).sum() / b["loss_mask"].sum()
    _, metrics = one_step(accum=2, steps=1)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)


def test_bf16_compute_keeps_fp32_master_weights_and_tracks_fp32():
    full, m32 = one_step(accum=1, steps=3)
    half, m16 = one_step(accum=1, precision="bf16", steps=3)
    assert all(v.dtype == np.float32 for v in half["params"].values())
    assert m16["loss"] == pytest.approx(m32["loss"], rel=2e-2)


def test_schedule_shapes():
    s = learning_rate_schedule(lr=1.0, schedule="cosine", warmup_steps=2, max_steps=10,
                               min_lr_ratio=0.1)
    assert [float(s(i)) for i in (0, 1, 2)] == pytest.approx([0.0, 0.5, 1.0])
    assert float(s(10)) == pytest.approx(0.1)
    lin = learning_rate_schedule(lr=1.0, schedule="linear", warmup_steps=0, max_steps=4)
    assert [float(lin(i)) for i in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


@pytest.mark.parametrize("policy", ["full", "save_dots", "offload"])
def test_remat_policies_give_identical_gradients(policy):
    model = hone.load_model("tiny")
    b = batch()

    def loss(m):
        return sft_loss(m(b["tokens"], attention_mask=b["attention_mask"]), b["targets"],
                        b["loss_mask"])[0]

    plain = nnx.grad(loss)(model)
    model.remat = policy
    rematted = nnx.grad(loss)(model)
    for a, c in zip(jax.tree.leaves(plain), jax.tree.leaves(rematted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


def test_save_attention_keeps_blockwise_attention_out_of_the_recomputation():
    """Scanned blocks with blockwise attention (blocks of 4 over 16-token rows with padding):
    under remat full each block's gradient runs attention's forward loop twice (forward, then
    recomputed) beside its backward loop; under save_attention once, as without remat. The
    gradients stay those of no remat."""
    model = hone.load_model("tiny")
    model.attention, model.attention_block, model.scan_layers = "blockwise", 4, True
    b = batch()

    def loss(m):
        return sft_loss(m(b["tokens"], attention_mask=b["attention_mask"]), b["targets"],
                        b["loss_mask"])[0]

    def loops(policy):
        """While loops in the gradient's program (the scan's body is one block's) and the
        gradient."""
        model.remat = policy
        graph, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(jax.grad(lambda s: loss(nnx.merge(graph, s))))(state)
        return str(jaxpr).count(" while["), jax.tree.leaves(nnx.grad(loss)(model))

    (plain, g_plain), (full, g_full), (kept, g_kept) = map(loops, ("none", "full",
                                                                   "save_attention"))
    assert (plain, full, kept) == (2, 3, 2)
    for a, c, d in zip(g_plain, g_full, g_kept):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=0, atol=1e-6)
        np.testing.assert_allclose(np.asarray(d), np.asarray(a), rtol=0, atol=1e-6)
