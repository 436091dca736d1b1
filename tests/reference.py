"""Reference models built with transformers, shared by the parity tests.

Each case is a small random model of one family (GQA, odd head counts, a sliding window shorter
than the test sequences where the family has one). Every weight, norms and biases included, is
randomised so no term can hide behind a zero.
"""

import numpy as np
import torch
import transformers

TOL = 1e-4  # fixed; never loosened

COMMON = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
              num_attention_heads=3, num_key_value_heads=1, head_dim=16,
              max_position_embeddings=64)
SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]

CASES = {
    "llama": (transformers.LlamaConfig, dict(
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8))),
    "llama-tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True, rope_theta=1e5)),
    "qwen2": (transformers.Qwen2Config, dict(rope_theta=1e6, tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, dict(rope_theta=1e6, tie_word_embeddings=True)),
    "gemma": (transformers.GemmaConfig, dict()),
    "gemma2": (transformers.Gemma2Config, dict(sliding_window=4, layer_types=SLIDING,
                                               query_pre_attn_scalar=24)),
    "gemma3_text": (transformers.Gemma3TextConfig, dict(
        sliding_window=4, layer_types=SLIDING, query_pre_attn_scalar=24,
        rope_scaling=dict(rope_type="linear", factor=8.0))),
}


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def batch(seed: int = 0, b: int = 3, t: int = 12):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, COMMON["vocab_size"], (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    mask[1, -4:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, mask, positions


def hf_model(name: str, tmp_path) -> tuple[torch.nn.Module, str]:
    cls, extra = CASES[name]
    config = cls(**COMMON, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.eval()
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return model, folder


def hf_greedy(ref, prompts, new_tokens) -> list[list[int]]:
    """transformers' greedy continuation of left-padded prompts: exactly `new_tokens` ids each
    (no EOS stop), as hone's generate is compared against."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return out[:, width:].tolist()


def hf_logits(model, tokens, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()


def max_diff_on_real_tokens(a, b, mask) -> float:
    real = mask.astype(bool)
    return float(np.abs(a[real] - b[real]).max())


