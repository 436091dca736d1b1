"""Kill tiny SFT, DPO, GRPO and agentic GRPO runs with SIGKILL at random moments, resume them, and
check that each ends bit-identical to a run that was never interrupted.

    python scripts/fault_test.py --trials 24 [--algos sft,dpo,grpo,agent] [--seed 0] [--doc]

`agent` is GRPO over multi-turn episodes (configs/tiny/agent_grpo.yaml: the guess-the-number
environment, seeded from the run seed, the step and the episode). `moe`, `moe_dpo` and
`moe_grpo` are SFT, DPO and GRPO of the mixture-of-experts `tiny-moe` (configs/tiny/moe_sft.yaml,
moe_dpo.yaml, moe_grpo.yaml): the router losses and routed experts must resume as exactly as a
dense model (not in the default --algos; run them with --algos moe,moe_dpo,moe_grpo).
`grpo_async` is GRPO with grpo.max_staleness=1: each rollout is sampled a policy version behind
on a thread of its own while the update runs, so kills land with a rollout in flight, which the
resumed run samples again (not in the default --algos either).

Each algorithm first runs once straight through (timed). A trial then starts the same run in a
fresh folder and kills it one to three times before letting it finish. A kill lands inside a
checkpoint write (it waits for Orbax's temporary folder of a step being written), at a random
moment of training (after a random step is logged, plus a random part of a step) or at a random
time after the process started (imports, compiling, restoring); every third trial starts with
each kind. The finished run must have the straight run's metrics.jsonl (every key, exact
text, timing keys aside) and a final checkpoint whose arrays (parameters, optimizer moments,
step, guard state) are bit-identical.

Prints one JSON line per trial and a summary line; --doc rewrites docs/RELIABILITY.md with
the figures (scripts/reliability_doc.py). tests/train/test_fault_script.py runs 3 trials.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Short runs with many checkpoints: many moments to land in, a few seconds each.
COMMON = ["log.sinks=[jsonl]", "checkpoint.keep=3", "checkpoint.async_save=true",
          "data.max_records=64"]
RUNS = {
    "sft": ["train.max_steps=60", "checkpoint.every_steps=6", "train.batch_size=4",
            "train.eval_every=20", "data.eval_path=builtin:arithmetic-eval",
            "train.eval_batches=1"],
    "dpo": ["train.max_steps=30", "checkpoint.every_steps=5", "train.batch_size=4",
            "train.eval_every=10"],
    "grpo": ["train.max_steps=12", "checkpoint.every_steps=3", "train.batch_size=8",
             "grpo.eval_prompts=4", "train.eval_every=6"],
    # GRPO with each rollout a policy version behind, overlapped with the update
    # (hone.train.lagged): a kill often lands with a rollout in flight.
    "grpo_async": ["train.max_steps=12", "checkpoint.every_steps=3", "train.batch_size=8",
                   "grpo.eval_prompts=4", "train.eval_every=6", "grpo.max_staleness=1"],
    "agent": ["train.max_steps=4", "checkpoint.every_steps=2", "train.batch_size=8",
              "grpo.eval_prompts=4", "train.eval_every=4"],
    "moe": ["train.max_steps=30", "checkpoint.every_steps=5", "train.batch_size=4",
            "train.eval_every=15", "train.eval_batches=1"],
    "moe_dpo": ["train.max_steps=30", "checkpoint.every_steps=5", "train.batch_size=4",
                "train.eval_every=10"],
    "moe_grpo": ["train.max_steps=12", "checkpoint.every_steps=3", "train.batch_size=8",
                 "grpo.eval_prompts=4", "train.eval_every=6"],
}
# algo -> (command, tiny config)
COMMANDS = {"grpo_async": ("grpo", "grpo"), "agent": ("grpo", "agent_grpo"), "moe": ("sft", "moe_sft"),
            "moe_dpo": ("dpo", "moe_dpo"), "moe_grpo": ("grpo", "moe_grpo")}
_TMP = ".orbax-checkpoint-tmp"
# The first kill of trial i is MODES[i % 3]; later ones draw from the last two.
MODES = ("save", "step", "time")


def command(algo: str, run_dir: Path) -> list[str]:
    name, config = COMMANDS.get(algo, (algo, algo))
    return [sys.executable, "-m", "hone.cli", name, "--config",
            str(ROOT / f"configs/tiny/{config}.yaml"), f"run_dir={run_dir}", *COMMON, *RUNS[algo]]


def _timing(key: str) -> bool:
    return key.endswith("_s") or key == "mfu" or key.startswith("profile/")


def metrics(run_dir: Path) -> list[str]:
    """metrics.jsonl as text, without the wall-clock keys."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append(json.dumps({k: v for k, v in row.items() if not _timing(k)}, sort_keys=True))
    return rows


def final_arrays(run_dir: Path) -> tuple[int, dict[str, np.ndarray]]:
    import jax

    from hone.checkpoint import Checkpointer
    ckpt = Checkpointer(run_dir / "checkpoints", keep=3, async_save=False)
    try:
        step = ckpt.latest_step()
        state, _ = ckpt.read(step)
    finally:
        ckpt.close()
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    return step, {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat}


def _saving(run_dir: Path) -> bool:
    folder = run_dir / "checkpoints"
    try:
        return any(_TMP in entry.name for entry in os.scandir(folder))
    except FileNotFoundError:
        return False


