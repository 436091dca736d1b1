"""LoRA adapters on Linear: identity at start, exact merge, only adapters train, PEFT round trip.

The PEFT round trip builds a small random model with transformers, loads it into hone, adapts
it with random (non-zero) B, exports the adapters with save_peft and checks that
peft.PeftModel.from_pretrained reproduces hone's logits; the merged model exported with save_hf
must reproduce them in plain transformers too.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from reference import TOL, batch, hf_logits, hf_model, max_diff_on_real_tokens

import hone
from hone.models.config import ModelConfig
from hone.models.lora import (LoRAParam, apply_lora, linears, lora_modules, lora_state,
                              merge_lora)
from hone.models.quant import QuantizedKernel
from hone.models.transformer import Transformer
from hone.weights.peft import save_peft

CFG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 97, (2, 9)), jnp.int32)
QV = r"layers/\d+/attn/(q|v)"


def randomize_b(model, seed=1, std=0.2):
    """Give every adapter a non-zero B so the update is visible."""
    key = jax.random.key(seed)
    for lin in lora_modules(model).values():
        key, sub = jax.random.split(key)
        b = lin.lora.lora_b
        b[...] = (std * jax.random.normal(sub, b.shape)).astype(b.dtype)


def frozen(model):
    """Every non-adapter array (base parameters and quantized storage)."""
    return nnx.state(model, nnx.Any(nnx.All(nnx.Param, nnx.Not(LoRAParam)), QuantizedKernel))


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_zero_b_is_identity_and_merge_is_exact(quantize):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    before = model(TOKENS)
    apply_lora(model, rank=4, alpha=8.0, targets=r"layers/\d+/(attn/.|mlp/down)|lm_head",
               quantize=quantize, rngs=nnx.Rngs(1))
    adapted = model(TOKENS)
    if quantize == "none":
        assert np.array_equal(np.asarray(adapted), np.asarray(before))  # B = 0: exactly the same
    randomize_b(model)
    after = model(TOKENS)
    assert float(jnp.abs(after - adapted).max()) > 1e-2
    merged = merge_lora(model)
    assert not lora_modules(merged) and lora_modules(model)  # a copy; the original still adapted
    assert not nnx.state(merged, LoRAParam) and not nnx.state(merged, QuantizedKernel)
    assert float(jnp.abs(merged(TOKENS) - after).max()) <= 1e-5


def test_trainable_set_is_exactly_the_adapters():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    apply_lora(model, rank=2, alpha=4.0, targets=QV, rngs=nnx.Rngs(1))
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(lora_state(model))}
    assert paths == {f"layers/{i}/attn/{x}/lora/lora_{m}"
                     for i in range(2) for x in "qv" for m in "ab"}
    a, b = model.layers[0].attn.v.lora.lora_a, model.layers[0].attn.v.lora.lora_b
    assert a.shape == (64, 2) and b.shape == (2, 2 * 16)
    assert a.out_sharding == ("embed", "lora_rank") and b.out_sharding == ("lora_rank", "kv_heads")
    assert np.all(np.abs(np.asarray(a[...])) <= 1 / np.sqrt(64)) and not np.any(b[...])


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_gradient_step_changes_only_adapters(quantize):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    apply_lora(model, rank=4, alpha=8.0, targets=r"layers/\d+/(attn/(q|v)|mlp/.*)",
               quantize=quantize, rngs=nnx.Rngs(1))
    base = jax.tree.map(np.array, frozen(model))
    adapters = jax.tree.map(np.array, lora_state(model))

    def loss(model, tokens):
        logp = jax.nn.log_softmax(model(tokens[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    @nnx.jit
    def step(model, tokens):
        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, LoRAParam))(model, tokens)
        params = nnx.state(model, LoRAParam)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads))
        return value

    losses = [float(step(model, TOKENS)) for _ in range(3)]
    assert losses[-1] < losses[0]
    for (p, x), (_, y) in zip(nnx.to_flat_state(base), nnx.to_flat_state(frozen(model))):
        assert np.array_equal(x[...], np.asarray(y[...])), p  # bit-identical base
    changed = [not np.array_equal(x[...], np.asarray(y[...])) for (_, x), (_, y) in
               zip(nnx.to_flat_state(adapters), nnx.to_flat_state(lora_state(model)))]
    assert all(changed)


def test_dropout_only_in_training_and_reseedable():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    apply_lora(model, rank=4, alpha=8.0, targets=QV, dropout=0.5, rngs=nnx.Rngs(1, dropout=2))
    randomize_b(model)
    a, b = model(TOKENS), model(TOKENS)
    assert np.array_equal(np.asarray(a), np.asarray(b))  # eval by default: no dropout
    model.train()
    nnx.reseed(model, dropout=7)
    c = model(TOKENS)
    d = model(TOKENS)  # the one shared stream advanced: new masks
    nnx.reseed(model, dropout=7)
    e = model(TOKENS)
    assert not np.allclose(c, a) and not np.allclose(c, d)
    assert np.array_equal(np.asarray(c), np.asarray(e))
    # one stream for the whole model, not one per adapter
    assert len(nnx.to_flat_state(nnx.state(model, nnx.RngKey))) == 1
    model.eval()
    assert np.array_equal(np.asarray(model(TOKENS)), np.asarray(a))


@pytest.mark.parametrize("targets", [r"layers/9/attn/q", r"attn/q", r"(unclosed"])
def test_targets_matching_nothing_is_an_input_error(targets):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    with pytest.raises(hone.InputError) as err:
        apply_lora(model, rank=4, alpha=8.0, targets=targets, rngs=nnx.Rngs(1))
    assert err.value.key == "model.lora.targets"
    assert not lora_modules(model)


def test_module_paths():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    assert set(linears(model)) == {f"layers/{i}/{m}" for i in range(2) for m in
                                   ["attn/q", "attn/k", "attn/v", "attn/o", "mlp/gate",
                                    "mlp/up", "mlp/down"]} | {"lm_head"}


# Llama: every projection and lm_head (PEFT gets leaf names); Gemma 3: a scattered subset
# (PEFT gets a regex of exact module names).
PEFT_CASES = {
    "llama": (r".*", 0.05),
    "gemma3_text": (r"layers/0/attn/(q|o)|layers/2/attn/v|layers/1/mlp/(up|down)", 0.0),
}


@pytest.mark.parametrize("name", list(PEFT_CASES))
def test_peft_and_merged_exports_match_hone(name, tmp_path):
    import peft

    targets, dropout = PEFT_CASES[name]
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch(seed=2)
    model = hone.load_model(folder)
    apply_lora(model, rank=4, alpha=16.0, targets=targets, dropout=dropout, rngs=nnx.Rngs(3))
    randomize_b(model, std=0.3)
    ours = np.asarray(model(tokens, attention_mask=mask))
    plain = hf_logits(ref, tokens, mask, positions)
    assert max_diff_on_real_tokens(ours, plain, mask) > 1e-2  # the adapters matter

    adapter = save_peft(model, tmp_path / "adapter", base_model_name_or_path=folder)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 16.0)
    if name == "llama":
        assert config["target_modules"] == sorted(
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
             "lm_head"])
    peft_model = peft.PeftModel.from_pretrained(ref, str(adapter)).eval()
    injected = {n.removesuffix(".lora_A") for n, _ in peft_model.named_modules()
                if n.endswith(".lora_A")}
    assert len(injected) == len(lora_modules(model))
    assert max_diff_on_real_tokens(hf_logits(peft_model, tokens, mask, positions), ours,
                                   mask) <= TOL

    merged = hone.save_hf(merge_lora(model), tmp_path / "merged")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(merged), dtype=torch.float32, attn_implementation="eager").eval()
    assert max_diff_on_real_tokens(hf_logits(reloaded, tokens, mask, positions), ours,
                                   mask) <= TOL


def test_save_peft_needs_adapters(tmp_path):
    with pytest.raises(hone.InputError):
        save_peft(Transformer(CFG, rngs=nnx.Rngs(0)), tmp_path / "a", "base")
    assert not (tmp_path / "a").exists()
