"""Writes docs/RELIABILITY.md: what hone promises about failures, the test that holds each
promise, and the figures of the last fault-test run (scripts/fault_test.py --doc)."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

PROMISES = [
    ("A killed run loses at most the steps since its last checkpoint, and the resumed run ends "
     "bit-identical to one that never stopped (parameters, optimizer state, metrics).",
     "scripts/fault_test.py (figures below); tests/train/test_resume.py, "
     "tests/train/test_fault_script.py"),
    ("A checkpoint becomes visible only when complete: Orbax writes into a temporary folder "
     "and renames it; hone writes a manifest (sha256 of every file) inside it before the "
     "rename.", "tests/train/test_checkpoint_safety.py"),
    ("A damaged or truncated newest checkpoint is set aside with a warning and the run resumes "
     "from the previous one; if none verifies, the run stops instead of starting over.",
     "tests/train/test_checkpoint_safety.py"),
    ("A second process training into the same run_dir is refused before it writes anything.",
     "tests/train/test_checkpoint_safety.py"),
    ("SIGTERM or SIGINT saves a checkpoint at the next step boundary and exits with status 1; "
     "the same command resumes. A step that has not ended within `checkpoint.grace_seconds` "
     "of the signal is not waited for: the process exits at once, keeping the last checkpoint.",
     "tests/train/test_resume.py"),
    ("A full disk during a save stops the run with a clear error; the earlier checkpoints stay "
     "loadable.", "tests/train/test_checkpoint_safety.py"),
    ("A non-finite loss or gradient skips the update (counted); after `guard.max_skips` in a "
     "row, or a loss spike, a gradient norm over its limit, or an RL KL over `guard.max_kl`, the "
     "run rolls back to the newest checkpoint with the learning rate times `guard.lr_factor`. "
     "The guard state is checkpointed, so a resumed run takes the same decisions.",
     "tests/train/test_guards.py"),
    ("On an out-of-memory error the per-device micro-batch is halved and gradient accumulation "
     "doubled (same global batch, same numbers), down to one row.",
     "tests/train/test_oom.py"),
    ("After a restore, replicated parameters are checked to agree across devices and the "
     "checkpoint's hash is logged.", "tests/parallel/test_mesh_parity.py"),
    ("Data files, configs, chat templates, safetensors and GGUF files that are malformed or "
     "lie about their sizes give a one-paragraph error naming the file (hypothesis fuzzing, "
     "2,000 cases per reader); nothing is unpickled and YAML is loaded safely.", "tests/fuzz/"),
    ("Exports write only inside the chosen folder, appear whole or not at all, and replace a "
     "folder only when it holds nothing but an earlier export (`--out ~` is refused).",
     "tests/recipes/test_export.py"),
    ("With rollouts a fixed number of policy versions behind the updates "
     "(`grpo.max_staleness`), a run killed with a rollout in flight resumes bit-identical: the "
     "checkpoint holds the versions the next rollouts read and the data position before the "
     "rollout in flight, which is sampled again. A rollout that fails on its thread is run once "
     "more from the same prompts; one that hangs past `rollout_timeout_s` stops the run with an "
     "error naming the step.",
     "tests/recipes/test_rl_recipes.py, tests/train/test_lagged.py; "
     "scripts/fault_test.py --algos grpo_async"),
    ("Reward functions run with a timeout; a reward that raises or hangs scores as an event, "
     "not a crash.", "tests/rl/test_rewards.py"),
]


def write_doc(summary: dict, results: list[dict], path: Path) -> None:
    s = summary
    lines = [
        "# Reliability",
        "",
        "What hone promises when a run meets a crash, a preemption, a damaged checkpoint, a "
        "full disk, a numeric blow-up or hostile input, and where each promise is tested. "
        "Written by `python scripts/fault_test.py --trials 24 --doc`; do not edit by hand.",
        "",
        "| promise | held by |",
        "|---|---|",
        *[f"| {p} | {t} |" for p, t in PROMISES],
        "",
        "## Fault test: SIGKILL at random moments",
        "",
        f"Run on {datetime.date.today().isoformat()}, {platform.machine()} "
        f"{platform.system()}, seed {s['seed']}, {s['wall_s']:.0f} s in all. Tiny-preset runs "
        f"(steps: " + ", ".join(f"{a} {n}" for a, n in s["steps"].items()) + "; straight "
        "through: " + ", ".join(f"{a} {t:.1f} s" for a, t in s["straight_s"].items()) + ").",
        "",
        f"- trials: **{s['trials']}** (" + ", ".join(f"{a} {n}" for a, n in
                                                    s["per_algo"].items()) + ")",
        f"- SIGKILLs: **{s['kills']}**, of which **{s['kills_in_checkpoint_write']}** inside a "
        f"checkpoint write and {s['kills_before_first_checkpoint']} before the first "
        f"checkpoint",
        f"- resumed runs bit-identical to the uninterrupted run (every array of the final "
        f"state and every metric): **{s['ok']} of {s['trials']}**",
        "",
        "Kill modes: `save` waits for a checkpoint write to start and kills inside it; `step` "
        "kills at a random moment of training; `time` at a random time after the process "
        "started (imports, compiling and restoring included).",
        "",
        "| trial | algorithm | kills (mode, time after start, newest logged step and "
        "checkpoint at the kill) | identical |",
        "|---|---|---|---|",
    ]
    for r in results:
        kills = "; ".join(
            f"{k['mode']} at {k['at_s']:.2f} s"
            + (", inside a checkpoint write" if k["in_checkpoint_write"] else "")
            + f", logged step {k['logged_step']}, checkpoint "
            + (str(k["checkpoint_before"]) if k["checkpoint_before"] else "none")
            + ("" if k["killed"] else " (the run ended first)") for k in r["kills"])
        lines.append(f"| {r['trial']} | {r['algo']} | {kills} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    lines += ["", "Summary line:", "", "```", json.dumps(s), "```", ""]
    path.write_text("\n".join(lines))
