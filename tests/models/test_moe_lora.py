"""LoRA and QLoRA on a mixture-of-experts model's routed experts (hone/models/lora.py,
ExpertLoRA; hone/models/grouped.py): zero-initialised adapters leave the model as it was, a step
trains only adapters, merging folds them into the stacked experts exactly, NF4 experts stay
within NF4's rounding, and a PEFT export of expert adapters is refused with a reason.

One tiny-moe model (8 experts, top-2) and one QLoRA step shared by the tests (module fixture):
a step compiles in about 10 s, so full-precision adapters are checked by their forward pass
against the reference (adapters folded into the weights) and the step runs once, quantized.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import hone
from hone.config import LoraSection, ModelSection, SFTConfig, TrainSection
from hone.errors import InputError
from hone.models.lora import apply_lora, expert_lora_modules, merge_lora
from hone.models.quant import NF4_LEVELS
from hone.recipes.sft import sft_step_loss, target_tokens
from hone.train.build import prepare_for_training
from hone.train.optimizer import build_optimizer
from hone.train.state import flatten, new_train_state, split_model, unflatten
from hone.train.step import make_train_step
from hone.weights.peft import save_peft

EXPERTS = r".*/(attn/(q|v)|mlp/experts/(gate|up|down))"
TOKENS = np.random.default_rng(0).integers(3, 264, (2, 10)).astype(np.int32)


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens):
    return nnx.merge(graphdef, state)(tokens)


def logits_of(model) -> np.ndarray:
    return np.asarray(_logits(*nnx.split(model), TOKENS))


def batch() -> dict:
    return {"tokens": TOKENS, "targets": np.roll(TOKENS, -1, 1),
            "attention_mask": np.ones_like(TOKENS),
            "positions": np.broadcast_to(np.arange(TOKENS.shape[1], dtype=np.int32), TOKENS.shape),
            "loss_mask": np.ones(TOKENS.shape, np.float32)}


def one_step(quantize: str):
    """(model after one SFT step with adapters on attention and every expert, its logits before
    the step, the step's params before and after)."""
    cfg = SFTConfig(model=ModelSection(source="tiny-moe", lora=LoraSection(
        rank=4, alpha=8.0, targets=EXPERTS, quantize=quantize)),
        train=TrainSection(lr=1e-2, warmup_steps=0, max_steps=2))
    model = hone.load_model("tiny-moe")
    trainable = prepare_for_training(model, cfg)
    before = logits_of(model)
    graphdef, params, frozen = split_model(model, trainable)
    opt, sched = build_optimizer(cfg.train)
    flat = flatten(params)
    start = {k: np.asarray(v) for k, v in flat.items()}
    state = new_train_state(flat, opt, seed=0)
    step = make_train_step(graphdef, params, sft_step_loss, target_tokens, opt, sched, accum=1)
    state, metrics = step(state, frozen, batch())
    assert np.isfinite(float(metrics["loss"]))
    after = {k: np.asarray(v) for k, v in state["params"].items()}
    model = nnx.merge(graphdef, unflatten(params, state["params"]), frozen)
    return model, before, start, after


@pytest.fixture(scope="module")
def stepped():
    """One QLoRA step (NF4 experts and attention): one step's compile serves every test."""
    return one_step("nf4")


def test_default_targets_leave_experts_alone_and_zero_adapters_change_nothing():
    """The default targets adapt attention (and dense MLPs) but not routed experts; named, the
    experts get adapters whose zero B leaves the logits as they were, bit for bit."""
    model = hone.load_model("tiny-moe")
    base = logits_of(model)
    apply_lora(model, rank=4, alpha=8.0, targets=LoraSection().targets, rngs=nnx.Rngs(0))
    assert not expert_lora_modules(model)
    model = hone.load_model("tiny-moe")
    apply_lora(model, rank=4, alpha=8.0, targets=EXPERTS, rngs=nnx.Rngs(0))
    assert sorted(expert_lora_modules(model)) == sorted(
        f"layers/{i}/mlp/experts/{p}" for i in range(2) for p in ("gate", "up", "down"))
    assert model.layers[0].mlp.lora.gate.lora_a[...].shape == (8, 64, 4)  # [E, D, r]
    assert model.layers[0].mlp.lora.down.lora_b[...].shape == (8, 4, 64)  # [E, r, D]
    assert np.array_equal(logits_of(model), base)
    # Non-zero B: the grouped compute with adapters (tile loop) equals every expert computed
    # densely with A @ B * alpha / r folded into its weights.
    for i, (mlp, name) in enumerate(expert_lora_modules(model).values()):
        b = mlp.adapter(name).lora_b
        b[...] = 0.1 * jax.random.normal(jax.random.key(i), b[...].shape)
    adapted = logits_of(model)
    assert np.abs(adapted - base).max() > 1e-2
    for layer in model.layers:
        layer.mlp.grouped = False
    assert np.abs(logits_of(model) - adapted).max() <= 1e-5


def test_step_trains_only_adapters_and_merge_equals_adapted(stepped, tmp_path):
    """The step's parameters are adapters only, and every expert adapter's B moved (the
    gradient reached them through the grouped compute over NF4 experts); the merged model
    (dequantized W + A B alpha/r per expert) has the adapted model's logits within 1e-5; a PEFT
    export of expert adapters is refused with the reason."""
    model, before, start, after = stepped
    assert all("lora_" in k for k in after)
    for layer in range(2):
        for p in ("gate", "up", "down"):
            key = f"layers/{layer}/mlp/lora/{p}/lora_b"
            assert not np.array_equal(after[key], start[key]), key
    adapted = logits_of(model)
    assert np.abs(adapted - before).max() > 1e-3  # the step changed the model
    merged = merge_lora(model)
    assert merged.layers[0].mlp.lora is None and merged.layers[0].mlp.quant is None
    assert np.abs(logits_of(merged) - adapted).max() <= 1e-5
    with pytest.raises(InputError, match="target_parameters"):
        save_peft(model, tmp_path / "peft", "tiny-moe")


def test_qlora_nf4_experts_dequantize_within_rounding(stepped):
    """NF4 expert storage: each weight within half the widest gap between NF4 levels of its
    block's absmax, and the grouped compute (dequantizing one expert at a time) equals every
    expert computed densely from the dequantized weights, adapters folded in."""
    w = np.asarray(hone.load_model("tiny-moe").layers[0].mlp.up[...])  # [E, D, F]
    model = stepped[0]
    mlp = model.layers[0].mlp
    assert mlp.up is None and mlp.quant.up.codes[...].dtype == jnp.uint8
    deq = np.asarray(mlp.quant.up.dequantize(jnp.float32))
    pad = ((0, 0), (0, 0), (0, -w.shape[2] % 64))  # blocks: 64 weights of a row (F padded)
    blocks = lambda a: np.pad(a, pad).reshape(8, 64, -1, 64)  # noqa: E731 [E, D, blocks, 64]
    absmax = np.abs(blocks(w)).max(-1, keepdims=True)
    half_gap = np.diff(NF4_LEVELS).max() / 2
    assert (np.abs(blocks(deq) - blocks(w)) <= absmax * half_gap + 1e-7).all()
    assert 0 < np.abs(deq - w).max()
    grouped = logits_of(model)
    for layer in model.layers:
        layer.mlp.grouped = False
    assert np.abs(logits_of(model) - grouped).max() <= 1e-5
