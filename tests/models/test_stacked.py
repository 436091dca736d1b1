"""The stacked storage of scanned blocks' parameters (hone/models/stacked.py): keys by hand,
round trips, what stays per block, logical names, and a whole train state (optimizer moments
included) converted to the per-block layout checkpoints keep and back."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hone.models.config import preset
from hone.models.lora import apply_lora
from hone.models.stacked import (Relayout, is_stacked, plan_of, restack_flat, stack_flat,
                                 stacked_names, unstack_flat)
from hone.models.transformer import Transformer


def _flat(prefix="", layers=5, rests=("attn/q/kernel", "mlp_norm/scale")):
    flat = {f"{prefix}embedder/embedding": jnp.zeros((3, 2))}
    for i in range(layers):
        for n, rest in enumerate(rests):
            flat[f"{prefix}layers/{i}/{rest}"] = jnp.full((2, 2), 10.0 * i + n)
    return flat


def test_keys_by_hand_and_the_round_trip():
    flat = _flat()
    stacked = stack_flat(flat, {"": (2, 2)})  # pairs, two groups: block 4 is the tail
    assert sorted(stacked) == ["embedder/embedding", "layers/4/attn/q/kernel",
                               "layers/4/mlp_norm/scale", "layers/~0of2/attn/q/kernel",
                               "layers/~0of2/mlp_norm/scale", "layers/~1of2/attn/q/kernel",
                               "layers/~1of2/mlp_norm/scale"]
    # group g of position j holds block g * p + j
    np.testing.assert_array_equal(stacked["layers/~1of2/attn/q/kernel"][:, 0, 0], [10.0, 30.0])
    back = unstack_flat(stacked)
    assert back.keys() == flat.keys()
    for key in flat:
        np.testing.assert_array_equal(back[key], flat[key])
    np.testing.assert_array_equal(restack_flat(back, stacked)["layers/~0of2/mlp_norm/scale"],
                                  stacked["layers/~0of2/mlp_norm/scale"])
    assert not is_stacked(flat) and is_stacked(stacked)


def test_a_weight_not_trained_in_every_group_stays_per_block():
    flat = {k: v for k, v in _flat(layers=4).items() if not k.startswith(("layers/0/",
                                                                          "layers/1/"))}
    stacked = stack_flat(flat, {"": (1, 4)})  # top two blocks trained (model.train_layers)
    assert stacked.keys() == flat.keys()


def test_a_transformer_inside_another_module_and_its_names():
    flat = _flat("policy/", layers=2)
    stacked = stack_flat(flat, {"policy/": (1, 2)})
    assert "policy/layers/~0of1/attn/q/kernel" in stacked
    names = {"policy/layers/0/attn/q/kernel": ("embed", "heads"),
             "policy/layers/0/mlp_norm/scale": None}
    named = stacked_names(names, stacked)
    assert named["policy/layers/~0of1/attn/q/kernel"] == (None, "embed", "heads")
    assert named["policy/layers/~0of1/mlp_norm/scale"] is None
    with pytest.raises(ValueError, match="lack 'policy/layers/1/attn/q/kernel'"):
        restack_flat({k: v for k, v in flat.items() if "layers/1/attn" not in k}, stacked)


def test_the_plan_follows_the_model():
    cfg = preset("tiny").replace(num_layers=4, layer_types=("global",) * 4)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    assert plan_of(model) == {}  # the loop
    model.scan_layers = True
    assert plan_of(model) == {"": (1, 4)}
    apply_lora(model, rank=2, alpha=4.0, targets=r"layers/\d+/mlp/up", dropout=0.1,
               rngs=nnx.Rngs(1))
    assert plan_of(model) == {}  # dropout streams: the blocks keep the loop


def test_a_train_state_goes_per_block_and_back():
    stacked = stack_flat(_flat(), {"": (1, 5)})
    opt = optax.adamw(1e-3)
    opt_state = opt.init(stacked)
    grads = jax.tree.map(jnp.ones_like, stacked)
    _, opt_state = opt.update(grads, opt_state, stacked)
    state = {"step": jnp.int32(3), "params": stacked, "opt_state": opt_state}
    relayout = Relayout.of(state)
    saved = relayout.to_saved(state)
    assert saved["params"].keys() == _flat().keys()
    assert saved["opt_state"][0].mu.keys() == _flat().keys()  # the moments follow the params
    np.testing.assert_array_equal(saved["opt_state"][0].mu["layers/3/attn/q/kernel"],
                                  opt_state[0].mu["layers/~0of1/attn/q/kernel"][3])
    back = relayout.from_saved(saved)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
    assert Relayout.of({"params": _flat()}) is None
