"""The LM head over chunks of positions: per-token log-probabilities, entropy and distillation
terms without a [B, T, V] logits tensor for the whole row (fused linear cross-entropy).

A row of T positions is cut into ceil(T / c) chunks of c positions; each chunk runs the head
(hidden [B, c, D] -> logits [B, c, V]) and reduces its logits to per-token values [B, c] at
once, so at most one chunk's logits is alive: B·c·V floats instead of B·T·V (at T = 8192 and
SmolLM2's V = 49152 that is 1.6 GB of float32 per row for the whole row, 0.2 GB per chunk of
1024). Design choices:

- `over_chunks` is the one primitive: `jax.lax.scan` over the chunks with `jax.checkpoint` on
  the body, so the forward pass saves only each chunk's inputs and the backward pass recomputes
  that chunk's logits (one extra head matmul per chunk: the price of the memory).
- The head is any callable hidden [B, c, D] -> float32 logits [B, c, V], normally
  `model.logits_from_hidden`: tied or untied, LoRA, NF4/int8 and the final soft-cap all come
  with it, and gradients reach its parameters (JAX sums a closed-over array's gradient over the
  scan's steps). When it is a method of an NNX module with random streams (LoRA dropout on
  lm_head), the streams travel through the scan as its carry, since a scan body may not change
  a module it closes over; each chunk then draws its own dropout mask, and the backward pass
  redraws the same one.
- A row of at most `chunk` positions, or chunk = 0, runs the function once on the whole row with
  no scan and no checkpoint: exactly today's program. A ragged tail is zero-padded to a whole
  chunk and cropped away; padded positions reach no output, so they get no gradient.
- The math of each chunk stays in hone/losses (token_logprobs, token_entropy,
  distill_token_terms); this file only cuts rows and applies the head.

Letters: B rows, T positions, D hidden width, V vocabulary, K kept teacher logits, n chunks,
c positions per chunk.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hone.losses.common import token_entropy, token_logprobs
from hone.losses.distill import distill_from_terms, distill_token_terms

Head = Callable[[jax.Array], jax.Array]  # hidden [B, c, D] -> float32 logits [B, c, V]


def over_chunks(fn: Callable, hidden: jax.Array, *per_token, chunk: int,
                module: nnx.Module | None = None):
    """fn(hidden [B, c, D], *per_token chunks [B, c, ...]) -> outputs [B, c, ...] (a pytree),
    applied to chunks of `chunk` positions; returns the outputs of the whole row [B, T, ...].

    per_token: pytrees (or None) whose leaves are [B, T, ...], cut like hidden. The backward
    pass recomputes each chunk from its saved inputs, so fn's intermediates (the logits) are
    never stored for more than one chunk. chunk <= 0 or T <= chunk: fn on the whole row.

    fn may not change the state of a module it closes over (the chunks run inside a scan). A
    module whose random streams advance in fn (LoRA dropout) is passed as `module` instead: fn
    then takes it as its first argument (a copy inside the scan, whose streams the scan
    carries from chunk to chunk) and `module`'s streams move on past the last chunk.
    """
    args = () if module is None else (module,)
    rows, length = hidden.shape[:2]
    if chunk <= 0 or length <= chunk:
        return fn(*args, hidden, *per_token)
    n = -(-length // chunk)
    pad = n * chunk - length

    def cut(x):  # [B, T, ...] -> [n, B, c, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape((rows, n, chunk) + x.shape[2:]), 1, 0)

    def join(y):  # [n, B, c, ...] -> [B, T, ...]
        y = jnp.moveaxis(y, 0, 1)
        return y.reshape((rows, n * chunk) + y.shape[3:])[:, :length]

    xs = jax.tree.map(cut, (hidden,) + per_token)
    if module is None:
        def step(carry, x):
            return carry, fn(*x)
        carry = None
    else:  # only the random streams travel as the carry; every other array is closed over
        graphdef, carry, rest = nnx.split(module, nnx.RngState, ...)
        drawn = []  # set while tracing: did fn draw from a stream (else module stays as is)

        def step(streams, x):
            before = jax.tree.leaves(streams)  # now: merge's Variables may share the arrays
            copy = nnx.merge(graphdef, streams, rest)
            out = fn(copy, *x)
            after = nnx.state(copy, nnx.RngState)
            drawn.append(any(a is not b for a, b in zip(jax.tree.leaves(after), before)))
            return after, out

    # prevent_cse=False: scan already keeps XLA from merging the recomputation with the forward.
    carry, out = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), carry, xs)
    if module is not None and any(drawn):
        nnx.update(module, carry)  # (a module in eval mode is left alone: nothing to update)
    return jax.tree.map(join, out)


def _over_head_chunks(head: Head, fn: Callable, hidden: jax.Array, *per_token, chunk: int):
    """over_chunks of fn(head, hidden chunk, *per_token chunks). A head that is a method of an
    NNX module with random streams (`model.logits_from_hidden` with LoRA dropout on lm_head)
    is called on the scan's copy of that module (see over_chunks)."""
    owner = getattr(head, "__self__", None)  # a bound method's module
    if isinstance(owner, nnx.Module) and jax.tree.leaves(nnx.state(owner, nnx.RngState)):
        method = head.__func__
        return over_chunks(lambda copy, *xs: fn(functools.partial(method, copy), *xs), hidden,
                           *per_token, chunk=chunk, module=owner)
    return over_chunks(lambda *xs: fn(head, *xs), hidden, *per_token, chunk=chunk)


