"""The Tunix side the *_tunix.py benchmarks share: the SmolLM2-135M-shaped Llama3, its frozen
reference copy, the AdamW every trainer gets, a token-id tokenizer and the timing of a Tunix
trainer's jitted step.

Imported only inside the Tunix venv (benchmarks/.venvs/tunix, see _venvs.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from tunix.models.llama3 import model as llama3_lib

from _measure import finite, first_and_median

PAD_ID = 0     # never in a prompt (prompt ids are drawn from 1..vocab-1)
NO_EOS = -1    # an id the model cannot produce: generation always runs to its full length


def smollm2_135m_config(sampling: bool = False) -> llama3_lib.ModelConfig:
    return llama3_lib.ModelConfig(
        num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9,
        head_dim=64, num_kv_heads=3, rope_theta=100_000, norm_eps=1e-5, weight_tying=True,
        shd_config=llama3_lib.ShardingConfig.get_default_sharding(is_sampling=sampling))


def new_model(seed: int, sampling: bool = False) -> llama3_lib.Llama3:
    """Llama3 with the SmolLM2-135M shape, random init from `seed`, checked to be all fp32;
    its config is model.config."""
    model = llama3_lib.Llama3(smollm2_135m_config(sampling), rngs=nnx.Rngs(seed))
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    return model


def reference_copy(model: llama3_lib.Llama3) -> llama3_lib.Llama3:
    """The reference: same structure, its own copy of every initial array."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def adamw() -> optax.GradientTransformation:
    """AdamW as in the hone and PyTorch scripts, after global-norm clipping at 1.0."""
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01))


def time_train_step(call, repeats: int):
    """first_and_median of call() -> a Tunix train step's (loss, aux, grad_norm), each call
    timed until loss and grad norm are ready; the third item is the first call's loss."""
    return first_and_median(call, repeats, wait=lambda out: jax.block_until_ready(
        (out[0], out[2])), value=lambda out: finite(out[0]))


class IdTokenizer:
    """The methods Tunix's TokenizerAdapter requires; a text is its ids joined by spaces."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs) -> str:
        return " ".join(str(int(t)) for t in ids)

    def bos_id(self):
        return None  # falsy: no BOS is added

    def eos_id(self) -> int:
        return NO_EOS

    def pad_id(self) -> int:
        return PAD_ID
