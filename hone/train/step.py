"""The jitted train step: forward, loss, gradients accumulated over micro-batches, optimizer
update; and the matching evaluation step.

Design choices:
- One function of (state, frozen, batch), jitted once with the state donated. The model's graph
  definition and the loss are closed over (static); weights are arguments.
- Gradient accumulation scans over micro-batches and divides by a normalizer computed from the
  whole batch (for SFT: its number of target tokens), so 4 x 1 gives the update of 1 x 4.
- The split into micro-batches is the recipe's (`row_split` by default; preference batches keep
  each chosen row with its rejected row, `pair_split`). The same split hands each device its
  rows in the explicit all-reduce mode.
- On a mesh (`hone.parallel.Layout`), GSPMD partitions the step from the shardings of the
  state and the batch; micro-batches are kept split over the batch axes. In the explicit
  all-reduce mode each device computes the gradients of its own rows under `shard_map` and an
  explicit `psum` over `data` adds them (every loss is already divided by the whole batch's
  normalizer, so the sum is the full-batch gradient).
- With a guard state in the train state (hone.train.guards) the updates are scaled by its
  learning-rate scale, and a step with a non-finite loss or gradient norm (or one that trips
  a guard) keeps the old parameters and optimizer state, chosen inside the step.
- Mixture-of-experts models add their router losses (load balancing, z-loss) to whatever the
  recipe's loss returns, here in one place (`with_router_loss`), so every command trains them.
  Each micro-batch adds its own share (1 / micro-batches per step), so the step's router loss
  and its moe/ metrics are means over the micro-batches. Dense models: nothing changes.
- Precision "bf16" casts parameters to bfloat16 for the forward pass only; the master weights,
  gradients and optimizer state stay float32, and logits/softmax are computed in float32.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hone.losses.moe import router_loss
from hone.models.stacked import provide
from hone.models.transformer import pop_router_sums
from hone.train.guards import guard_update
from hone.train.optimizer import ScaledLR
from hone.train.state import unflatten

# loss_fn(model, micro_batch, normalizer, rng_key, aux) -> (loss, metrics): metrics are sums
# over the micro-batch (e.g. "target_tokens"), so they add up across micro-batches. `aux` is any
# other pytree the loss reads but never trains (a frozen reference model's weights), passed to
# the jitted step as an argument so it is never baked into the program as a constant.
LossFn = Callable[[nnx.Module, dict, jax.Array, jax.Array, Any], tuple[jax.Array, dict]]
# normalizer_fn(batch) -> scalar the summed loss of the whole batch is divided by.
NormalizerFn = Callable[[dict], jax.Array]


def _cast(tree, dtype):
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


def row_split(batch: dict, n: int) -> dict:
    """[B, ...] leaves -> [n, B/n, ...]: micro-batch i is rows i*B/n .. (i+1)*B/n - 1."""
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)


def pair_split(batch: dict, n: int) -> dict:
    """row_split for preference batches ([2P, ...] rows: P chosen then P rejected; [P, ...]
    per-pair leaves): micro-batch i holds pairs i*P/n .. (i+1)*P/n - 1, chosen rows first, so
    it is itself a preference batch."""
    pairs = batch["pair_valid"].shape[0]

    def one(x):
        if x.shape[0] != 2 * pairs:
            return x.reshape((n, x.shape[0] // n) + x.shape[1:])
        x = x.reshape((2, n, pairs // n) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape((n, 2 * pairs // n) + x.shape[3:])

    return jax.tree.map(one, batch)


def with_router_loss(model, loss: jax.Array, metrics: dict, share: float):
    """loss and metrics plus `share` x the router losses and moe/ metrics of the forward
    passes `model` just ran (hone/losses/moe.py); unchanged for a dense model, or when the
    trainer set no Transformer.router_loss."""
    for coefs, sums in pop_router_sums(model):
        extra, moe_metrics = router_loss(sums, coefs.aux_coef, coefs.z_coef)
        loss = loss + share * extra
        metrics = dict(metrics, **{k: share * v for k, v in moe_metrics.items()})
    return loss, metrics


def merge(graphdef, template, params, frozen, precision: str, dropout_key=None):
    """The model for one forward pass, in the compute precision. Parameters stored stacked
    over scanned blocks (hone.models.stacked) reach the scan as they are.

    With a dropout_key the model is in training mode and its dropout stream is reseeded from
    the key: the frozen state is not returned from the step, so a stream left to advance by
    itself would repeat the same masks every step.
    """
    if precision == "bf16":
        params, frozen = _cast(params, jnp.bfloat16), _cast(frozen, jnp.bfloat16)
    model = nnx.merge(graphdef, unflatten(template, params), frozen)
    provide(model, params)  # weights stored stacked: the scan reads them as they are
    if dropout_key is not None:
        model.train()
        nnx.reseed(model, dropout=dropout_key)
    return model


def withhold(applied: jax.Array, new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Inside a jitted step: `new` (the state after an update) where `applied`, else `old`'s
    weights, optimizer and guard state (every entry but the step counter, which moves on so
    that step N still consumes batch N). For updates withheld on purpose: an Adam step on a
    zero gradient would still move the weights."""
    kept = jax.tree.map(lambda n, o: jnp.where(applied, n, o),
                        {k: v for k, v in new.items() if k != "step"},
                        {k: old[k] for k in new if k != "step"})
    return dict(kept, step=new["step"])


