"""The reference model's one rule (hone/train/reference.py): "adapters_off" is the frozen base,
every LoRA adapter zeroed, not only the trainable ones. With `model.train_layers: 1` only the top
block's adapters train; here the lower block's adapters are NONZERO too (as a PEFT start or an
earlier run leaves them), and every path that builds a reference (the builder DPO calls, GRPO's
and PPO's in-step scoring, a reference on devices of its own) gives the base model's
log-probabilities."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.config import DPOConfig, GRPOConfig, PPOConfig, load_config
from hone.losses import token_logprobs
from hone.models.lora import LoRAParam
from hone.recipes import grpo, ppo
from hone.rl.critic import build_ppo_model
from hone.rl.remote_reference import RemoteReference
from hone.train.build import build_model
from hone.train.reference import reference_mode, reference_model
from hone.train.state import flatten, split_model
from hone.weights.loading import load_model

ROOT = Path(__file__).resolve().parents[2]
P, M = 6, 4  # prompt slots, completion slots: rows of P + M tokens
SMALL = ["model.lora.rank=4", "model.train_layers=1", "train.batch_size=2"]


def rl_config(cls, name):
    """The tiny config of `name` (grpo, ppo) at rows of P + M slots, the two rows one group."""
    return load_config(cls, str(ROOT / f"configs/tiny/{name}.yaml"), SMALL + [
        f"{name}.reference=adapters_off", f"{name}.group_size=2",
        f"{name}.max_prompt_tokens={P}", f"{name}.max_new_tokens={M}"])


def lower_adapters_nonzero(model) -> None:
    """Every LoRA adapter random (lora_b starts at 0), the untrained lower block's included."""
    graphdef, lora, rest = nnx.split(model, LoRAParam, ...)
    keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(lora))))
    lora = jax.tree.map(lambda x: 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), lora)
    nnx.update(model, lora)


def rows() -> dict:
    """Two rollout rows [2, P + M]: prompts left-padded to P, completions of 4 and 2 tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 200, (2, P + M)).astype(np.int32)
    mask = np.ones((2, P + M), np.int32)
    mask[0, :2] = mask[1, :1] = 0  # left padding
    mask[1, P + 2:] = 0  # a completion of 2 tokens
    loss = np.zeros((2, P + M), np.float32)
    loss[0, P - 1:P - 1 + 4], loss[1, P - 1:P - 1 + 2] = 1.0, 1.0
    return {"tokens": tokens, "attention_mask": mask,
            "positions": np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32),
            "targets": np.concatenate([tokens[:, 1:], np.zeros((2, 1), np.int32)], axis=1),
            "loss_mask": loss, "sampler_logp": np.zeros((2, P + M), np.float32),
            "scores": np.zeros(2, np.float32)}


@pytest.fixture(scope="module")
def base_logp():
    """The base model's log-probabilities of the rows' targets [2, L], on the completions."""
    batch = rows()
    logits = load_model("tiny")(batch["tokens"], positions=batch["positions"],
                                attention_mask=batch["attention_mask"])
    return np.asarray(token_logprobs(logits, batch["targets"])) * batch["loss_mask"]


def check(logp, base) -> None:
    np.testing.assert_allclose(np.asarray(logp) * rows()["loss_mask"], base, rtol=0, atol=1e-5)


def test_every_reference_path_is_the_base_model(base_logp):
    cfg = rl_config(GRPOConfig, "grpo")
    model, trainable = build_model(cfg)
    lower_adapters_nonzero(model)
    graphdef, params, frozen = split_model(model, trainable)
    assert params and all(k.startswith("layers/1/") for k in flatten(params))
    batch = rows()
    # The policy itself is not the base: the lower block's adapters change its log-probs.
    policy = token_logprobs(model(batch["tokens"], positions=batch["positions"],
                                  attention_mask=batch["attention_mask"]), batch["targets"])
    assert np.max(np.abs(np.asarray(policy) * batch["loss_mask"] - base_logp)) > 1e-3

    # The builder (what DPO's loss and precomputed mode call).
    ref = reference_model(model, "adapters_off")
    check(token_logprobs(ref(batch["tokens"], positions=batch["positions"],
                             attention_mask=batch["attention_mask"]), batch["targets"]),
          base_logp)

    # GRPO's in-step scoring.
    state = {"params": flatten(params)}
    scored, _ = grpo.make_scoring(cfg, graphdef, params, "adapters_off")(state, frozen, batch,
                                                                         None)
    check(scored["ref_logp"], base_logp)

    # A reference on devices of its own (one device here: the program is the same).
    remote = RemoteReference(cfg, graphdef, params, frozen, "adapters_off", state["params"],
                             jax.devices()[:1])
    check(remote(batch), base_logp)

    # PPO's in-step scoring, on the policy of an actor-critic.
    pcfg = rl_config(PPOConfig, "ppo")
    ac, ac_trainable, _ = build_ppo_model(pcfg)
    lower_adapters_nonzero(ac.policy)
    ac_graphdef, ac_params, ac_frozen = split_model(ac, ac_trainable)
    score, _ = ppo.make_scoring(pcfg, ac_graphdef, ac_params, "adapters_off")
    out, _ = score({"params": flatten(ac_params), "kl_coef": jnp.float32(0.1)}, ac_frozen,
                   batch, None)
    check(out["ref_logp"], base_logp)


def test_one_mode_rule_for_dpo_grpo_and_ppo():
    dpo = lambda *o: load_config(DPOConfig, None, ["model.source=tiny", *o])  # noqa: E731
    assert reference_mode(dpo()) == "copy"
    assert reference_mode(dpo("model.lora.rank=4")) == "adapters_off"
    assert reference_mode(dpo("dpo.loss_type=simpo")) is None  # reference-free losses
    assert reference_mode(dpo("dpo.loss_type=orpo", "model.lora.rank=4")) is None
    assert reference_mode(rl_config(GRPOConfig, "grpo")) == "adapters_off"
    assert reference_mode(load_config(GRPOConfig, None, ["grpo.beta=0"])) is None
    assert reference_mode(load_config(PPOConfig, None, ["ppo.kl_coef=0"])) is None
    assert reference_mode(load_config(PPOConfig, None, ["ppo.reference=ema"])) == "ema"
