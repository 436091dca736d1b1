"""Learning result of the calculator agent on the shipped SmolLM2-135M-Instruct: held-out accuracy
(greedy, on questions of builtin:calculator-agent-eval, whose numbers never occur in training) of
(a) the model answering without tools, (b) the same model as an agent with the calculator, (c)
after the tool-use SFT warm start, (d) after agentic GRPO from (c); the stages are
configs/smollm2/agent_calculator.yaml's pipeline.

    .venv/bin/python benchmarks/agent_calculator.py [--questions 64] [--write] [KEY=VALUE ...]

Extra arguments are overrides of the pipeline (`sft.train.max_steps=60`,
`grpo.train.max_steps=20`, ...). Every measurement is kept in OUT/results.json as it is made and
the pipeline skips finished stages, so a rerun after a crash continues where it stopped (delete
OUT to start again). Agent rows use `hone eval accuracy --config`'s code (hone.eval.agent) with
the GRPO stage's `agent:` section; `make test` checks it on the tiny preset
(tests/eval/test_agent_eval.py). `--wordings` also scores (b)-(d) on
builtin:calculator-agent-eval-wordings: held-out operands in wordings no training data uses.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PIPELINE = ROOT / "configs/smollm2/agent_calculator.yaml"
BASE = "smollm2-135m-instruct"
DATA = "builtin:calculator-agent-eval"
WORDED = "builtin:calculator-agent-eval-wordings"  # held-out operands and held-out wordings
TITLE = "Agents: calculator"


def note(text: str) -> None:
    print(f"agent_calculator: {text}", flush=True)


def keep(results: dict, path: Path, key: str, value) -> None:
    results[key] = value
    path.write_text(json.dumps(results, indent=1) + "\n")


def measure(results: dict, path: Path, key: str, fn) -> None:
    """results[key] = fn() with its wall time, unless an earlier run measured it."""
    if key in results:
        note(f"{key}: kept from the earlier run")
        return
    t0 = time.perf_counter()
    value = fn()
    value["seconds"] = time.perf_counter() - t0
    keep(results, path, key, value)
    note(f"{key}: {json.dumps({k: v for k, v in value.items() if k != 'examples'})}")


def agent_row(source: str, cfg, records: list[dict]) -> dict:
    from hone.eval.agent import agent_accuracy
    from hone.eval.models import load_policy
    model, tokenizer = load_policy(source)
    r = agent_accuracy(model, tokenizer, cfg, records, batch_size=32, log=note)
    del model
    gc.collect()
    examples = [{"prompt": rec["prompt"], "answer": rec.get("answer", rec.get("target")),
                 "reply": reply}
                for rec, reply in list(zip(records, r.replies))[:3]]
    return {**r.as_dict(), "examples": examples}


def plain_row(source: str, questions: int, max_new_tokens: int) -> dict:
    from hone.eval.accuracy import accuracy
    from hone.eval.models import load_policy
    model, tokenizer = load_policy(source)
    r = accuracy(model, tokenizer, DATA, max_new_tokens=max_new_tokens, limit=questions)
    del model
    gc.collect()
    examples = [{"prompt": q, "answer": a, "reply": c[0]}
                for q, a, c in list(zip(r.questions, r.references, r.completions))[:3]]
    return {"accuracy": r.pass_at_1, "episodes": r.prompts, "max_new_tokens": max_new_tokens,
            "examples": examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=64, help="held-out questions")
    parser.add_argument("--plain-tokens", type=int, default=64,
                        help="answer budget of (a), the model without tools")
    parser.add_argument("--out", default="runs/bench-agent-calculator")
    parser.add_argument("--write", action="store_true",
                        help="write the section into benchmarks/RESULTS.md")
    parser.add_argument("--section", default=TITLE,
                        help=f"the RESULTS.md section to write (default {TITLE!r})")
    parser.add_argument("--wordings", action="store_true",
                        help=f"also score the agent rows on {WORDED} (held-out wordings)")
    parser.add_argument("overrides", nargs="*", help="pipeline overrides (STAGE.key=value)")
    args = parser.parse_args()
    from hone.config.pipeline_schema import load_pipeline
    from hone.data.loader import load_records
    from hone.pipeline import plan, run_pipeline

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    overrides = [f"run_dir={out / 'pipeline'}",
                 f"grpo.grpo.eval_prompts={args.questions}", *args.overrides]
    stages = {p.stage.name: p for p in plan(load_pipeline(str(PIPELINE), overrides), PIPELINE)}
    sft, grpo = stages["sft"], stages["grpo"]
    records = load_records(DATA, None, args.questions)
    keep(results, path, "setup", {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPU cores, "
        f"{platform.machine()}, {platform.system()}", "questions": len(records),
        "overrides": list(args.overrides)})

    measure(results, path, "a_no_tools", lambda: plain_row(BASE, len(records), args.plain_tokens))
    measure(results, path, "b_agent_base", lambda: agent_row(BASE, grpo.cfg, records))
    if "pipeline_s" not in results:
        t0 = time.perf_counter()
        run_pipeline(str(PIPELINE), overrides, log=lambda s: print("pipeline:", s, flush=True))
        keep(results, path, "pipeline_s", time.perf_counter() - t0)
    measure(results, path, "c_agent_sft",
            lambda: agent_row(str(sft.run_dir / "export"), grpo.cfg, records))
    measure(results, path, "d_agent_grpo",
            lambda: agent_row(str(grpo.run_dir / "export"), grpo.cfg, records))
    if args.wordings:
        worded = load_records(WORDED, None, args.questions)
        for key, source in (("b", BASE), ("c", str(sft.run_dir / "export")),
                            ("d", str(grpo.run_dir / "export"))):
            measure(results, path, f"{key}_wordings",
                    lambda source=source: agent_row(source, grpo.cfg, worded))
    metrics = [json.loads(line) for line in (grpo.run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    sft_metrics = [json.loads(line) for line in (sft.run_dir / "metrics.jsonl").read_text()
                   .splitlines()]
    keep(results, path, "grpo_curve", [r for r in metrics if "loss" in r or "eval_accuracy" in r])
    keep(results, path, "sft_losses", [r["loss"] for r in sft_metrics if "loss" in r])
    section = report(results, sft.cfg, grpo.cfg, args)
    print(section)
    if args.write:
        from _driver import write_section
        write_section(args.section, section)


def report(results: dict, sft_cfg, grpo_cfg, args) -> str:
    s, g, a = results["setup"], grpo_cfg.grpo, grpo_cfg.agent
    rows = [("(a) SmolLM2-135M-Instruct, no tools (one turn, the plain question)",
             results["a_no_tools"]),
            ("(b) the same model as an agent with the calculator", results["b_agent_base"]),
            (f"(c) after the tool-use SFT warm start ({sft_cfg.train.max_steps} steps)",
             results["c_agent_sft"]),
            (f"(d) after agentic GRPO from (c) ({grpo_cfg.train.max_steps} steps)",
             results["d_agent_grpo"])]

    def cells(r: dict) -> str:
        if "reward_mean" not in r:
            return f"{r['accuracy']:.1%} | - | 1 | - | - |"
        n = max(r["episodes"], 1)
        return (f"{r['accuracy']:.1%} | {r['reward_mean']:.3f} | {r['agent/turns_mean']:.2f} | "
                f"{r.get('agent/tool_calls', 0.0) / n:.2f} | "
                f"{r.get('agent/malformed_calls', 0.0) / n:.2f} |")

    table = [f"| {name} | {cells(r)}" for name, r in rows]
    worded = [f"| {name} | {cells(results[name[1] + '_wordings'])}" for name, _ in rows[1:]
              if name[1] + "_wordings" in results]
    if worded:
        gain = (results["d_wordings"]["accuracy"] - results["c_wordings"]["accuracy"]) * 100
        worded = ["", f"The same agents on the first {s['questions']} questions of {WORDED} "
                  "(held-out operands in wordings that no training question or trace uses: "
                  "word problems and phrasings such as 'Calculate 4821 multiplied by 367.'):", "",
                  "| model | held-out wordings accuracy | mean reward | turns | tool calls | "
                  "malformed calls |", "|---|---|---|---|---|---|", *worded, "",
                  f"Agentic GRPO over its warm start on held-out wordings: {gain:+.1f} points."]
    acc = {k: results[k]["accuracy"] for k in ("a_no_tools", "b_agent_base", "c_agent_sft",
                                                  "d_agent_grpo")}
    over_sft = (acc["d_agent_grpo"] - acc["c_agent_sft"]) * 100
    over_plain = (acc["d_agent_grpo"] - acc["a_no_tools"]) * 100
    curve = results["grpo_curve"]
    evals = [f"step {r['step']}: {r['eval_accuracy']:.1%}" for r in curve if "eval_accuracy" in r]
    train = [r for r in curve if "loss" in r]
    chunks, cfg_batch = [], grpo_cfg.train.batch_size  # episodes per step
    for k in range(0, len(train), 5):
        c = train[k:k + 5]
        mean = lambda key: sum(r.get(key, 0.0) for r in c) / len(c)  # noqa: E731
        zero = (f"{mean('zero_std_fraction'):.2f}" if all("zero_std_fraction" in r for r in c)
                else "-")
        chunks.append(f"| {c[0]['step']}-{c[-1]['step']} | {mean('reward_mean'):.3f} | "
                      f"{mean('reward_std'):.3f} | {zero} | {mean('agent/turns_mean'):.2f} | "
                      f"{mean('agent/tool_calls') / cfg_batch:.2f} | "
                      f"{mean('rollout_s'):.1f} | {mean('update_s'):.1f} |")
    losses = results["sft_losses"]
    minutes = (sum(v["seconds"] for v in results.values()
                   if isinstance(v, dict) and "seconds" in v) + results["pipeline_s"]) / 60
    return "\n".join([
        f"## {args.section}", "",
        f"Measured {s['date']} on {s['machine']} (shared with other jobs) with "
        f"`benchmarks/agent_calculator.py --questions {s['questions']}"
        f"{''.join(' ' + o for o in s['overrides'])}` (configs/smollm2/agent_calculator.yaml): "
        f"greedy answers to the first {s['questions']} questions of {DATA} (products, sums and "
        "differences of 3-4 digit numbers, none of which occurs in any training question). "
        f"Without tools: the question as one user turn, {results['a_no_tools']['max_new_tokens']} "
        "new tokens. As an agent: one greedy episode with the bundled calculator "
        f"(hone.agents.tasks:ArithmeticTool; up to {a.max_turns} turns of {g.max_new_tokens} "
        f"tokens, {a.max_episode_tokens} tokens per episode, opening of 226-241 tokens: system "
        "prompt with the tool's description), scored as `hone eval accuracy --config "
        "configs/smollm2/agent_calculator_grpo.yaml` scores it: the final reply's number "
        "against the answer.",
        f"Warm start: LoRA rank {sft_cfg.model.lora.rank} SFT on builtin:calculator-traces, "
        f"{sft_cfg.train.max_steps} steps x {sft_cfg.train.batch_size} conversations, lr "
        f"{sft_cfg.train.lr} (loss {losses[0]:.3f} -> {losses[-1]:.3f}), merged. GRPO: fresh "
        f"LoRA rank {grpo_cfg.model.lora.rank} on the merged warm start, "
        f"{grpo_cfg.train.max_steps} steps x {grpo_cfg.train.batch_size // g.group_size} "
        f"questions x {g.group_size} episodes, temperature {g.temperature}, lr "
        f"{grpo_cfg.train.lr}, beta {g.beta}, {g.loss_agg}, clip {g.clip_eps}/{g.clip_eps_high}; "
        "reward 1 when the final reply's number is the answer.",
        "",
        "| model | held-out accuracy | mean reward | turns | tool calls | malformed calls |",
        "|---|---|---|---|---|---|",
        *table,
        *worded,
        "",
        f"Agentic GRPO over its warm start: {over_sft:+.1f} points (goal +15); over the model "
        f"without tools: {over_plain:+.1f} points (goal +40). The GRPO run's own held-out "
        f"evaluations (the same greedy episodes, played inside the run): {', '.join(evals)}. "
        f"Wall time {minutes:.1f} minutes in all, of which {results['pipeline_s'] / 60:.1f} for the "
        "pipeline's stages this invocation ran (training, evaluations, exports).",
        "",
        "GRPO curve (means over 5 steps of the sampled episodes: reward, its standard deviation "
        "over the step's episodes, the share of groups whose rewards were all equal (- where "
        "the run predates that metric), model turns and tool calls per episode, seconds "
        "per rollout and per update):",
        "",
        "| steps | reward | reward std | zero-std groups | turns | tool calls | rollout s | "
        "update s |",
        "|---|---|---|---|---|---|---|---|",
        *chunks,
    ])


if __name__ == "__main__":
    main()
