"""Training steps with PyTorch + transformers (LlamaForCausalLM, sdpa attention, 2 threads).

Model: the SmolLM2-135M shape, random init, fp32, train mode. Rows:
- sft: full fine-tuning, every parameter trainable.
- lora: peft `get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0,
  target_modules=[q,k,v,o,gate,up,down]_proj))`, base frozen.
Optimizer: torch.optim.AdamW (its default implementation choice) over the trainable parameters.

What is timed, per step (wall clock): `loss = model(input_ids, attention_mask,
labels=input_ids).loss; loss.backward(); clip_grad_norm_(trainable, 1.0); opt.step();
opt.zero_grad(); loss.item()`. transformers shifts the labels, so the loss scores T-1 targets per
row of T tokens. First step is first_s; median_s is the median of the next --repeats steps.
Batch: B rows of T random ids, all real tokens, the same batch every step. Prints one JSON line
per row.

    .venv/bin/python benchmarks/train_torch.py --repeats 5
"""

from __future__ import annotations

import math
import time

from _measure import emit_train, first_and_median, train_args

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS_ID = PAD_ID = 2
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def smollm2_135m_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                       attn_implementation="sdpa")



def run_row(row: str, args) -> None:
    torch.manual_seed(args.seed)
    cfg = smollm2_135m_config()
    model = LlamaForCausalLM(cfg).to(torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    if row == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=LORA_MODULES, bias="none",
                                                 task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if row == "lora":
        assert len(trainable) == 2 * len(LORA_MODULES) * cfg.num_hidden_layers, len(trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq_len), generator=gen)
    mask = torch.ones_like(ids)

    def one():
        t0 = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.item()
        dt = time.perf_counter() - t0
        assert math.isfinite(loss), loss
        return dt, loss

    first, med, loss0 = first_and_median(one, args.repeats)
    emit_train("torch", row, args, first, med, loss0)


def main():
    args = train_args(__doc__.splitlines()[0])
    torch.set_num_threads(2)
    for row in args.rows:
        run_row(row, args)


if __name__ == "__main__":
    main()