def token_logprobs_chunked(head: Head, hidden: jax.Array, targets: jax.Array,
                           chunk: int) -> jax.Array:
    """log softmax(head(hidden))[targets]: hidden [B, T, D], targets [B, T] -> [B, T] float32,
    equal to `token_logprobs(head(hidden), targets)`."""
    return _over_head_chunks(head, lambda f, h, y: token_logprobs(f(h), y), hidden, targets,
                             chunk=chunk)


def token_logprobs_and_entropy(head: Head, hidden: jax.Array, targets: jax.Array,
                               chunk: int) -> tuple[jax.Array, jax.Array]:
    """(log-probabilities of the targets [B, T], entropy of the head's distribution [B, T]),
    from one head pass per chunk. The entropy is a diagnostic: no gradient flows through it."""

    def fn(f, h, y):
        logits = f(h)  # [B, c, V]
        return token_logprobs(logits, y), token_entropy(jax.lax.stop_gradient(logits))

    return _over_head_chunks(head, fn, hidden, targets, chunk=chunk)


def distill_loss_chunked(head: Head, hidden: jax.Array, mask: jax.Array, *, chunk: int,
                         teacher_head: Head | None = None, teacher_hidden: jax.Array | None = None,
                         teacher_topk: tuple[jax.Array, jax.Array] | None = None,
                         temperature: float = 2.0, kind: str = "forward_kl", beta: float = 0.5,
                         alpha: float | None = None, targets: jax.Array | None = None,
                         denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """`distill_loss(head(hidden), teacher logits, mask, ...)` without either side's [B, T, V].

    Student: head, hidden [B, T, D]. Teacher: teacher_head and teacher_hidden [B, T, Dt] (an
    online teacher; teacher_head = the identity takes precomputed logits [B, T, V]), or
    teacher_topk = (values, indices) [B, T, K]. mask [B, T]; the options and the returned
    (loss, metrics) are distill_loss's.
    """
    if (teacher_topk is None) == (teacher_hidden is None) or \
            (teacher_hidden is None) != (teacher_head is None):
        raise ValueError("distill_loss_chunked: give teacher_head with teacher_hidden, or "
                         "teacher_topk")
    opts = dict(temperature=temperature, kind=kind, beta=beta, alpha=alpha)
    teacher_in = teacher_topk if teacher_hidden is None else teacher_hidden

    def fn(f, h, t, m, y):
        if teacher_hidden is None:
            return distill_token_terms(f(h), None, m, teacher_topk=t, targets=y, **opts)
        return distill_token_terms(f(h), teacher_head(t), m, targets=y, **opts)

    terms = _over_head_chunks(head, fn, hidden, teacher_in, mask, targets, chunk=chunk)
    return distill_from_terms(terms, denominator)