def _committed(run_dir: Path) -> int | None:
    folder = run_dir / "checkpoints"
    if not folder.exists():
        return None
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
    return max(steps, default=None)


def _logged_step(run_dir: Path) -> int:
    """The newest step in metrics.jsonl (0 when there is none)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(line)["step"] for line in lines if line.endswith("}")),
                   default=0)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def run_killed(algo: str, run_dir: Path, mode: str, rng: random.Random, straight: dict,
               limit: float) -> dict:
    """Start the run and SIGKILL it: `mode` "save" inside a checkpoint write, "step" at a
    random moment of training (after a random step is logged, plus a random part of a step),
    "time" at a random time after the start (imports, compiling and restoring included).
    Reports where it was; a run that ends first is not killed."""
    start_step = _logged_step(run_dir)
    target = rng.randint(start_step + 1, max(start_step + 1, straight["step"] - 1))
    delay = rng.uniform(0.0, straight["seconds"] / straight["step"])
    at = rng.uniform(0.0, straight["seconds"])
    proc = subprocess.Popen(command(algo, run_dir), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    start, reached = time.perf_counter(), None
    try:
        while proc.poll() is None:
            now = time.perf_counter() - start
            if mode == "step" and reached is None and _logged_step(run_dir) >= target:
                reached = now
            due = {"save": lambda: _saving(run_dir),
                   "step": lambda: reached is not None and now >= reached + delay,
                   "time": lambda: now >= at}[mode]()
            if due:
                in_write = _saving(run_dir)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return {"mode": mode, "at_s": round(now, 3), "in_checkpoint_write": in_write,
                        "logged_step": _logged_step(run_dir),
                        "checkpoint_before": _committed(run_dir), "killed": True}
            if now > limit:
                raise RuntimeError(f"{algo} run in {run_dir} was not killed within "
                                   f"{limit:.0f} s ({mode})")
            time.sleep(0.001 if mode == "save" else 0.003)
        return {"mode": mode, "at_s": round(time.perf_counter() - start, 3),
                "in_checkpoint_write": False, "logged_step": _logged_step(run_dir),
                "checkpoint_before": _committed(run_dir), "killed": False,
                "returncode": proc.returncode}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_to_end(algo: str, run_dir: Path) -> float:
    start = time.perf_counter()
    out = subprocess.run(command(algo, run_dir), cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{algo} run in {run_dir} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - start


def trial(algo: str, index: int, work: Path, straight: dict, rng: random.Random,
          max_kills: int = 3) -> dict:
    run_dir = work / f"{algo}-trial{index}"
    kills = []
    for k in range(rng.randint(1, max_kills)):
        mode = MODES[index % 3] if k == 0 else rng.choice(MODES[1:])
        kills.append(run_killed(algo, run_dir, mode, rng, straight,
                                limit=4 * straight["seconds"] + 60))
    run_to_end(algo, run_dir)
    step, arrays = final_arrays(run_dir)
    same_arrays = step == straight["step"] and arrays.keys() == straight["arrays"].keys() and \
        all(np.array_equal(arrays[k], straight["arrays"][k]) and
            arrays[k].dtype == straight["arrays"][k].dtype for k in arrays)
    same_metrics = metrics(run_dir) == straight["metrics"]
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"algo": algo, "trial": index, "kills": kills, "final_step": step,
            "identical_state": same_arrays, "identical_metrics": same_metrics,
            "ok": same_arrays and same_metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=24, help="trials in all, spread over "
                        "the algorithms in turn (default 24)")
    parser.add_argument("--algos", default="sft,dpo,grpo,agent")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    parser.add_argument("--max-kills", type=int, default=3,
                        help="kills per trial are drawn from 1 to this (default 3)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--doc", action="store_true",
                        help="rewrite docs/RELIABILITY.md with the figures")
    args = parser.parse_args(argv)
    algos = args.algos.split(",")
    rng = random.Random(args.seed)
    work = Path(args.work or tempfile.mkdtemp(prefix="hone-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    straight = {}
    for algo in algos:
        seconds = run_to_end(algo, work / f"{algo}-straight")
        step, arrays = final_arrays(work / f"{algo}-straight")
        straight[algo] = {"seconds": seconds, "step": step, "arrays": arrays,
                          "metrics": metrics(work / f"{algo}-straight")}
        print(json.dumps({"algo": algo, "straight_s": round(seconds, 2), "steps": step}),
              flush=True)
    results = []
    for i in range(args.trials):
        algo = algos[i % len(algos)]
        results.append(trial(algo, i, work, straight[algo], rng, args.max_kills))
        print(json.dumps(results[-1]), flush=True)
    kills = [k for r in results for k in r["kills"]]
    summary = {
        "trials": len(results), "ok": sum(r["ok"] for r in results),
        "per_algo": {a: sum(r["algo"] == a for r in results) for a in algos},
        "kills": sum(k["killed"] for k in kills),
        "kills_in_checkpoint_write": sum(k["killed"] and k["in_checkpoint_write"]
                                         for k in kills),
        "kills_before_first_checkpoint": sum(k["killed"] and k["checkpoint_before"] is None
                                             for k in kills),
        "straight_s": {a: round(straight[a]["seconds"], 2) for a in algos},
        "steps": {a: straight[a]["step"] for a in algos},
        "seed": args.seed, "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps({"summary": summary}), flush=True)
    if args.doc:
        from scripts.reliability_doc import write_doc
        write_doc(summary, results, ROOT / "docs/RELIABILITY.md")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] == summary["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
