"""Blocks run as a scan over their weights stored stacked (hone/models/scan_layers.py,
hone/models/stacked.py) against the loop: the same SFT loss and the same gradient of every
trained leaf at 1e-5 absolute in float32 (the scan's taken through the stacked storage the
train state keeps, as the train step's `merge` builds the model), on the tiny preset made 5
blocks deep (a whole-group scan plus, with a pattern, a ragged tail), with remat none and full,
with QLoRA adapters (NF4 codes stacked as frozen state), with a sliding/global pattern (scanned
in pairs), and the logits of a forward pass alone; blockwise attention over blocks of 8 so its
custom VJP runs inside the scan. Then the grouping rule by hand, the fall-back for LoRA
dropout, and one compiled step's memory: with the scan and remat full, each block added may
keep only its input, not its intermediates."""

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
    """(loss, per-block gradients) of the train state's parameters: per block with the loop,
    stored stacked (and differentiated as stacks) with the scan."""
    from hone.models.stacked import is_stacked, unstack_flat
    from hone.train.state import train_params
    from hone.train.step import merge
    model.remat, model.scan_layers = remat, scan
    model.attention, model.attention_block = "blockwise", 8
    graphdef, params, rest = nnx.split(model, trainable, ...)
    flat = train_params(model, params)
    assert is_stacked(flat) is scan
    mb = _batch()

    def loss(p, rest):  # the frozen state an argument, as in the train step
        built = merge(graphdef, params, p, rest, "fp32")
        return sft_step_loss(built, mb, jnp.float32(T), None)[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(flat, rest)
    return value, unstack_flat(grads)


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
    assert scan_setting("scan", "none") and not scan_setting("loop", "full")
    model = _tiny(("global",) * 2)
    assert scannable(model.layers)
    apply_lora(model, rank=2, alpha=4.0, targets=r"layers/\d+/mlp/up", dropout=0.1,
               rngs=nnx.Rngs(1))
    assert not scannable(model.layers)  # a scan body may not advance the dropout stream


def _step_temp_bytes(layers: int, t: int) -> tuple[int, int]:
    """(temp bytes of one compiled SFT train step, weight bytes of one block): batch 1 x t,
    D=128, FFN 256, remat full, scanned; compiled, never run."""
    from hone.bench.rows import OPTIM
    from hone.recipes.sft import target_tokens
    from hone.train.optimizer import build_optimizer
    from hone.train.state import new_train_state, split_model, train_params
    from hone.train.step import make_train_step
    cfg = preset("smollm2-135m").replace(
        num_layers=layers, layer_types=("global",) * layers, hidden_size=128,
        intermediate_size=256, vocab_size=512, num_heads=4, num_kv_heads=2, head_dim=32)
    net = Transformer(cfg, rngs=nnx.Rngs(0))
    net.remat, net.scan_layers, net.attention = "full", True, "blockwise"
    graphdef, params, frozen = split_model(net, nnx.Param)
    flat = flatten(params)
    optimizer, schedule = build_optimizer(OPTIM)
    state = new_train_state(train_params(net, params), optimizer, 0)  # stored stacked
    step = make_train_step(graphdef, params, sft_step_loss, lambda b: jnp.float32(t),
                           optimizer, schedule, accum=1)
    row = jax.ShapeDtypeStruct((1, t), jnp.int32)
    batch = {"tokens": row, "targets": row, "attention_mask": row, "positions": row,
             "segment_ids": row, "loss_mask": jax.ShapeDtypeStruct((1, t), jnp.float32)}
    temp = step.lower(state, frozen, batch).compile().memory_analysis().temp_size_in_bytes
    block = sum(x.size * 4 for k, x in flat.items() if k.startswith("layers/0/"))
    return temp, block


def test_scanned_remat_keeps_one_hidden_state_per_block():
    """Four blocks more may add, per block, at most: its saved input and one more buffer of
    that size (the backward scan's cotangent), 2 x T x D x 4 bytes, plus one copy of its
    weights. Measured at 1,024 tokens with the weights stored stacked: 1.05 MB per block
    (the two hidden-state buffers and nothing else) against a 1.64 MB bound; 2.95 MB when the
    step stacked per-block weights itself, and the loop of separately rematerialised blocks
    kept 21.6 MB per block at 2,048 tokens (XLA:CPU ran every block's recomputation before
    the backward pass reached it, so all their intermediates lived at once)."""
    t, d = 1024, 128
    temp4, block = _step_temp_bytes(4, t)
    temp8, _ = _step_temp_bytes(8, t)
    per_block = (temp8 - temp4) / 4
    bound = 2 * t * d * 4 + block
    assert per_block <= bound, (per_block, bound)


def test_the_trainer_sets_scan_layers_from_the_config():
    from hone.config import SFTConfig, load_config
    from hone.train.build import prepare_for_training
    for overrides, want in ((["train.remat=full"], True), (["train.remat=none"], False),
                            (["train.remat=full", "train.scan_layers=loop"], False),
                            (["train.scan_layers=scan"], True)):
        model = _tiny(("global",) * 2)
        prepare_for_training(model, load_config(SFTConfig, "configs/tiny/sft.yaml", overrides))
        assert model.scan_layers is want, overrides


def test_a_run_resumes_exactly_across_a_switch_of_scan_layers(tmp_path, monkeypatch):
    """The stored tree is the same either way, so a run saved with the loop continues with the
    scan and the reverse: stopped by SIGTERM mid-run (6 steps), then resumed with the other
    setting, it ends where the uninterrupted run of the first setting ends (losses and every
    weight 1e-5: the two settings round differently, nothing else differs)."""
    import json

    import hone.recipes.sft as sft_recipe
    from hone.config import SFTConfig, load_config
    from hone.recipes.sft import run_sft
    from hone.train.loop import Interrupted
    from preempt import stop_on_batch

    def cfg(run_dir, setting):
        return load_config(SFTConfig, "configs/tiny/sft.yaml", [
            f"run_dir={run_dir}", f"train.scan_layers={setting}", "train.max_steps=6",
            "train.eval_every=0", "data.eval_path=null", "data.max_records=48",
            "checkpoint.every_steps=0", "checkpoint.async_save=false", "log.sinks=[jsonl]"])

    def losses(run_dir):
        return [json.loads(l)["loss"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"loss"' in l]

    for first, then in (("loop", "scan"), ("scan", "loop")):
        straight_dir, split_dir = tmp_path / f"{first}-straight", tmp_path / f"{first}-{then}"
        _, straight = run_sft(cfg(straight_dir, first), log=lambda s: None)
        stop_on_batch(monkeypatch, sft_recipe, at=4)
        with pytest.raises(Interrupted):
            run_sft(cfg(split_dir, first), log=lambda s: None)
        monkeypatch.undo()
        saved = [int(p.name) for p in (split_dir / "checkpoints").iterdir() if p.name.isdigit()]
        assert saved and max(saved) < 6  # stopped mid-run, saved
        _, resumed = run_sft(cfg(split_dir, then), log=lambda s: None)
        np.testing.assert_allclose(losses(split_dir), losses(straight_dir), atol=1e-5, rtol=0)
        assert len(losses(split_dir)) == 6
        for k in straight["params"]:
            np.testing.assert_allclose(np.asarray(resumed["params"][k]),
                                       np.asarray(straight["params"][k]), atol=1e-5, rtol=0,
                                       err_msg=k)


def test_stored_stacks_reach_the_scan_as_they_are():
    """With the parameters stored stacked, the scan reads the stacks: the gradient's program
    stacks no weight going in and slices no gradient coming out (the per-block slices
    `unflatten` makes for the blocks go unused). With per-block storage it does both."""
    import collections
    import re
    from hone.train.state import train_params
    from hone.train.step import merge

    def counts(stored_stacked: bool):
        model = _tiny(("global",) * 4)
        model.remat, model.scan_layers = "full", True
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        flat = train_params(model, params) if stored_stacked else flatten(params)

        def loss(p, rest):
            return sft_step_loss(merge(graphdef, params, p, rest, "fp32"), _batch(),
                                 jnp.float32(T), None)[0]

        text = str(jax.make_jaxpr(jax.value_and_grad(loss))(flat, rest))
        return collections.Counter(re.findall(r"= (\w+)\[", text))

    stored, per_block = counts(True), counts(False)
    assert stored["stack"] == 0 and stored["unstack"] == 0, stored
    assert per_block["stack"] == 9 and per_block["unstack"] == 9, per_block  # 9 leaves a block


def test_logits_from_stored_stacks_equal_the_loop():
    """The forward pass alone: logits of a model built from stacked parameters (scanned over
    the stacks) equal the loop's at 1e-5, for a sliding/global pattern with a ragged tail."""
    from hone.models.stacked import is_stacked
    from hone.train.state import train_params
    from hone.train.step import merge
    model = _tiny(("sliding", "global") * 2 + ("sliding",))
    mb = _batch()
    model.attention, model.attention_block = "blockwise", 8
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    loop = jax.jit(lambda p, r: merge(graphdef, params, p, r, "fp32")(
        mb["tokens"], mb["positions"], mb["attention_mask"]))(flatten(params), rest)
    model.scan_layers = True
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    flat = train_params(model, params)
    assert is_stacked(flat)
    scan = jax.jit(lambda p, r: merge(graphdef, params, p, r, "fp32")(
        mb["tokens"], mb["positions"], mb["attention_mask"]))(flat, rest)
    np.testing.assert_allclose(scan, loop, atol=1e-5, rtol=0)
    assert float(jnp.abs(loop).max()) > 0.1
