"""hone.models.head: the LM head over chunks of positions equals the whole-row head.

Parity against today's computation (`model.logits_from_hidden` on the whole row, then the losses
of hone/losses) at a fixed 1e-5 (relative and absolute, float32), never loosened: per-token
values, metrics, and gradients w.r.t. the hidden states and every parameter of the head. Rows of
T = 37 positions in chunks of 8: four whole chunks and a ragged tail of 5. Each parity test is
one jitted program holding both sides, so the file compiles a handful of small graphs.
"""

import dataclasses
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.losses import distill_loss, sft_loss, token_logprobs, topk_logits
from hone.losses.common import token_entropy
from hone.losses.sft import sft_loss_from_logprobs
from hone.models.config import ModelConfig
from hone.models.head import (distill_loss_chunked, over_chunks, token_logprobs_and_entropy,
                              token_logprobs_chunked)
from hone.models.lora import LoRAParam, apply_lora
from hone.models.transformer import Transformer

TOL = 1e-5  # fixed; never loosened
B, T, D, V, CHUNK = 2, 37, 32, 97, 8
CFG = ModelConfig(vocab_size=V, hidden_size=D, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16)


def close(actual, expected, err_msg=""):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=TOL, atol=TOL, err_msg=err_msg)


def close_trees(actual, expected):
    for (path, a), e in zip(jax.tree_util.tree_leaves_with_path(actual),
                            jax.tree.leaves(expected), strict=True):
        close(a, e, err_msg=jax.tree_util.keystr(path))


# Tiny graphs run in microseconds either way; skipping LLVM's optimisations cuts their compile
# time. A code-generation setting: the graph and its float semantics are unchanged.
QUICK = dict(compiler_options={"xla_backend_optimization_level": 0})


def make_head(kind: str) -> Transformer:
    """A one-block model whose head is of `kind` (tied; or untied with a soft-cap, and "lora" or
    "qlora" adapters on it); the block is never run (hidden is random)."""
    if kind == "tied":
        return Transformer(dataclasses.replace(CFG, tie_embeddings=True), rngs=nnx.Rngs(0))
    model = Transformer(dataclasses.replace(CFG, final_logit_softcap=3.0), rngs=nnx.Rngs(0))
    if kind in ("lora", "qlora"):  # dropout > 0: the head has a random stream (idle in eval)
        apply_lora(model, rank=4, alpha=8.0, targets="lm_head", dropout=0.1, rngs=nnx.Rngs(1),
                   quantize="nf4" if kind == "qlora" else "none")
        b = model.lm_head.lora.lora_b
        b[...] = 0.2 * jax.random.normal(jax.random.key(2), b.shape)  # B = 0 would hide A
    return model


