"""KTO beside DPO on the shipped SmolLM2-135M-Instruct: both LoRA rank 16 with the reference
taken by switching adapters off, on the bundled arithmetic preference pairs (KTO reads each pair
as two unpaired examples: the right answer desirable, the near miss undesirable), same steps,
learning rate and completions per step. Scored the same way: held-out pairwise accuracy of the
implicit reward beta * (log pi(y|x) - log pi_ref(y|x)) on the 200 pairs of
builtin:arithmetic-pref-eval (right answer strictly above the near miss), which is DPO's
eval_accuracy.

    .venv/bin/python benchmarks/kto_smollm2.py [--steps 40] [--dpo] [--write]

Without --dpo the DPO row is the recorded one of RESULTS.md ("Preference tuning on SmolLM2",
the same config and steps); with it DPO is trained again here. `make test` checks KTO on the
tiny preset (tests/recipes/test_kto_recipe.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

EVAL = "builtin:arithmetic-pref-eval"
TITLE = "KTO beside DPO on SmolLM2"


def pair_accuracy(model, tokenizer, beta: float, max_length: int) -> dict:
    """Held-out pairwise accuracy and mean margin of the implicit reward of a LoRA model against
    itself with adapters off, as DPO's evaluation computes them."""
    import jax
    import numpy as np
    from flax import nnx

    from hone.data.preference import PreferenceData
    from hone.train.dpo_objective import sequence_logps
    from hone.train.reference import reference_model

    data = PreferenceData(EVAL, tokenizer, max_length=max_length, batch_size=8)
    graphdef, state = nnx.split(model)

    @jax.jit
    def score(state, batch):  # summed completion log-probs [2B] of the policy and reference
        policy = nnx.merge(graphdef, state)
        return (sequence_logps(policy, batch)[0],
                sequence_logps(reference_model(policy, "adapters_off"), batch)[0])

    right, margins = [], []
    for batch in data.batches():
        policy, reference = (np.asarray(x) for x in score(state, batch))
        reward = beta * (policy - reference)               # [2B]: chosen rows, then rejected
        b = len(batch["pair_valid"])
        valid = np.asarray(batch["pair_valid"]) > 0
        margin = (reward[:b] - reward[b:])[valid]
        right += list(margin > 0)
        margins += list(margin)
    return {"accuracy": float(np.mean(right)), "margin": float(np.mean(margins)),
            "pairs": len(right)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dpo", action="store_true", help="train DPO here too")
    parser.add_argument("--out", default="runs/bench-kto")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of both configs")
    args = parser.parse_args()
    from hone.config import DPOConfig, KTOConfig, load_config
    from hone.tokenizer import load_tokenizer
    from hone.recipes.dpo import run_dpo
    from hone.recipes.kto import run_kto

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    common = [f"train.max_steps={args.steps}", f"train.eval_every={args.steps // 2}",
              "log.sinks=[jsonl]", f"checkpoint.every_steps={args.steps}", *args.overrides]
    rows = []
    t0 = time.perf_counter()
    kto = load_config(KTOConfig, str(ROOT / "configs/smollm2/kto_lora.yaml"),
                      [f"run_dir={out / 'kto'}", *common])
    model, _, _ = run_kto(kto, log=lambda s: print("kto:", s, flush=True))
    kto_s = time.perf_counter() - t0
    tokenizer = load_tokenizer(kto.model.source)
    got = pair_accuracy(model, tokenizer, kto.kto.beta, kto.data.max_length)
    print("kto:", json.dumps(got), flush=True)
    rows.append(f"| KTO (beta 0.1, LoRA r16, 16 examples per step) | {args.steps} | "
                f"{got['accuracy']:.1%} | {got['margin']:.3f} | {kto_s:.0f} |")
    kto_acc = got["accuracy"]
    if args.dpo:
        t1 = time.perf_counter()
        dpo = load_config(DPOConfig, str(ROOT / "configs/smollm2/dpo_lora.yaml"),
                          [f"run_dir={out / 'dpo'}", *common])
        model, _, _ = run_dpo(dpo, log=lambda s: print("dpo:", s, flush=True))
        dpo_s = time.perf_counter() - t1
        got = pair_accuracy(model, tokenizer, dpo.dpo.beta, dpo.data.max_length)
        print("dpo:", json.dumps(got), flush=True)
        dpo_acc, dpo_src = got["accuracy"], "trained here"
        rows.append(f"| DPO (sigmoid, beta 0.1, LoRA r16, 8 pairs per step) | {args.steps} | "
                    f"{got['accuracy']:.1%} | {got['margin']:.3f} | {dpo_s:.0f} |")
    else:
        dpo_acc, dpo_src = 0.880, "recorded 2026-11-30 (RESULTS.md, Preference tuning on SmolLM2)"
        rows.append(f"| DPO (sigmoid, beta 0.1, LoRA r16, 8 pairs per step), {dpo_src} | 40 | "
                    f"88.0% | 1.327 | 966 |")
    gap = 100 * (kto_acc - dpo_acc)
    section = "\n".join([
        f"## {TITLE}", "",
        f"Measured {time.strftime('%Y-%m-%d')} with `benchmarks/kto_smollm2.py --steps "
        f"{args.steps}{' --dpo' if args.dpo else ''}`: SmolLM2-135M-Instruct (shipped GGUF), "
        "LoRA rank 16 on every projection, lr 5e-4 with 5 warm-up steps and a cosine schedule, "
        "reference = the model with adapters off. KTO (configs/smollm2/kto_lora.yaml) reads "
        "builtin:arithmetic-pref's pairs as unpaired examples (chosen desirable, rejected "
        "undesirable; each with its mismatched KL row for z0), 16 examples per step; DPO "
        "(configs/smollm2/dpo_lora.yaml) 8 pairs per step: the same completions per step. "
        "Both scored on the 200 held-out pairs of builtin:arithmetic-pref-eval: the share whose "
        "implicit reward beta * (log pi - log pi_ref) is strictly higher for the right answer.",
        "",
        "| run | steps | held-out pairwise accuracy | held-out margin | seconds |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"KTO minus DPO: {gap:+.1f} points (goal: within 5). The machine was shared with other "
        "jobs; seconds are wall time of training with its evaluations.",
    ])
    print(section)
    if args.write:
        from _driver import write_section
        write_section(TITLE, section)


if __name__ == "__main__":
    main()
