"""Blocks run as a scan over stacked weights (hone/models/scan_layers.py) against the loop:
the same SFT loss and the same gradient of every trained leaf at 1e-5 absolute in float32, on
the tiny preset made 5 blocks deep (a whole-group scan plus, with a pattern, a ragged tail),
with remat none and full, with QLoRA adapters (NF4 codes stacked as frozen state), and with a
sliding/global pattern (scanned in pairs); blockwise attention over blocks of 8 so its custom
VJP runs inside the scan. Then the grouping rule by hand, the fall-back for LoRA dropout, and
one compiled step's memory: with the scan and remat full, each block added may keep only its
input, not its intermediates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.models.config import preset
from hone.models.lora import LoRAParam, apply_lora
from hone.models.scan_layers import period, scan_setting, scannable
from hone.models.transformer import Transformer
from hone.recipes.sft import sft_step_loss
from hone.train.state import flatten

T = 24


def _tiny(layer_types):
    cfg = preset("tiny").replace(num_layers=len(layer_types), layer_types=layer_types,
                                 sliding_window=6 if "sliding" in layer_types else None)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 264, size=(2, T + 1))
    mask = np.ones((2, T), np.int32)
    mask[1, :5] = 0  # left padding in one row
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return {"tokens": jnp.asarray(ids[:, :-1], jnp.int32),
            "targets": jnp.asarray(ids[:, 1:], jnp.int32),
            "loss_mask": jnp.asarray(mask, jnp.float32), "attention_mask": jnp.asarray(mask),
            "positions": jnp.asarray(pos, jnp.int32), "segment_ids": jnp.asarray(mask)}


def _loss_and_grads(model, trainable, remat: str, scan: bool):
    model.remat, model.scan_layers = remat, scan
    model.attention, model.attention_block = "blockwise", 8
    graphdef, params, rest = nnx.split(model, trainable, ...)
    mb = _batch()

    def loss(p, rest):  # the frozen state an argument, as in the train step
        return sft_step_loss(nnx.merge(graphdef, p, rest), mb, jnp.float32(T), None)[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(params, rest)
    return value, flatten(grads)


def _assert_same(model, trainable, remat, loop_remat=None):
    loop_remat = remat if loop_remat is None else loop_remat
    loop_loss, loop_grads = _loss_and_grads(model, trainable, loop_remat, scan=False)
    scan_loss, scan_grads = _loss_and_grads(model, trainable, remat, scan=True)
    np.testing.assert_allclose(scan_loss, loop_loss, atol=1e-5, rtol=0)
    assert scan_grads.keys() == loop_grads.keys()
    for key in loop_grads:
        np.testing.assert_allclose(scan_grads[key], loop_grads[key], atol=1e-5, rtol=0,
                                   err_msg=key)
    # The gradients are not all zero (an adapter's B starts at zero, its A's gradient does not).
    assert max(float(jnp.abs(g).max()) for g in loop_grads.values()) > 1e-3


@pytest.mark.parametrize("remat", ["none", "full"])
def test_uniform_blocks_scan_like_the_loop(remat):
    _assert_same(_tiny(("global",) * 5), nnx.Param, remat)


def test_qlora_blocks_scan_like_the_loop():
    model = _tiny(("global",) * 5)
    apply_lora(model, rank=4, alpha=8.0, targets=r"layers/\d+/(attn/.|mlp/.+)", quantize="nf4",
               rngs=nnx.Rngs(1))
    # Against the loop without remat (remat changes no number, tests/train/test_step.py): the
    # loop's nnx.remat refuses quantized storage passed into a jitted function (it tries to
    # update the frozen QuantizedKernel variables across trace levels).
    _assert_same(model, LoRAParam, "full", loop_remat="none")


def test_sliding_global_pattern_scans_in_pairs_like_the_loop():
    model = _tiny(("sliding", "global") * 2 + ("sliding",))  # two pairs and a ragged tail
    assert period([nnx.graphdef(b) for b in model.layers]) == 2
    _assert_same(model, nnx.Param, "full")


def test_grouping_rule_by_hand():
    assert period(list("aaaa")) == 1
    assert period(list("abab")) == 2
    assert period(list("ababa")) == 2  # the last a runs after the scan
    assert period(list("aaaaab" * 2 + "aa")) == 6  # Gemma 3's five sliding, one global
    assert period(list("abc")) == 0 and period(list("a")) == 0
    assert period(list("aab")) == 0  # one group of any size: nothing to scan


def test_settings_and_dropout_fall_back_to_the_loop():
    assert scan_setting("auto", "full") and not scan_setting("auto", "none")
    assert scan_setting("true", "none") and not scan_setting("false", "full")
    model = _tiny(("global",) * 2)
    assert scannable(model.layers)
    apply_lora(model, rank=2, alpha=4.0, targets=r"layers/\d+/mlp/up", dropout=0.1,
               rngs=nnx.Rngs(1))
    assert not scannable(model.layers)  # a scan body may not advance the dropout stream
