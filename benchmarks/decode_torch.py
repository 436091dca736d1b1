"""Greedy decode with PyTorch + transformers (LlamaForCausalLM, sdpa attention, 2 threads).

Model: the SmolLM2-135M shape, random init, fp32. `model.generate(do_sample=False,
max_new_tokens=N, min_new_tokens=N, use_cache=True)` from random prompt ids, all of the same
length, so every row generates exactly N tokens. Prints one JSON line per batch size.

    .venv/bin/python benchmarks/decode_torch.py --repeats 5
"""

from __future__ import annotations

from _measure import decode_args, emit_decode, first_and_median
from _torch_model import EOS_ID, PAD_ID, new_model

import torch


def main():
    args = decode_args(__doc__.splitlines()[0])

    torch.set_num_threads(2)
    model = new_model(args.seed).eval()
    gen = torch.Generator().manual_seed(args.seed)

    for b in args.batches:
        ids = torch.randint(3, model.config.vocab_size, (b, args.prompt_len), generator=gen)
        mask = torch.ones_like(ids)

        def run():
            with torch.inference_mode():
                return model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=args.new_tokens,
                                      min_new_tokens=args.new_tokens, use_cache=True,
                                      pad_token_id=PAD_ID, eos_token_id=EOS_ID)

        def check(out):
            assert out.shape == (b, args.prompt_len + args.new_tokens), out.shape

        first, med, _ = first_and_median(run, args.repeats, value=check)
        emit_decode("torch", b, args.new_tokens, first, med)


if __name__ == "__main__":
    main()
