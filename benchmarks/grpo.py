"""GRPO step benchmark: hone (with and without the KL reference) vs Tunix, side by side.

Row "GRPO step, 2 prompts x 4 generations, 32 + 32 tokens": SmolLM2-135M shape, random init,
fp32, full-parameter policy; each step samples 4 completions of 32 new tokens (temperature 0.9,
no EOS, so every completion is full length) for each of 2 random 32-token prompts, scores them
with a trivial reward (share of even token ids), computes group advantages and runs one GRPO
update (clip 0.2, one iteration, KL beta 0.04 against a frozen copy of the initial weights, k1
estimator, sequence-mean-token-mean loss; AdamW after global-norm clipping at 1.0). Runs
grpo_hone.py twice (`hone`: beta 0.04; `hone-beta0`: beta 0, so no reference is built or run, the
row shows the memory and time that saves) and grpo_tunix.py (Tunix's GRPOLearner, in the Tunix
venv, created by _venvs.py if missing) as separate processes, one at a time, never in parallel,
rotating the order every round; each times its first step (compile) and the median of --repeats
steps, split into rollout, reference forward and update (see each script's docstring: Tunix runs
the reference forward as its own call between rollout and update; hone runs it inside the jitted
update program, so its ref s is measured separately and is part of its update s). This driver
takes the median over rounds per implementation, prints a markdown table with one row per
implementation and, with --write, rewrites the "## GRPO step" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/grpo.py --write
    .venv/bin/python benchmarks/grpo.py --rounds 1 --repeats 2 --impls hone,hone-beta0  # smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402

IMPLS = ("hone", "hone-beta0", "tunix")


def jobs(impl: str, args) -> list[tuple[str, list[str]]]:
    """grpo_hone.py serves hone and hone-beta0 (beta 0); run_rounds relabels its lines."""
    script, beta = {"hone": ("grpo_hone.py", args.beta), "hone-beta0": ("grpo_hone.py", 0.0),
                    "tunix": ("grpo_tunix.py", args.beta)}[impl]
    return [(f"{impl} grpo", _driver.command(
        impl, script, "--repeats", args.repeats, "--prompts", args.prompts, "--generations",
        args.generations, "--prompt-len", args.prompt_len, "--new-tokens", args.new_tokens,
        "--beta", beta))]


def bullets(vers: dict, beta: float) -> dict[str, str]:
    return {
        "hone": "- hone: `hone.recipes.grpo`'s pieces as `run_grpo` wires them (`make_rl_step` "
                "with `make_grpo_loss` and `make_scoring`, `rl_optimizer`, the `smollm2-135m` "
                f"preset, beta {beta}, reference = `jax.tree.map(jnp.copy, params)` as the "
                "step's aux); rollout = `hone.rl.rollout.sample` on the current weights (no "
                "copy, no recompile) + rewards + `grpo_advantages` + `pack_tree_rows` (one "
                "row per prompt group, the prompt computed once and the LM head only on the "
                "samples' slots: `grpo.shared_prompt`, the default; Tunix scores a row per "
                "sample); update = the one jitted, state-donating program (reference forward, "
                "policy forward, loss, "
                "gradients, clipping, AdamW), timed until its metrics are ready. Its ref s is "
                "the same reference forward jitted alone and timed after the steps: it is "
                f"included in update s, not added to it; jax {vers['jax']}, flax "
                f"{vers['flax']}.",
        "hone-beta0": "- hone-beta0: the same with beta 0: `reference_mode` gives None, so no "
                      "reference weights are copied and `make_scoring` is None (no reference "
                      "forward in the update program).",
        "tunix": "- tunix: `tunix.rl.grpo.grpo_learner.GRPOLearner.train()` on "
                 "`tunix.models.llama3` Llama3 (actor, reference and vanilla rollout engine on "
                 "one 1-device mesh, no weight sync), timers around `_run_global_step` (step), "
                 "`RLCluster.generate` (rollout), `get_ref_per_token_logps` (ref, blocked until "
                 f"ready) and `update_actor` (update); google-tunix {vers['tunix']}.",
    }


def summarize(results: list[dict], impls) -> dict:
    """{impl: medians over rounds of the step and its phases, max peak_rss_mb, first round's
    first_loss and ref_in_update}."""
    return _driver.aggregate(
        results, impls, lambda r: r["impl"], firsts=("first_loss", "ref_in_update"),
        medians=("median_s", "first_s", "rollout_s", "ref_s", "update_s"))


def table(summary: dict) -> str:
    """One markdown row per implementation: medians over rounds, and hone's speed-up."""
    hone = summary.get("hone", {}).get("median_s")
    rows = []
    for impl, s in summary.items():
        ref = f"{s['ref_s']:.3f}"
        if s["ref_in_update"]:
            ref = f"({ref})"
        elif impl.startswith("hone") and s["ref_s"] == 0:
            ref = "none"
        rows.append([impl, f"{s['median_s']:.3f}", f"{s['rollout_s']:.3f}", ref,
                     f"{s['update_s']:.3f}", f"{s['first_s']:.1f}", f"{s['peak_rss_mb']:.0f}",
                     f"{s['first_loss'] + 0.0:.4f}",  # + 0.0: no -0.0000
                     "-" if hone is None else f"{s['median_s'] / hone:.2f}x"])
    return _driver.md_table(["implementation", "step s", "rollout s", "ref s", "update s",
                             "first step s", "peak RSS MB", "first loss", "hone speed-up"], rows)


def main():
    ap = _driver.parser(__doc__, IMPLS, "GRPO step")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.04,
                    help="KL coefficient of the hone and tunix rows (hone-beta0 uses 0)")
    args = _driver.parse(ap, IMPLS)

    results = _driver.run_rounds(args, lambda impl: jobs(impl, args))
    summary = summarize(results, args.impls)
    n, g, p, m = args.prompts, args.generations, args.prompt_len, args.new_tokens
    settings = (
        f"one GRPO step, {n} prompts x {g} generations ({n * g} sequences of {p} random prompt "
        f"ids + {m} sampled tokens; no EOS, so every completion is full length), temperature "
        "0.9, no top-k / top-p, reward = share of even token ids, group advantages (group "
        f"std), clip 0.2, one iteration, KL beta {args.beta} (k1, against a frozen copy of the "
        "initial weights), sequence-mean-token-mean loss, full-parameter policy, AdamW (lr "
        "1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01) after global-norm clipping at "
        f"1.0, fp32. Median over {args.rounds} round(s) of each process's median of "
        f"{args.repeats} timed step(s) after one first (compiling) step; one process per "
        "implementation, run one at a time, order rotated per round. Step = rollout "
        "(sampling, rewards, advantages, row layout) + reference forward + update.")
    note = ("ref s in parentheses: hone runs the reference forward inside its update program, "
            "so that figure (the same forward jitted alone) is already part of its update s; "
            "Tunix runs it as a separate call, counted once in its step s. hone speed-up: the "
            f"implementation's median step time / hone's (beta {args.beta})"
            + ("; hone-beta0's row is the time and memory dropping the reference saves."
               if "hone-beta0" in args.impls else "."))
    _driver.report(args, _driver.section(
        args, "grpo.py", settings, bullets(_driver.versions(), args.beta),
        [table(summary), "", note, ""]),
        "grpo.py", [{"impl": i, "row": "grpo", **s} for i, s in summary.items()])


if __name__ == "__main__":
    main()
