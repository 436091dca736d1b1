"""The PyTorch side the *_torch.py benchmarks share: the SmolLM2-135M-shaped transformers
LlamaForCausalLM (sdpa attention, fp32), the AdamW every script uses and one optimizer step.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS_ID = PAD_ID = 2  # SmolLM2's


def smollm2_135m_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                       attn_implementation="sdpa")


def new_model(seed: int) -> LlamaForCausalLM:
    """torch.manual_seed(seed), then the model, random init, checked to be fp32 with sdpa."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(smollm2_135m_config()).to(torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def adamw(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def optimizer_step(loss: torch.Tensor, params, opt: torch.optim.Optimizer) -> float:
    """backward, clip_grad_norm_(params, 1.0), opt.step(), zero_grad; returns loss.item()."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()
