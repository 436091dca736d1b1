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
Batch: B rows of T random ids, all real tokens, the same batch every step. --remat other than
"none" turns on `model.gradient_checkpointing_enable()` (each decoder layer recomputed in the
backward pass, as hone's remat "full"). Prints one JSON line per row.

    .venv/bin/python benchmarks/train_torch.py --repeats 5
    .venv/bin/python benchmarks/train_torch.py --rows sft --batch 1 --seq-len 2048 --remat full
"""

from __future__ import annotations

from _measure import emit_train, finite, first_and_median, train_args
from _torch_model import adamw, new_model, optimizer_step

import torch

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run_row(row: str, args) -> None:
    model = new_model(args.seed)
    cfg = model.config
    if row == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=LORA_MODULES, bias="none",
                                                 task_type="CAUSAL_LM"))
    if args.remat != "none":  # recompute each layer's activations in the backward pass
        model.gradient_checkpointing_enable()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if row == "lora":
        assert len(trainable) == 2 * len(LORA_MODULES) * cfg.num_hidden_layers, len(trainable)
    opt = adamw(trainable)

    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq_len), generator=gen)
    mask = torch.ones_like(ids)

    def one():
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        return optimizer_step(loss, trainable, opt)

    first, med, loss0 = first_and_median(one, args.repeats, value=finite)
    emit_train("torch", row, args.batch * args.seq_len, first, med, loss0)


def main():
    args = train_args(__doc__.splitlines()[0])
    torch.set_num_threads(2)
    for row in args.rows:
        run_row(row, args)


if __name__ == "__main__":
    main()
