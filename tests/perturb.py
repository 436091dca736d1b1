"""Another version of a model's weights, for tests of what changes when the weights do (partial
episodes, the lag's next version)."""

import jax
from flax import nnx


def perturbed(model, scale=0.05, seed=11):
    """The same architecture with other weights (the 'next version')."""
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [x + scale * jax.random.normal(k, x.shape, x.dtype) if x.dtype.kind == "f" else x
              for x, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))
