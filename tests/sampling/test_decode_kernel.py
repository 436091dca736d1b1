"""The sampler's CPU decode kernel (hone/kernels): the same completions as XLA's products, for
plain, LoRA and NF4-quantized models, and packed weights reused exactly while the model's
arrays are the same ones."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest
from flax import nnx

from hone.models.config import ModelConfig
from hone.models.lora import apply_lora, lora_modules
from hone.models.transformer import Transformer
from hone.sampling import engine
from hone.sampling.generate import generate

TOL = 1e-5  # float32 sums in another order; fixed, never loosened

CFG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True)
UNTIED = ModelConfig(vocab_size=101, hidden_size=48, intermediate_size=80, num_layers=2,
                     num_heads=2, num_kv_heads=1, head_dim=24)


def _prompts(n=9, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 97, rng.integers(1, 11)).tolist() for _ in range(n)]


def _model(kind):
    if kind == "untied":
        return Transformer(UNTIED, rngs=nnx.Rngs(2))
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    if kind in ("lora", "nf4"):
        apply_lora(model, rank=4, alpha=8.0, targets=r"layers/\d+/(attn/.|mlp/.*)",
                   quantize="nf4" if kind == "nf4" else "none", rngs=nnx.Rngs(1))
        key = jax.random.key(3)
        for lin in lora_modules(model).values():
            key, sub = jax.random.split(key)
            lin.lora.lora_b[...] = 0.2 * jax.random.normal(sub, lin.lora.lora_b.shape)
    return model


def _run(model, **kw):
    outs = generate(model, None, _prompts(), max_new_tokens=12, eos_ids=(), **kw)
    return [o.tokens for o in outs], [np.array(o.logprobs) for o in outs]


@pytest.mark.parametrize("kind", ["tied", "untied", "lora", "nf4"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kernel_and_xla_products_agree(kind, temperature, monkeypatch):
    model = _model(kind)
    graphdef, params = engine.split_for_sampling(model)
    packed = engine.pack_weights(graphdef, params)
    linears = [m for _, m in nnx.iter_modules(model) if type(m).__name__ == "Linear"]
    # q, k and v are one entry per layer, and so are gate and up where neither has LoRA; + the
    # tied table
    layers = model.config.num_layers
    fused = 2 * layers + (layers if kind in ("tied", "untied") else 0)
    assert len(packed) == len(linears) - fused + (kind != "untied")
    toks, lps = _run(model, temperature=temperature, seed=5)
    monkeypatch.setattr(engine.packed_kernel, "usable", lambda tree: False)
    want_toks, want_lps = _run(model, temperature=temperature, seed=5)
    assert toks == want_toks
    assert max(np.abs(a - b).max() for a, b in zip(lps, want_lps)) <= TOL


def test_packed_weights_are_reused_only_for_the_same_arrays():
    model = _model("tied")
    graphdef, params = engine.split_for_sampling(model)
    first = engine.pack_weights(graphdef, params)
    assert engine.pack_weights(*engine.split_for_sampling(model)) is first  # same arrays: no repack
    traces = engine.TRACES["pack"]
    model.layers[0].mlp.down.kernel[...] = model.layers[0].mlp.down.kernel[...] * 2.0  # update
    graphdef, params = engine.split_for_sampling(model)
    second = engine.pack_weights(graphdef, params)
    assert second is not first and engine.TRACES["pack"] == traces  # repacked, not recompiled
    key = "layers/0/mlp/down"
    np.testing.assert_array_equal(np.asarray(second[key]), 2.0 * np.asarray(first[key]))
    del model, params, first, second
    gc.collect()
    assert not engine._LAST  # the panels go with the weights they were packed from
