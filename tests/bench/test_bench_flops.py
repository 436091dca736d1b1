"""hone/bench/flops.py against numbers worked out by hand on a 2-layer toy config."""

from __future__ import annotations

import pytest

from hone.bench import flops
from hone.models.config import PRESETS, ModelConfig

# V 10, D 4, F 6, L 2, 2 query heads / 1 KV head of size 2, so A = 4 and L x A = 8.
# Per layer: attention 4*4 + 2*4*2 + 4*4 = 48, MLP 3*4*6 = 72, norms 2*4 = 8 -> 128.
# Tied: 10*4 + 2*128 + 4 (final norm) = 300 parameters, all of them matmul parameters
# (the table is the head); untied: 340 parameters, the input table (40) is a gather -> 300.
TOY = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=2, tie_embeddings=True)


def test_matmul_params_count_the_head_once():
    assert flops.matmul_params(TOY) == 300
    assert flops.matmul_params(TOY.replace(tie_embeddings=False)) == 300
    assert flops.attention_width(TOY) == 8


def test_lora_params_by_hand():
    # per layer and rank: q (4+4) + k, v 2*(4+2) + o (4+4) + gate, up, down 3*(4+6) = 58
    assert flops.lora_params(TOY, rank=1) == 2 * 58
    assert flops.lora_params(TOY, rank=3) == 3 * 2 * 58


def test_training_rows_by_hand():
    # per token at T = 3: 6*300 + 12*8*3 = 2088; B x T = 6 tokens
    assert flops.train_flops_per_token(TOY, 3) == 2088
    assert flops.sft_flops(TOY, batch=2, seq=3) == 6 * 2088
    # LoRA with 116 adapter weights: 4*300 + 6*116 + 288 = 2184 per token
    assert flops.sft_flops(TOY, batch=2, seq=3, n_lora=116) == 6 * 2184
    # DPO, 1 pair of 3 tokens: 2 sequences x 3 tokens x (2088 + forward 2*300 + 4*8*3 = 696)
    assert flops.forward_flops_per_token(TOY, 3) == 696
    assert flops.dpo_flops(TOY, pairs=1, seq=3) == 6 * (2088 + 696)
    # Shared prompt, 1 pair of a 1-token prompt + two 2-token answers: a row of S = 5 tokens,
    # head H = 40, body 260, L x A x S = 40. Update (6*260 + 12*40) * 5 = 10200 + head 6*40*4
    # = 960; reference (2*260 + 4*40) * 5 = 3400 + head 2*40*4 = 320.
    assert flops.shared_dpo_flops(TOY, pairs=1, prompt_len=1, completion_len=2) == 14880


def test_decode_and_grpo_by_hand():
    # prefill 3 tokens x (600 + 32*3) = 2088; fed back: 600 + 32*4 = 728, 600 + 32*5 = 760
    assert flops.decode_flops(TOY, batch=2, prompt_len=3, new_tokens=3) == 2 * (2088 + 728 + 760)
    assert flops.decode_flops(TOY, batch=1, prompt_len=3, new_tokens=1) == 2088
    # GRPO, 1 prompt x 2 generations, 3 + 3 tokens: rollout 7152, reference forward
    # 2 x 6 x (600 + 32*6) = 9504, update 2 x 6 x (1800 + 96*6) = 28512
    full = flops.grpo_flops(TOY, 1, 2, 3, 3)
    assert full == 7152 + 9504 + 28512
    assert flops.grpo_flops(TOY, 1, 2, 3, 3, reference=False) == 7152 + 28512
    # Shared prompt: one row of S = 3 + 2*3 = 9 tokens, head H = 40 on the 6 scored slots,
    # body 260, L x A x S = 72. Update (6*260 + 12*72) * 9 + 6*40*6 = 23256; reference
    # (2*260 + 4*72) * 9 + 2*40*6 = 7752.
    assert flops.grpo_flops(TOY, 1, 2, 3, 3, shared_prompt=True) == 7152 + 7752 + 23256


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m"])
def test_matmul_params_of_presets(name):
    cfg = PRESETS[name]
    assert cfg.tie_embeddings
    assert flops.matmul_params(cfg) == cfg.num_params()


def test_lora_params_match_the_adapters_apply_lora_adds():
    import jax
    from flax import nnx

    import hone
    from hone.bench.rows import LORA_ALPHA, LORA_RANK, LORA_TARGETS
    from hone.models.lora import LoRAParam, apply_lora
    model = hone.load_model("tiny")
    apply_lora(model, rank=LORA_RANK, alpha=LORA_ALPHA, targets=LORA_TARGETS, rngs=nnx.Rngs(0))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, LoRAParam)))
    assert count == flops.lora_params(model.config, LORA_RANK)
