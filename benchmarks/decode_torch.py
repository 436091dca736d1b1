"""Greedy decode with PyTorch + transformers (LlamaForCausalLM, sdpa attention, 2 threads).

Model: the SmolLM2-135M shape, random init, fp32. `model.generate(do_sample=False,
max_new_tokens=N, min_new_tokens=N, use_cache=True)` from random prompt ids, all of the same
length, so every row generates exactly N tokens. Prints one JSON line per batch size.

    .venv/bin/python benchmarks/decode_torch.py --repeats 5
"""

from __future__ import annotations

import time

from _measure import decode_args, emit_decode, first_and_median

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS_ID = PAD_ID = 2  # SmolLM2's; min_new_tokens keeps it from ending a row early


def smollm2_135m_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                       attn_implementation="sdpa")


def main():
    args = decode_args(__doc__.splitlines()[0])

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    cfg = smollm2_135m_config()
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    gen = torch.Generator().manual_seed(args.seed)

    for b in args.batches:
        ids = torch.randint(3, cfg.vocab_size, (b, args.prompt_len), generator=gen)
        mask = torch.ones_like(ids)

        def run():
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                     max_new_tokens=args.new_tokens,
                                     min_new_tokens=args.new_tokens, use_cache=True,
                                     pad_token_id=PAD_ID, eos_token_id=EOS_ID)
            dt = time.perf_counter() - t0
            assert out.shape == (b, args.prompt_len + args.new_tokens), out.shape
            return dt, None

        first, med, _ = first_and_median(run, args.repeats)
        emit_decode("torch", b, args.new_tokens, first, med)


if __name__ == "__main__":
    main()