def make_train_step(graphdef, template, loss_fn: LossFn, normalizer_fn: NormalizerFn,
                    optimizer: optax.GradientTransformation, schedule: optax.Schedule, *,
                    accum: int, precision: str = "fp32", split=row_split, layout=None):
    """A jitted `step(state, frozen, batch, aux=None) -> (state, metrics)`; batch leaves are
    [B, ...]."""
    return jax.jit(update_fn(graphdef, template, loss_fn, normalizer_fn, optimizer, schedule,
                             accum=accum, precision=precision, split=split, layout=layout),
                   donate_argnums=(0,))


def update_fn(graphdef, template, loss_fn: LossFn, normalizer_fn: NormalizerFn,
              optimizer: optax.GradientTransformation, schedule: optax.Schedule, *,
              accum: int, precision: str = "fp32", split=row_split, layout=None):
    """The unjitted `step(state, frozen, batch, aux=None) -> (state, metrics)`: one optimizer
    update from one batch. RL recipes call it several times inside their own jitted step."""

    mesh = None if layout is None else layout.mesh
    # Each micro-batch's share of a per-batch mean (the router losses): one of `accum` on each
    # of the shards the all-reduce mode sums over.
    shards = layout.shards if mesh is not None and layout.mode == "allreduce" else 1
    share = 1.0 / (accum * shards)

    def micro(params, frozen, mb, normalizer, key, aux):
        model = merge(graphdef, template, params, frozen, precision,
                      dropout_key=jax.random.fold_in(key, 1))
        loss, metrics = loss_fn(model, mb, normalizer, key, aux)
        return with_router_loss(model, loss, metrics, share)

    grad_fn = jax.value_and_grad(micro, has_aux=True)

    def accumulate(params, frozen, batch, normalizer, key, aux, keep_split: bool):
        """(grads, loss, metric sums) summed over `accum` micro-batches of `batch`."""
        mbs = split(batch, accum)
        if keep_split:  # each micro-batch stays spread over the batch axes of the mesh
            mbs = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, layout.micro(x)),
                               mbs)
        if accum == 1:
            first = jax.tree.map(lambda x: x[0], mbs)
            (loss, sums), grads = grad_fn(params, frozen, first, normalizer,
                                          jax.random.fold_in(key, 0), aux)
            return grads, loss, sums

        def body(carry, xs):
            mb, i = xs
            (l, m), g = grad_fn(params, frozen, mb, normalizer, jax.random.fold_in(key, i), aux)
            return jax.tree.map(jnp.add, carry, (g, l, m)), None

        first = jax.tree.map(lambda x: x[0], mbs)
        shapes = jax.eval_shape(grad_fn, params, frozen, first, normalizer, key, aux)
        (l_shape, m_shape), g_shape = shapes
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (g_shape, l_shape, m_shape))
        (grads, loss, sums), _ = jax.lax.scan(body, zeros, (mbs, jnp.arange(accum)))
        return grads, loss, sums

    def allreduce(params, frozen, batch, normalizer, key, aux):
        """Per-device gradients of each device's rows, added by an explicit psum."""
        from jax.sharding import PartitionSpec as P

        def local(params, frozen, parts, normalizer, key, aux):
            mine = jax.tree.map(lambda x: x[0], parts)
            # check_vma=False: with the default check_vma=True, shard_map already sums the
            # gradients of replicated parameters across the axis (a psum on top made them N
            # times too large), so here nothing is summed behind our back and the psum below
            # is the one all-reduce of the step.
            out = accumulate(params, frozen, mine, normalizer, key, aux, keep_split=False)
            return jax.lax.psum(out, "data")

        parts = split(batch, layout.shards)
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data"), P(), P(), P()),
                             out_specs=P(), check_vma=False)(
            params, frozen, parts, normalizer, key, aux)

    def step(state: dict[str, Any], frozen, batch: dict, aux=None) -> tuple[dict[str, Any], dict]:
        params = state["params"]
        normalizer = normalizer_fn(batch)
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        if mesh is not None and layout.mode == "allreduce":
            grads, loss, sums = allreduce(params, frozen, batch, normalizer, key, aux)
        else:
            grads, loss, sums = accumulate(params, frozen, batch, normalizer, key, aux,
                                           keep_split=mesh is not None)
        lr, grad_norm = schedule(state["step"]), optax.tree.norm(grads)

        def apply(scale, **extra):
            updates, opt_state = optimizer.update(grads, state["opt_state"], params, **extra)
            if scale is not None:
                updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
            return optax.apply_updates(params, updates), opt_state

        if "guard" in state and isinstance(optimizer, ScaledLR):
            # The rollbacks' learning-rate scale multiplies the scalar step size (exact at 1.0).
            scale = state["guard"]["lr_scale"]
            new_params, opt_state = apply(None, lr_scale=scale)
            lr = lr * scale
        elif "guard" in state:  # any other optax optimizer: scale its updates
            # A branch per case: scaling the updates in line, even by 1.0, changes how XLA
            # fuses (and rounds) the update, and a healthy run must not change by an ulp.
            scale = state["guard"]["lr_scale"]
            new_params, opt_state = jax.lax.cond(scale == 1, lambda: apply(None),
                                                 lambda: apply(scale))
            lr = lr * scale
        else:
            new_params, opt_state = apply(None)
        new_state = dict(state, step=state["step"] + 1, opt_state=opt_state, params=new_params)
        metrics = dict(sums, loss=loss, grad_norm=grad_norm, lr=lr)
        if "guard" in state:  # withhold non-finite or tripping updates (hone.train.guards)
            new_state, guard_metrics = guard_update(state, new_state, loss, grad_norm)
            metrics.update(guard_metrics)
        return new_state, metrics

    return step


def make_eval_step(graphdef, template, loss_fn: LossFn, *, precision: str = "fp32"):
    """A jitted `eval_step(params, frozen, batch, aux=None) -> metrics` (sums; no
    normalisation)."""

    def step(params, frozen, batch, aux=None):
        model = merge(graphdef, template, params, frozen, precision)
        _, metrics = loss_fn(model, batch, jnp.float32(1.0), jax.random.key(0), aux)
        return metrics

    return jax.jit(step)
