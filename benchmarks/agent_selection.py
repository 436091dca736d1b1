"""An agent with every choice made on a validation split: which warm start, and which GRPO
checkpoint, are picked by greedy score on the task's validation set; the test sets are scored
only once, on the chosen models. Tasks (--task):

- calculator: validation builtin:calculator-agent-validation (operands of its own, half its
  questions in wordings no other set uses); tests builtin:calculator-agent-eval (held-out
  operands) and -eval-wordings (held-out operands in held-out wordings); score: accuracy.
- countdown: validation builtin:countdown-validation; test builtin:countdown-eval (puzzles that
  occur in no other set); score: the mean reward (1 for a right "Answer:" expression).
- countdown-checked: countdown whose calculator results say whether the try solved the puzzle
  (hone.agents.tasks.CheckedCountdown), its warm start on builtin:countdown-checked-traces
  (the countdown configs, with the settings of TASKS["countdown-checked"]).

    .venv/bin/python benchmarks/agent_selection.py [--task countdown] [--write]
        [--lengths 4,8,16,32] [--steps 30] [--step-offset 64] [--test-questions 128]
        [--grpo-set grpo.temperature=0.8 ...] [--out DIR]

With --step-offset N the GRPO step is chosen on validation records N.. (N + --questions), not on
the records that chose the warm start: a choice scored on the records that made it is biased up.

1. Warm start: LoRA SFT of configs/smollm2/agent_TASK_sft.yaml for each length L of --lengths
   (separate runs, each with its own schedule), merged; each scored as an agent on the first
   --questions validation records; the best wins (a tie goes to the shorter).
2. Agentic GRPO (configs/smollm2/agent_TASK_grpo.yaml) from that warm start for --steps
   steps, its in-run evaluation pointed at the validation set every --every steps and a
   checkpoint kept at each; the best step wins (a tie goes to the earlier; step 0 is the warm
   start itself).
3. The chosen warm start and the chosen checkpoint on the test sets.

The other GRPO settings (rate, batch, temperature, clipping) are the config's unless --grpo-set
names them (each run's report lists what it set).
Every measurement is kept in OUT/results.json as it is made, so a rerun continues where it
stopped (delete OUT to start again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agent_calculator import agent_row, keep, measure  # noqa: E402

TASKS = {
    "calculator": {
        "sft": "configs/smollm2/agent_calculator_sft.yaml",
        "grpo": "configs/smollm2/agent_calculator_grpo.yaml",
        "traces": "builtin:calculator-traces",
        "validation": "builtin:calculator-agent-validation",
        "tests": {"operands": "builtin:calculator-agent-eval",
                  "wordings": "builtin:calculator-agent-eval-wordings"},
        "score": "accuracy", "curve": "eval_accuracy", "lengths": "4,8,16,32",
        "title": "Agents: calculator, settings chosen on a validation split",
        "validation_text": "operands that occur in no training or test question, every other "
        "question in a training wording and the rest in three validation wordings per "
        "operation that no other set uses",
        "scoring": "one greedy episode per question with the calculator, the final reply's "
        "number against the answer"},
    "countdown": {
        "sft": "configs/smollm2/agent_countdown_sft.yaml",
        "grpo": "configs/smollm2/agent_countdown_grpo.yaml",
        "traces": "builtin:countdown-traces",
        "validation": "builtin:countdown-validation",
        "tests": {"puzzles": "builtin:countdown-eval"},
        "score": "reward_mean", "curve": "eval_reward", "lengths": "8,16,32,64",
        "title": "Agents: countdown, settings chosen on a validation split",
        "validation_text": "puzzles (three numbers from 2 to 25, a target from 10 to 99) that "
        "occur in no training or test set",
        "scoring": "one greedy episode per puzzle with the calculator, solved when the final "
        "reply's \"Answer:\" expression uses each number once and makes the target"},
}
# Countdown whose calculator results say whether the try solved the puzzle
# (hone.agents.tasks.CheckedCountdown), warm-started on traces shown the same way with up to
# two misses (episodes of three tries run to 492 tokens in SmolLM2's template).
TASKS["countdown-checked"] = {
    **TASKS["countdown"],
    "traces": "builtin:countdown-checked-traces",
    "sft_set": ["data.path=builtin:countdown-checked-traces", "data.max_length=512"],
    "grpo_task_set": ["agent.environment=hone.agents.tasks:CheckedCountdown",
                      "agent.max_episode_tokens=512"],
    "title": "Agents: countdown with checked results",
    "scoring": "one greedy episode per puzzle with the checked calculator (each result says "
    "whether the try solved the puzzle), solved when the final reply's \"Answer:\" expression "
    "uses each number once and makes the target"}


def note(text: str) -> None:
    print(f"agent_selection: {text}", flush=True)


def hone(*args: str) -> None:
    """One hone command in its own process (each run's compiled programs and memory its own).
    `python -m` from ROOT imports this checkout's hone: the `hone` script of a venv shared with
    another checkout (a worktree at an older commit) would import the one it was installed from."""
    cmd = [sys.executable, "-m", "hone.cli", *args]
    note(" ".join(cmd))
    subprocess.run(cmd, check=True, cwd=ROOT)


def grpo_config(task: dict, overrides: list[str]):
    from hone.config import COMMANDS, load_config
    return load_config(COMMANDS["grpo"], str(ROOT / task["grpo"]),
                       [*task.get("grpo_task_set", []), *overrides])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="calculator")
    parser.add_argument("--questions", type=int, default=64, help="questions per set scored")
    parser.add_argument("--step-offset", type=int, default=0,
                        help="choose the GRPO step on validation records OFFSET.. (OFFSET + "
                        "--questions), not on the ones that chose the warm start (default 0: "
                        "the same records)")
    parser.add_argument("--test-questions", type=int, default=None,
                        help="questions per test set (default --questions)")
    parser.add_argument("--lengths", default=None,
                        help="warm start lengths to try (default: the task's)")
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps of the one run")
    parser.add_argument("--every", type=int, default=5, help="GRPO steps between validations")
    parser.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the GRPO run (repeatable), e.g. grpo.temperature=0.8")
    parser.add_argument("--title", default=None, help="the RESULTS.md section's title")
    parser.add_argument("--out", default=None,
                        help="default runs/bench-agent-selection (calculator), "
                        "runs/bench-agent-selection-TASK (others)")
    parser.add_argument("--write", action="store_true", help="write the RESULTS.md section")
    args = parser.parse_args()
    args.test_questions = args.test_questions or args.questions
    from hone.data.loader import load_records

    task = TASKS[args.task]
    default_out = "runs/bench-agent-selection" + (
        "" if args.task == "calculator" else f"-{args.task}")
    out = (ROOT / (args.out or default_out)).resolve()
    sft, grpo, score = ROOT / task["sft"], ROOT / task["grpo"], task["score"]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    lengths = [int(x) for x in (args.lengths or task["lengths"]).split(",")]
    keep(results, path, "setup", {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} CPU cores, "
        f"{platform.machine()}, {platform.system()}", "questions": args.questions,
        "lengths": lengths, "steps": args.steps, "every": args.every, "task": args.task,
        "grpo_set": args.grpo_set, "step_offset": args.step_offset,
        "test_questions": args.test_questions})
    validation = load_records(task["validation"], None, args.questions)
    step_validation = task["validation"]
    if args.step_offset:
        step_validation = str(out / "step-validation.jsonl")
        records = load_records(task["validation"], None, args.step_offset + args.questions)
        Path(step_validation).write_text("".join(
            json.dumps(r) + "\n" for r in records[args.step_offset:]))
    cfg = grpo_config(task, args.grpo_set)
    if args.title:
        task = {**task, "title": args.title}

    # 1. the warm start's length
    for length in lengths:
        run = out / f"sft-{length}"
        if not (run / "export").exists():
            hone("sft", "--config", str(sft), f"run_dir={run}", f"train.max_steps={length}",
                 f"checkpoint.every_steps={length}", "log.sinks=[jsonl]",
                 *task.get("sft_set", []))
            hone("export", "--run", str(run), "--out", str(run / "export"))
        measure(results, path, f"validation_sft_{length}",
                lambda run=run: agent_row(str(run / "export"), cfg, validation))
    best = max(lengths, key=lambda n: (results[f"validation_sft_{n}"][score], -n))
    keep(results, path, "chosen_length", best)
    warm = out / f"sft-{best}" / "export"

    # 2. the GRPO checkpoint
    run = out / "grpo"
    if not (run / "metrics.jsonl").exists() or "grpo_s" not in results:
        t0 = time.perf_counter()
        hone("grpo", "--config", str(grpo), f"run_dir={run}", f"model.source={warm}",
             f"train.max_steps={args.steps}", f"train.eval_every={args.every}",
             f"data.eval_path={step_validation}", f"grpo.eval_prompts={args.questions}",
             f"checkpoint.every_steps={args.every}",
             f"checkpoint.keep={args.steps // args.every + 1}", "log.sinks=[jsonl]",
             *task.get("grpo_task_set", []), *args.grpo_set)
        keep(results, path, "grpo_s", time.perf_counter() - t0)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = {r["step"]: r[task["curve"]] for r in rows if task["curve"] in r}
    keep(results, path, "validation_curve", curve)
    keep(results, path, "train_curve", [
        {k: r[k] for k in ("step", "reward_mean", "rollout_s", "update_s") if k in r}
        for r in rows if "loss" in r])
    step = max(sorted(curve), key=lambda s: curve[s])  # max keeps the first of equals
    keep(results, path, "chosen_step", step)
    chosen = warm
    if step > 0:
        chosen = out / f"grpo-step{step}"
        if not chosen.exists():
            hone("export", "--run", str(run), "--out", str(chosen), "--step", str(step))

    # 3. the test sets, once, on the chosen models
    for name, source in task["tests"].items():
        records = load_records(source, None, args.test_questions)
        measure(results, path, f"test_{name}_warm", lambda r=records: agent_row(str(warm), cfg, r))
        measure(results, path, f"test_{name}_grpo",
                lambda r=records: agent_row(str(chosen), cfg, r))
    section = report(results, cfg, task)
    print(section)
    if args.write:
        from _driver import write_section
        write_section(task["title"], section)


def report(results: dict, cfg, task: dict) -> str:
    s, g, a, score = results["setup"], cfg.grpo, cfg.agent, task["score"]
    unit = "accuracy" if score == "accuracy" else "solved"
    best, step, curve = results["chosen_length"], results["chosen_step"], results["validation_curve"]
    lengths = "\n".join(
        f"| {n} | {results[f'validation_sft_{n}'][score]:.1%} | "
        f"{'chosen' if n == best else ''} |" for n in s["lengths"])
    steps = "\n".join(f"| {k} | {v:.1%} | {'chosen' if int(k) == int(step) else ''} |"
                      for k, v in sorted(curve.items(), key=lambda kv: int(kv[0])))
    tests, gains = [], []
    for name, source in task["tests"].items():
        w, r = results[f"test_{name}_warm"][score], results[f"test_{name}_grpo"][score]
        gains.append((r - w) * 100)
        tests.append(f"| {source} | {w:.1%} | {r:.1%} | {(r - w) * 100:+.1f} |")
    met = all(x >= 10 for x in gains)
    train = results["train_curve"]
    mean = lambda key: sum(r.get(key, 0.0) for r in train) / max(len(train), 1)  # noqa: E731
    minutes = (sum(v["seconds"] for v in results.values() if isinstance(v, dict)
                   and "seconds" in v) + results.get("grpo_s", 0.0)) / 60
    q, offset = s["questions"], s.get("step_offset", 0)
    chosen_on = (f"the first {q} records of {task['validation']}" if not offset else
                 f"records of {task['validation']}: the warm start's length on the first {q}, "
                 f"the GRPO step on the next {q} (records {offset}-{offset + q - 1}), so "
                 "neither choice is scored on the records that made the other")
    return "\n".join([
        f"## {task['title']}", "",
        f"Measured {s['date']} on {s['machine']} with `benchmarks/agent_selection.py --task "
        f"{s.get('task', 'calculator')}` ({task['sft']}, then {task['grpo']}). Every choice was "
        f"made on {chosen_on}: "
        f"{task['validation_text']}. The test sets were scored once, after both choices, on "
        f"the chosen models only. Scoring: {task['scoring']} (up to {a.max_turns} turns of "
        f"{g.max_new_tokens} tokens).",
        "",
        f"1. Warm start: LoRA SFT on {task['traces']}, one run per length (each with its own "
        f"warmup and cosine schedule), merged; validation {unit}:", "",
        f"| SFT steps | validation {unit} | |", "|---|---|---|", lengths, "",
        f"2. Agentic GRPO from the {best}-step warm start, {s['steps']} steps x "
        f"{cfg.train.batch_size // g.group_size} questions x {g.group_size} episodes (lr "
        f"{cfg.train.lr}, temperature {g.temperature}, {g.loss_agg}, clip "
        f"{g.clip_eps}/{g.clip_eps_high}; "
        + (f"set for this run: {', '.join(s['grpo_set'])}" if s.get("grpo_set")
           else "the config's settings, not tuned here") + "), validated "
        f"every {s['every']} steps inside the run"
        + (f" on validation records {offset}-{offset + q - 1}" if offset else "") + ":", "",
        f"| GRPO step | validation {unit} | |", "|---|---|---|", steps, "",
        f"3. The test sets (first {s.get('test_questions', q)} questions each), scored once:",
        "",
        f"| test set | warm start ({best} steps) | GRPO (step {step}) | points |",
        "|---|---|---|---|", *tests, "",
        f"Goal (issue 46: agentic GRPO >= +10 points over its warm start on held-out problems, "
        f"every setting chosen on a validation split): {'met' if met else 'NOT met'} "
        f"({', '.join(f'{x:+.1f}' for x in gains)} points). GRPO: mean reward of the sampled "
        f"episodes {mean('reward_mean'):.3f}, {mean('rollout_s'):.1f} s rollout and "
        f"{mean('update_s'):.1f} s update per step. Wall time {minutes:.1f} minutes (training, "
        "exports and scoring), on a machine shared with other jobs; one seed.",
    ])


if __name__ == "__main__":
    main()
