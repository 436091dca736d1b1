"""Rollouts side by side: hone's static sampler and paged rollout engine (`hone bench rollout`)
and Tunix's vanilla sampler (rollout_tunix.py, in the Tunix venv) on the same workloads.

Workloads (hone/bench/rollout.py): 32 prompts of 64 random tokens x 8 samples, SmolLM2-135M
shape, random init, fp32, temperature 1. long-tail: each sample's length drawn beforehand (a
fifth run to 512 tokens, the rest log-uniform between 16 and 512) and enforced by ending it
there; uniform: every sample 128 tokens. Tokens per second count the drawn lengths for every
engine: the paged engine ends each sample at its length; the static sampler and Tunix decode
every row in lockstep to the limit (neither can end a row early without an end token), so their
time is that of every row running to the limit.

Each workload runs hone static, hone paged, Tunix, one process at a time per --rounds round
(the order rotated each round), each timing --repeats rollouts after a first, compiling one;
medians over rounds. The paged engine is hone's row in the Summary (suite.py); the static
sampler is its reference.

    .venv/bin/python benchmarks/rollouts.py [--rounds 1] [--repeats 1] [--workloads long-tail]
    .venv/bin/python benchmarks/rollouts.py --write    # the section and figures/rollouts.json
"""

from __future__ import annotations

import sys

import _driver

ENGINES = ("static", "paged")  # hone's, then Tunix's sampler
WORKLOADS = ("long-tail", "uniform")
IMPLS = ("hone", "tunix")
TITLE = "Rollouts, beside Tunix"


def jobs(args):
    def of(impl: str):
        out = []
        for w in args.workloads:
            if impl == "hone":
                out += [(f"hone {e} {w}", [sys.executable, "-m", "hone.cli", "bench", "rollout",
                                           "--model", "smollm2-135m", "--workload", w,
                                           "--engine", e, "--steps", str(args.repeats)])
                        for e in ENGINES]
            else:
                out.append((f"tunix {w}", _driver.command(
                    "tunix", "rollout_tunix.py", "--workload", w, "--repeats", args.repeats)))
        return out
    return of


def records(results: list[dict]) -> list[dict]:
    """One record per (impl, row): hone's paged engine is row W, its static sampler W-static,
    Tunix's sampler W; Tunix's tokens per second count hone's drawn lengths for W."""
    tokens = {r["workload"]: r["tokens_per_step"] for r in results if r["impl"] == "hone"}
    keyed = []
    for r in results:
        if r["impl"] == "hone":
            row = r["workload"] + ("" if r["engine"] == "paged" else "-static")
            keyed.append({**r, "row": row, "first_s": r["first_step_s"]})
        else:
            keyed.append({**r, "row": r["workload"], "tokens_per_step": tokens[r["workload"]]})
    rows = [(i, w + s) for w in WORKLOADS for i, s in (("hone", "-static"), ("hone", ""),
                                                       ("tunix", ""))]
    summary = _driver.aggregate(keyed, rows, key=lambda r: (r["impl"], r["row"]),
                                firsts=("kv_bytes", "tokens_per_step"))
    out = []
    for (impl, row), s in summary.items():
        out.append({"impl": impl, "row": row, **s,
                    "tokens_per_s": round(s["tokens_per_step"] / s["median_s"], 1)})
    return out


def main():
    ap = _driver.parser(__doc__, IMPLS, TITLE)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.set_defaults(rounds=1, repeats=1)
    args = _driver.parse(ap, IMPLS)
    args.workloads = [w for w in args.workloads.split(",") if w]
    recs = records(_driver.run_rounds(args, jobs(args)))
    by = {(r["impl"], r["row"]): r for r in recs}
    body = []
    for w in args.workloads:
        static = by.get(("hone", w + "-static"))
        lines = []
        for label, key in (("hone static sampler", ("hone", w + "-static")),
                           ("hone paged engine", ("hone", w)),
                           ("Tunix vanilla sampler", ("tunix", w))):
            r = by.get(key)
            if r is None:
                continue
            ratio = f"{r['tokens_per_s'] / static['tokens_per_s']:.2f}x" if static else "-"
            lines.append([w, label, f"{r['median_s']:.1f}", f"{r['first_s']:.1f}",
                          f"{r['tokens_per_s']:.1f}", ratio, f"{r['kv_bytes']:,}",
                          f"{r['peak_rss_mb']:.0f}"])
        body.append(_driver.md_table(["workload", "engine", "s", "first s", "tokens/s",
                                      "x hone static", "KV bytes", "peak RSS MB"], lines))
        body.append("")
    paged_vs_tunix = [f"{w}: hone's paged engine {by[('hone', w)]['tokens_per_s'] / by[('tunix', w)]['tokens_per_s']:.2f}x Tunix's tokens/s"  # noqa: E501
                      for w in args.workloads if ("hone", w) in by and ("tunix", w) in by]
    v = _driver.versions(main_pkgs=("jax", "flax"))
    bullets = {
        "hone": f"- hone: `hone bench rollout --model smollm2-135m --workload W --engine static|"
                f"paged --steps {args.repeats}` (hone/bench/rollout.py: static = `hone.generate`'s "
                "lockstep sampler over 256 rows; paged = the rollout engine, max_seqs 64, pages "
                f"of 64 slots); jax {v['jax']}, flax {v['flax']}.",
        "tunix": "- tunix: `tunix.generate.sampler.Sampler` (temperature 1.0 with top_p 1.0, "
                 "RolloutConfig's defaults) on `tunix.models.llama3` Llama3, the 256 rows in one "
                 "batch over a cache of 64 + limit slots (benchmarks/rollout_tunix.py); "
                 f"google-tunix {v['tunix']}."}
    settings = ("32 prompts of 64 random tokens x 8 samples, SmolLM2-135M shape, random init, "
                "fp32, temperature 1; long-tail lengths drawn with seed 0 (59,378 tokens, "
                "mean 232, limit 512), uniform 128 tokens each (32,768). s: the median timed "
                "rollout after the first (compiling) one; tokens/s: the drawn lengths over s.")
    text = _driver.section(args, "rollouts.py", settings, bullets, body,
                           goals=["Beside Tunix (no goal in issue 45; the Summary compares it "
                                  "with the 2x Tunix speed goal of every row): "
                                  + "; ".join(paged_vs_tunix) + "."] if paged_vs_tunix else [],
                           flags=f" --workloads {','.join(args.workloads)}")
    _driver.report(args, text, "rollouts.py", recs, flags=f" --workloads {','.join(args.workloads)}")


if __name__ == "__main__":
    main()
