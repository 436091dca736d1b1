"""Model FLOPs of one benchmark step, from the architecture alone (what `mfu` divides).

Letters: N = matmul parameters (below), L = layers, A = query heads x head dim (the attention
width), T = sequence length, P = prompt length, M = new tokens, B = rows, r = LoRA rank.

- N counts every parameter except the input embedding table (a gather, no FLOPs) and adds the
  LM head's matmul once: with tied embeddings N = all parameters, untied N = all minus V x D.
  The few RMSNorm weights are counted too (at most 0.1% of N); biases likewise.
- A forward pass costs 2N per token (one multiply-add per weight) plus attention: Q.K^T and
  attention-weights.V are 2 x 2 x A FLOPs per layer per position attended to, so 4 x L x A x T
  per token when every token is charged the full length T (PaLM's convention, appendix B of
  Chowdhery et al. 2022: no halving for the causal mask, matching the work dense kernels do).
- Training (full fine-tuning) is PaLM's 6N + 12 x L x A x T per token: the backward pass costs
  twice the forward (gradients of activations and of weights).
- LoRA: the frozen base still runs forward and backward through its activations but computes no
  weight gradients: 4N; each adapter weight costs the full 6; attention has no weights, so its
  backward (gradients of queries, keys and values) is 2x forward as in full training:
  4N + 6 x N_lora + 12 x L x A x T per token.
- DPO: the policy trains on all 2B x T tokens (completion-only loss, but every token runs
  forward and backward), and the frozen reference runs one forward over the same tokens:
  (train + 2N + 4 x L x A x T) per token.
- DPO with the prompt shared (hone's default layout, `hone.data.shared_prefix`): each pair is one
  row of S = P + 2C tokens through the blocks, and the LM head (H = V x D weights) runs only at
  the 2C slots that predict answer tokens; attention is charged the full row S (the dense masked
  kernel's work): per pair, training (6(N - H) + 12LAS) x S + 6H x 2C, reference forward
  (2(N - H) + 4LAS) x S + 2H x 2C. These are the FLOPs hone executes, so its `mfu` stays an
  efficiency; the work (tokens per second) is still counted as 2B x (P + C) tokens.
- Decode: prefill runs the P prompt tokens (each attending to P positions), then each generated
  token but the last is fed back (the i-th, i = 1..M-1, attending to P + i cached positions):
  B x [P x (2N + 4LAP) + sum_i (2N + 4LA(P + i))]. The last token's logits come from the step
  before, so M new tokens need P + M - 1 token forwards.
- GRPO step: rollout (decode of the B x G sequences) + reference forward over the P + M tokens
  of each sequence (when a KL reference exists) + one training update over them. With the
  prompt shared (GRPO's tree rows, `hone.rl.rollout.pack_tree_rows`) the update and the
  reference run B rows of S = P + G x M tokens through the blocks and the LM head on the G x M
  scored slots, counted as for DPO's shared prompt (attention charged the full row S).
"""

from __future__ import annotations


def matmul_params(cfg) -> int:
    """N: every parameter but the input embedding gather; the LM head's matmul counted once."""
    return cfg.matmul_params()


def attention_width(cfg) -> int:
    """L x A: summed over layers, the query width each position's attention scores and mixes."""
    return cfg.num_layers * cfg.num_heads * cfg.head_dim


def lora_params(cfg, rank: int) -> int:
    """Adapter parameters of rank-`rank` LoRA on q, k, v, o, gate, up and down of every layer:
    r x (d_in + d_out) per adapted matrix."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = (d + q) + 2 * (d + kv) + (q + d) + 3 * (d + f)
    return cfg.num_layers * rank * per_layer


def forward_flops_per_token(cfg, context: int) -> float:
    """One token's forward: 2N + 4 x L x A x context."""
    return 2.0 * matmul_params(cfg) + 4.0 * attention_width(cfg) * context


def train_flops_per_token(cfg, seq: int, n_lora: int | None = None) -> float:
    """One token's forward + backward in a sequence of `seq`: 6N + 12LAT (full fine-tuning) or
    4N + 6 n_lora + 12LAT (LoRA, base frozen)."""
    weights = 6.0 * matmul_params(cfg) if n_lora is None else (
        4.0 * matmul_params(cfg) + 6.0 * n_lora)
    return weights + 12.0 * attention_width(cfg) * seq


def sft_flops(cfg, batch: int, seq: int, n_lora: int | None = None) -> float:
    """One training step over B x T tokens (n_lora given: LoRA with that many adapter weights)."""
    return batch * seq * train_flops_per_token(cfg, seq, n_lora)


def dpo_flops(cfg, pairs: int, seq: int, n_lora: int | None = None) -> float:
    """One DPO step: the policy trains on 2 x pairs sequences of T tokens, the reference runs
    forward over the same tokens."""
    per_token = train_flops_per_token(cfg, seq, n_lora) + forward_flops_per_token(cfg, seq)
    return 2 * pairs * seq * per_token


def shared_dpo_flops(cfg, pairs: int, prompt_len: int, completion_len: int) -> float:
    """One DPO step in the shared-prompt layout (module docstring): policy update + reference
    forward over B rows of P + 2C tokens, the LM head only on the 2C scored slots."""
    head = cfg.vocab_size * cfg.hidden_size
    body = matmul_params(cfg) - head
    row = prompt_len + 2 * completion_len
    attn = attention_width(cfg) * row
    per_pair = ((6.0 * body + 12.0 * attn) * row + 6.0 * head * 2 * completion_len
                + (2.0 * body + 4.0 * attn) * row + 2.0 * head * 2 * completion_len)
    return pairs * per_pair


def decode_flops(cfg, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Generating M new tokens for B prompts of P tokens: prefill + M - 1 fed-back tokens."""
    prefill = prompt_len * forward_flops_per_token(cfg, prompt_len)
    fed_back = sum(forward_flops_per_token(cfg, prompt_len + i) for i in range(1, new_tokens))
    return batch * (prefill + fed_back)


def grpo_flops(cfg, prompts: int, generations: int, prompt_len: int, new_tokens: int, *,
               reference: bool = True, n_lora: int | None = None,
               shared_prompt: bool = False) -> float:
    """One GRPO step: rollout of prompts x generations sequences, the reference forward over
    their P + M tokens (when `reference`), one update over the same tokens; `shared_prompt`:
    the update and reference over one tree row per prompt (module docstring; full fine-tuning
    only)."""
    seqs, seq = prompts * generations, prompt_len + new_tokens
    rollout = decode_flops(cfg, seqs, prompt_len, new_tokens)
    if shared_prompt:
        if n_lora is not None:
            raise ValueError("grpo_flops: shared_prompt counts full fine-tuning only")
        head = cfg.vocab_size * cfg.hidden_size
        body = matmul_params(cfg) - head
        row, scored = prompt_len + generations * new_tokens, generations * new_tokens
        attn = attention_width(cfg) * row
        update = (6.0 * body + 12.0 * attn) * row + 6.0 * head * scored
        ref = (2.0 * body + 4.0 * attn) * row + 2.0 * head * scored if reference else 0.0
        return rollout + prompts * (update + ref)
    ref = seqs * seq * forward_flops_per_token(cfg, seq) if reference else 0.0
    return rollout + ref + seqs * seq * train_flops_per_token(cfg, seq, n_lora)
