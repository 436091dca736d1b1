"""Mixture-of-experts models: each family against transformers (logits, the exported folder;
greedy generation), the grouped dropless compute against every expert computed densely, and
training: the router losses in the step's loss, frozen routers, scanned blocks.

The reference models are tiny and every weight is random (tests/reference.py); the routers'
weights are scaled up so no token's top-k choice is a near tie that float rounding could flip.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from reference import (COMMON, TOL, batch, hf_greedy, hf_logits, max_diff_on_real_tokens,
                       randomize)

import hone
from hone.config import ModelSection, MoeSection, SFTConfig, TrainSection
from hone.losses import sft_loss
from hone.losses.moe import load_balancing_loss, z_loss
from hone.models.config import PRESETS, MoE
from hone.models.moe import RoutedMLP
from hone.models.transformer import pop_router_sums
from hone.sampling.generate import generate
from hone.train.build import prepare_for_training
from hone.train.optimizer import build_optimizer
from hone.train.state import flatten, new_train_state, split_model
from hone.train.step import make_train_step
from hone.weights.hf import load_hf

# Tied and untied embeddings, renormalised and raw top-k weights, a dense layer among routed
# ones (mlp_only_layers, decoder_sparse_step), a shared expert with its gate.
MOE_CASES = {
    "qwen3_moe": (transformers.Qwen3MoeConfig, dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        mlp_only_layers=[1], tie_word_embeddings=True)),
    "mixtral": (transformers.MixtralConfig, dict(
        num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, dict(
        num_experts=4, num_experts_per_tok=3, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, decoder_sparse_step=2, tie_word_embeddings=False)),
}


def moe_reference(name, tmp_path):
    cls, extra = MOE_CASES[name]
    config = cls(**COMMON, **extra)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    with torch.no_grad():  # routers (not the shared expert's gate): clear top-k margins
        for n, p in model.named_parameters():
            if n.endswith(".gate.weight"):
                p.mul_(10)
    model.eval()
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return model, folder


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens, mask):
    return nnx.merge(graphdef, state)(tokens, attention_mask=mask)


def logits_of(model, tokens, mask) -> np.ndarray:
    """The model's logits, jitted (op-by-op, the routed MLPs' many small ops take seconds)."""
    return np.asarray(_logits(*nnx.split(model), tokens, mask))


@pytest.mark.parametrize("name", list(MOE_CASES))
def test_family_matches_transformers(name, tmp_path):
    """fp32 logits on a padded batch, and the exported folder: transformers loads it with
    equal logits, hone reads it back bit for bit."""
    ref, folder = moe_reference(name, tmp_path)
    tokens, mask, positions = batch()
    model = hone.load_model(folder, dtype="float32")
    assert model.config.moe is not None
    ours = logits_of(model, tokens, mask)
    assert max_diff_on_real_tokens(ours, hf_logits(ref, tokens, mask, positions), mask) <= TOL

    out = hone.save_hf(model, tmp_path / "export")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager").eval()
    assert max_diff_on_real_tokens(hf_logits(reloaded, tokens, mask, positions), ours,
                                   mask) <= TOL
    again = load_hf(out)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", list(MOE_CASES))
def test_greedy_generation_matches_transformers(name, tmp_path):
    """The KV-cache sampler on 8 prompts equals transformers' greedy generate, for each
    family: renormalised and raw top-k weights, dense layers among routed ones, tied and
    untied heads, and Qwen2-MoE's shared expert (which the CPU decode kernel packs like any
    gated MLP) each reach decode through a different path."""
    ref, folder = moe_reference(name, tmp_path)
    model = hone.load_model(folder)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, COMMON["vocab_size"], rng.integers(1, 9)).tolist()
               for _ in range(8)]
    outs = generate(model, None, prompts, max_new_tokens=6, eos_ids=())
    assert [o.tokens for o in outs] == hf_greedy(ref, prompts, 6)


def test_reads_transformers_fused_expert_tensors(tmp_path):
    """transformers 5 holds experts fused (mlp.experts.gate_up_proj [E, 2F, D], down_proj
    [E, D, F]; Mixtral's block_sparse_moe renamed mlp) and writes that layout with
    save_pretrained(save_original_format=False): hone reads those folders too."""
    ref, folder = moe_reference("mixtral", tmp_path)
    ref.save_pretrained(tmp_path / "fused", save_original_format=False)
    fused = hone.load_model(str(tmp_path / "fused"))
    per_expert = hone.load_model(folder)
    for a, b in zip(jax.tree.leaves(nnx.state(fused)), jax.tree.leaves(nnx.state(per_expert))):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# 32 (token, expert) pairs over 8 experts: ragged_dot, and the CPU tile loop (tiles of 8 rows,
# so experts' padding rows are exercised); 2 pairs (decode): the tile loop whatever the backend.
@pytest.mark.parametrize("tokens,method", [(16, "ragged"), (16, "tiles"), (1, None)])
def test_grouped_experts_equal_every_expert_computed_densely(tokens, method):
    """The dropless grouped compute equals every expert on every token weighted by the sparse
    top-k weights: outputs and the gradients of every weight and of the input."""
    cfg = PRESETS["tiny-moe"]
    mlp = RoutedMLP(cfg.replace(moe=MoE(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False,
        shared_expert_intermediate_size=8)), jnp.float32, nnx.Rngs(1))
    mlp.method = method
    x = jax.random.normal(jax.random.key(0), (1, tokens, cfg.hidden_size))
    cot = jax.random.normal(jax.random.key(1), (1, tokens, cfg.hidden_size))

    def run(grouped):
        mlp.grouped = grouped
        graphdef, state = nnx.split(mlp)

        def f(state, x):
            return jnp.sum(nnx.merge(graphdef, state)(x) * cot)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(state, x)

    (v1, (g1, gx1)), (v2, (g2, gx2)) = run(True), run(False)
    assert abs(float(v1) - float(v2)) <= 1e-5 * max(1.0, abs(float(v2)))
    for a, b in zip(jax.tree.leaves((g1, gx1)), jax.tree.leaves((g2, gx2))):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5


TRAIN = dict(lr=1e-2, warmup_steps=0, max_steps=4)


def lm_loss(model, mb, normalizer, key, aux=None):
    logits = model(mb["tokens"], attention_mask=mb["attention_mask"])
    return sft_loss(logits, mb["targets"], mb["loss_mask"], normalizer)


def test_sft_step_adds_router_losses_and_freezes_routers():
    """One SFT step of the tiny MoE: the step's loss is the token-mean NLL plus
    aux_loss_coef x load balancing + z_loss_coef x z-loss of the same forward pass (which a
    scanned, rematerialised forward records identically), and with freeze_router the routers
    keep their weights while the experts train."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 264, (4, 12)).astype(np.int32)
    mask = np.ones((4, 12), np.int32)
    mask[1, 7:] = 0
    b = {"tokens": tokens, "targets": np.roll(tokens, -1, 1), "attention_mask": mask,
         "loss_mask": mask.astype(np.float32)}
    cfg = SFTConfig(model=ModelSection(source="tiny-moe", moe=MoeSection(
        aux_loss_coef=0.5, z_loss_coef=0.1, freeze_router=True)), train=TrainSection(**TRAIN))
    model = hone.load_model("tiny-moe")
    trainable = prepare_for_training(model, cfg)
    graphdef, params, frozen = split_model(model, trainable)
    assert not any("router" in k for k in flatten(params))
    router = np.asarray(model.layers[0].mlp.router[...])
    gate = np.asarray(model.layers[0].mlp.gate[...])

    # the same forward pass outside the step: NLL and router sums, looped and scanned blocks
    @jax.jit
    def forward(state):
        m = nnx.merge(full_graphdef, state)
        nll = lm_loss(m, b, jnp.float32(mask.sum()), None)[0]
        looped = pop_router_sums(m)[0][1]
        m.scan_layers, m.remat = True, "full"
        m(tokens, attention_mask=mask)
        return nll, looped, pop_router_sums(m)[0][1]

    full_graphdef, full_state = nnx.split(model)
    nll, sums, scanned = forward(full_state)
    for key in sums:
        assert np.allclose(np.asarray(sums[key]), np.asarray(scanned[key]), rtol=1e-6), key
    nll, aux, z = float(nll), float(load_balancing_loss(sums)), float(z_loss(sums))

    opt, sched = build_optimizer(cfg.train)
    state = new_train_state(flatten(params), opt, seed=0)
    step = make_train_step(graphdef, params, lm_loss,
                           lambda batch: jnp.sum(batch["loss_mask"]), opt, sched, accum=1)
    state, metrics = step(state, frozen, b)
    assert float(metrics["moe/aux_loss"]) == pytest.approx(aux, rel=1e-5)
    assert float(metrics["moe/z_loss"]) == pytest.approx(z, rel=1e-5)
    assert float(metrics["loss"]) == pytest.approx(nll + 0.5 * aux + 0.1 * z, rel=1e-5)
    assert float(metrics["moe/dropped"]) == 0.0
    # a uniform router would score k = 2; these random ones are not far off
    assert 1.0 < aux < 4.0
    assert np.array_equal(np.asarray(frozen["layers"][0]["mlp"]["router"][...]), router)
    assert not np.array_equal(np.asarray(state["params"]["layers/0/mlp/gate"]), gate)
