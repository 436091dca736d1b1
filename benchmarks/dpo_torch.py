"""DPO step with PyTorch + transformers (LlamaForCausalLM, sdpa attention, 2 threads).

Settings: the SmolLM2-135M shape (as train_torch.py), random init, fp32, every parameter trained;
reference = `copy.deepcopy` of the initial policy, eval mode, requires_grad off, run under
torch.no_grad(); sigmoid DPO written out: loss = mean(-logsigmoid(beta * ((pc - rc) - (pr -
rr)))), beta 0.1, where p*/r* are the summed log-probs of the completion tokens under the policy
and the reference; torch.optim.AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01)
after clip_grad_norm_ 1.0. Batch: --pairs (4) pairs as 2B rows (chosen rows first, then
rejected; a pair shares its --prompt-len (64) prompt ids) of prompt + --completion-len (64)
completion ids, random, no padding.

What is timed, per step (wall clock): reference forward on the 2B rows under no_grad, policy
forward on the 2B rows (full logits, as TRL's DPOTrainer computes them; the completion slice is
then log-softmaxed and gathered), the loss, `backward`, `clip_grad_norm_`, `opt.step()`,
`opt.zero_grad()`, `loss.item()`. First step is first_s; median_s is the median of the next
--repeats steps. Prints one JSON line (fields as train_*.py; tokens_per_s counts the 2B x L
policy tokens; first_loss = log 2).

    .venv/bin/python benchmarks/dpo_torch.py --repeats 5
"""

from __future__ import annotations

import copy

from _measure import emit_pairs, finite, first_and_median, pair_args
from _torch_model import adamw, new_model, optimizer_step

import torch
import torch.nn.functional as F

BETA = 0.1


def completion_logps(model, ids, mask, prompt_len: int) -> torch.Tensor:
    """Summed log-probs [2B] of the tokens after the prompt (logit t predicts token t+1)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_len - 1:-1]
    token_lp = torch.gather(F.log_softmax(logits.float(), dim=-1), 2,
                            ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)
    return token_lp.sum(-1)


def main():
    args = pair_args(__doc__.splitlines()[0])
    torch.set_num_threads(2)
    policy = new_model(args.seed)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    policy.train()
    params = list(policy.parameters())
    opt = adamw(params)

    gen = torch.Generator().manual_seed(args.seed)
    draw = lambda n: torch.randint(3, policy.config.vocab_size, (args.pairs, n),  # noqa: E731
                                   generator=gen)
    prompt = draw(args.prompt_len)
    ids = torch.cat([torch.cat([prompt, draw(args.completion_len)], 1),    # chosen rows
                     torch.cat([prompt, draw(args.completion_len)], 1)])   # rejected rows
    mask = torch.ones_like(ids)
    b = args.pairs

    def one():
        with torch.no_grad():
            ref = completion_logps(reference, ids, mask, args.prompt_len)
        pol = completion_logps(policy, ids, mask, args.prompt_len)
        delta = (pol[:b] - ref[:b]) - (pol[b:] - ref[b:])
        return optimizer_step(-F.logsigmoid(BETA * delta).mean(), params, opt)

    first, med, loss0 = first_and_median(one, args.repeats, value=finite)
    emit_pairs("torch", args, first, med, loss0)


if __name__ == "__main__":
    main()
