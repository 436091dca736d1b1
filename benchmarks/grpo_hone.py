"""GRPO step with hone's own GRPO machinery (what `hone grpo` runs), SmolLM2-135M shape.

A thin wrapper over `hone.bench.grpo.grpo_row` (its docstring says exactly what is built and
timed; `hone bench grpo` runs the same code). Settings as grpo_tunix.py: model `smollm2-135m`,
random init, fp32, every parameter trained; --prompts (2) random prompts of --prompt-len (32)
ids, each sampled --generations (4) times for --new-tokens (32) tokens at temperature 0.9 with
no EOS; reward = share of even token ids; KL --beta (0.04, Tunix's default; 0 = no reference at
all), clip 0.2, one iteration, k1, seq-mean-token-mean; AdamW after global-norm clipping at 1.0.

Timed per step: rollout_s (sampling on the current weights, rewards, advantages, row layout),
update_s (the one jitted update program, which INCLUDES the reference forward), median_s (the
whole step). ref_s: the reference forward jitted alone, timed after the steps (part of update_s,
not extra; 0.0 when beta = 0). Prints one JSON line with grpo_tunix.py's fields (impl "hone",
row "grpo", first_s, median_s, tokens_per_s over the 8 x (prompt + new tokens) sequences,
peak_rss_mb read before the ref_s measurement, first_loss, rollout_s, ref_s, update_s) plus
"beta" and "ref_in_update" (true when a reference forward runs inside update_s).

    .venv/bin/python benchmarks/grpo_hone.py --repeats 5
    .venv/bin/python benchmarks/grpo_hone.py --repeats 5 --beta 0
"""

from __future__ import annotations

from _measure import emit_grpo, grpo_args

from hone.bench.grpo import grpo_row


def main():
    args = grpo_args(__doc__.splitlines()[0])
    got = grpo_row("smollm2-135m", args.prompts, args.generations, args.prompt_len,
                   args.new_tokens, args.repeats, args.beta, "fp32", args.seed)
    s = got.series
    emit_grpo("hone", args, s["step_s"], s["rollout_s"], s["ref_s"], s["update_s"],
              got.first_loss, got.peak_mb, beta=args.beta,
              ref_in_update=got.extra["ref_in_update"])


if __name__ == "__main__":
    main()