def inputs(seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(k[0], (B, T, D))                     # [B, T, D]
    targets = jax.random.randint(k[1], (B, T), 0, V)                 # [B, T]
    weights = jax.random.normal(k[2], (B, T))                        # [B, T]: non-uniform grads
    mask = (jnp.arange(T)[None, :] < jnp.array([[T], [T - 6]])).astype(jnp.int32)  # [B, T]
    return hidden, targets, weights, mask


def grads(model, fn, hidden):
    """(value, (d/d Params of model, d/d hidden)) of fn(model, hidden) -> (scalar, aux)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def f(p, h):
        return fn(nnx.merge(graphdef, p, rest), h)

    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, hidden)


def test_over_chunks_crops_a_ragged_tail_and_one_chunk_is_todays_program():
    hidden, targets, weights, _ = inputs()
    fn = lambda h, y, w: {"a": jnp.sum(h, -1) * w, "b": (y[..., None] + 1) * h}  # noqa: E731
    full = fn(hidden, targets, weights)
    chunked = jax.jit(lambda *a: over_chunks(fn, *a, chunk=CHUNK), **QUICK)
    close_trees(chunked(hidden, targets, weights), full)
    for chunk in (0, T, 64):  # one chunk: fn itself, no scan, the same bits
        jaxpr = jax.make_jaxpr(lambda *a: over_chunks(fn, *a, chunk=chunk))(hidden, targets,
                                                                          weights)
        assert "scan" not in str(jaxpr)
        got = over_chunks(fn, hidden, targets, weights, chunk=chunk)
        assert all(np.array_equal(g, f) for g, f in zip(jax.tree.leaves(got),
                                                        jax.tree.leaves(full)))


@pytest.mark.parametrize("kind", ["tied", "lora"])
def test_logprobs_entropy_and_grads_match_the_whole_row(kind):
    """tied: the embedding table decodes; lora: an untied lm_head with a soft-cap and LoRA."""
    model = make_head(kind)
    hidden, targets, weights, mask = inputs()

    @functools.partial(jax.jit, **QUICK)
    def both(hidden):
        def ref(m, h):
            logits = m.logits_from_hidden(h)  # [B, T, V]: what the recipes form today
            logp = token_logprobs(logits, targets)
            ent = token_entropy(jax.lax.stop_gradient(logits))
            return jnp.sum(weights * logp) + jnp.sum(ent), (logp, ent)

        def chunked(m, h):
            logp = token_logprobs_chunked(m.logits_from_hidden, h, targets, CHUNK)
            return jnp.sum(weights * logp), logp

        def with_entropy(m, h):  # the entropy adds no gradient
            logp, ent = token_logprobs_and_entropy(m.logits_from_hidden, h, targets, CHUNK)
            return jnp.sum(weights * logp) + jnp.sum(ent), (logp, ent)

        return grads(model, ref, hidden), grads(model, chunked, hidden), \
            grads(model, with_entropy, hidden)

    ((_, (logp, ent)), g_ref), ((_, logp_c), g_c), ((_, (logp_e, ent_e)), g_e) = both(hidden)
    close(logp_c, logp)
    close(logp_e, logp)
    close(ent_e, ent)
    names = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(g_ref[0])}
    head = "embedding" if kind == "tied" else "lora_a"
    assert any(head in n for n in names), names
    for g in (g_c, g_e):
        close_trees(g, g_ref)
    # The SFT loss from chunked log-probabilities: sft_loss's numbers.
    logits = model.logits_from_hidden(hidden)
    close_trees(sft_loss_from_logprobs(logp_c, mask, 7.0), sft_loss(logits, targets, mask, 7.0))


def test_bf16_hidden_gives_float32_log_probs():
    model = make_head("tied")
    hidden, targets, _, _ = inputs()
    h16 = hidden.astype(jnp.bfloat16)
    logp = jax.jit(lambda h: token_logprobs_chunked(model.logits_from_hidden, h, targets, CHUNK),
                   **QUICK)(h16)
    assert logp.dtype == jnp.float32
    close(logp, token_logprobs(model.logits_from_hidden(h16), targets))


def test_lora_dropout_on_the_head_trains_and_advances_its_stream():
    model = make_head("lora")
    model.train()
    hidden, targets, weights, _ = inputs()
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.RngCount))]

    def loss(m, h):
        return jnp.sum(weights * token_logprobs_chunked(m.logits_from_hidden, h, targets, CHUNK))

    g_params, g_hidden = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(model, hidden)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves((g_params, g_hidden)))
    assert np.any(np.asarray(nnx.state(g_params, LoRAParam)["lm_head"]["lora"]["lora_a"]) != 0)
    after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.RngCount))]
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))


def test_no_whole_row_logits_in_the_chunked_program():
    """Every array of the loss-and-gradient program holds at most one chunk's logits."""
    model = make_head("tied")
    hidden, targets, weights, _ = inputs()

    def loss(m, h):
        return jnp.sum(weights * token_logprobs_chunked(m.logits_from_hidden, h, targets,
                                                        CHUNK)), None

    def sizes(jaxpr):  # of every array of logits' kind (rows, positions, V), sub-programs too
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                shape = getattr(var.aval, "shape", ())
                if len(shape) >= 3 and shape[-1] == V:
                    yield int(np.prod(shape))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from sizes(sub)

    largest = max(sizes(jax.make_jaxpr(lambda h: grads(model, loss, h))(hidden).jaxpr))
    assert largest == B * CHUNK * V, largest  # the whole row's would be B·T·V


DISTILL = (("forward_kl", 0.5, None), ("reverse_kl", 0.5, None), ("jsd", 0.3, None),
           ("forward_kl", 0.5, 0.4))  # (kind, beta, alpha)


@pytest.mark.parametrize("teacher", ["online", "topk"])
def test_distillation_matches_the_whole_row(teacher):
    """Loss, metrics and gradients of every divergence at temperature 2: an online teacher
    (its own head on its own hidden states) or the offline cache's top-k logits. The student's
    head: tied, or (with the top-k teacher) NF4-quantized with LoRA."""
    student = make_head("tied" if teacher == "online" else "qlora")
    other = make_head("lora")
    hidden, targets, _, mask = inputs()
    t_hidden = inputs(seed=1)[0]
    t_logits = other.logits_from_hidden(t_hidden)
    topk = topk_logits(t_logits, 5)

    @functools.partial(jax.jit, **QUICK)
    def all_kinds(hidden):
        out = []
        for kind, beta, alpha in DISTILL:
            opts = dict(temperature=2.0, kind=kind, beta=beta, alpha=alpha,
                        targets=None if alpha is None else targets)

            def ref(m, h, opts=opts):
                full = None if teacher == "topk" else t_logits
                return distill_loss(m.logits_from_hidden(h), full, mask,
                                    teacher_topk=topk if teacher == "topk" else None, **opts)

            def chunked(m, h, opts=opts):
                side = (dict(teacher_topk=topk) if teacher == "topk" else
                        dict(teacher_head=other.logits_from_hidden, teacher_hidden=t_hidden))
                return distill_loss_chunked(m.logits_from_hidden, h, mask, chunk=CHUNK,
                                            **side, **opts)

            out.append((grads(student, ref, hidden), grads(student, chunked, hidden)))
        return out

    for (kind, beta, alpha), (ref, got) in zip(DISTILL, all_kinds(hidden)):
        assert set(got[0][1]) == set(ref[0][1]), kind
        for a, e in ((got[0][0], ref[0][0]), (got[0][1], ref[0][1]), (got[1], ref[1])):
            close_trees(a, e)


def test_distillation_needs_exactly_one_teacher():
    model = make_head("tied")
    hidden, _, _, mask = inputs()
    topk = (jnp.zeros((B, T, 3)), jnp.zeros((B, T, 3), jnp.int32))
    for side in ({}, dict(teacher_hidden=hidden), dict(teacher_head=model.logits_from_hidden),
                 dict(teacher_head=model.logits_from_hidden, teacher_hidden=hidden,
                      teacher_topk=topk)):
        with pytest.raises(ValueError, match="teacher_head with teacher_hidden, or"):
            distill_loss_chunked(model.logits_from_hidden, hidden, mask, chunk=CHUNK, **side)
