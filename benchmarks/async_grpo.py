"""A GRPO step of configs/smollm2/grpo_lora.yaml with up to 256 new tokens, synchronous against
asynchronous (grpo.max_staleness = 1: the rollout of step t sampled with the weights of step
t - 1 on a thread while update t - 1 runs): one `hone grpo` run of each, one after the other, the
same settings otherwise (8 steps, no checkpoints, one held-out prompt, train.grad_accum 2 so that
a rollout and an update in memory at once fit this 24 GiB machine).

Reported per run over steps 3..8: the medians of step_s (the step's wall time, from metrics.jsonl),
rollout_s, update_s and overlap_s (the part of the rollout that ran during the previous update).
With --one-core, a third run (synchronous, 4 steps, `taskset -c 0`) gives each phase's one-core
time, from which the best ratio this machine allows is derived, R1, U1 being the rollout and
update on one core and R2, U2 on two (the synchronous run):

- the best schedule of the measured speeds: at any moment the two cores run the rollout alone,
  the update alone, or one phase on each core; a step mixes these, and its length is linear in
  the time spent one-on-each, so the best mix is one end: the whole rollout on one core beside
  the update on the other, then the rest of the update on both,

      best async step = min(R2 + U2, R1 + (1 - R1 / U1) U2);

- a looser floor: two cores can at most spread the phases' one-core work evenly, and the
  update cannot run faster than on both, so a step takes at least max((R1 + U1) / 2, U2). It
  is reached only if the update's work also spread over two cores at one-core speed (U2 =
  U1 / 2), or if the rollout ran only in the cycles the update leaves idle;

each ratio being that step over R2 + U2.

With --host-devices N the runs see N CPU devices (XLA's --xla_force_host_platform_device_count)
and give the rollout the last one (grpo.rollout_devices=1), so the two phases share no device:
the layout of a machine with separate accelerators, here on one host's cores (run it on a host
with more than two). --timeline prints each step's phases from metrics.jsonl: the rollout the
step consumed (its wall time and how long the step waited for it) and the update.

    .venv/bin/python benchmarks/async_grpo.py [--steps 8] [--new-tokens 256] [--one-core]
        [--host-devices N] [--timeline]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(staleness: int, steps: int, new_tokens: int, run_dir: Path, first: int,
        pin: bool = False, host_devices: int = 0) -> dict:
    cmd = [sys.executable, "-m", "hone.cli", "grpo", "--config",
           str(ROOT / "configs/smollm2/grpo_lora.yaml"), f"run_dir={run_dir}",
           f"grpo.max_new_tokens={new_tokens}", f"train.max_steps={steps}",
           "train.eval_every=1000", "grpo.eval_prompts=1", "checkpoint.every_steps=1000",
           "train.grad_accum=2", "log.sinks=[jsonl]", f"grpo.max_staleness={staleness}"]
    env = dict(os.environ)
    if host_devices:
        cmd.append("grpo.rollout_devices=1")
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={host_devices}").strip()
    if pin:
        cmd = ["taskset", "-c", "0", *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r.get("step", 0) >= first and "step_s" in r]
    med = lambda key: statistics.median(r.get(key, 0.0) for r in timed)  # noqa: E731
    return {"staleness": staleness, "one_core": pin, "cores": 1 if pin else os.cpu_count(),
            "devices": host_devices or 1, "step_s": med("step_s"),
            "rollout_s": med("rollout_s"), "update_s": med("update_s"),
            "overlap_s": med("overlap_s"), "steps": [r["step"] for r in timed],
            "step_s_each": [round(r["step_s"], 2) for r in timed],
            "reward_mean": statistics.mean(r["reward_mean"] for r in timed),
            # A synchronous step waits for its whole rollout.
            "timeline": [{k: round(r.get(k, r.get("rollout_s", 0.0)), 2) for k in
                          ("step", "step_s", "rollout_s", "rollout_wait_s", "update_s")}
                         for r in rows if "step_s" in r],
            "peak_rss_mb": max(before, peak) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--one-core", action="store_true",
                    help="also time both phases on one core (a third run, 4 steps)")
    ap.add_argument("--host-devices", type=int, default=0,
                    help="N CPU devices, the rollout on the last (grpo.rollout_devices=1)")
    ap.add_argument("--timeline", action="store_true", help="each step's phases")
    ap.add_argument("--staleness", default="0,1",
                    help="the runs, by max_staleness (one alone, for a machine whose calls "
                         "are short; the ratio is then taken by hand)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(s, args.steps, args.new_tokens, Path(tmp) / f"s{s}", first=3,
                    host_devices=args.host_devices)
                for s in map(int, args.staleness.split(","))]
        if args.one_core:
            rows.append(run(0, 4, args.new_tokens, Path(tmp) / "one", first=2, pin=True))
    print("| max_staleness | cores | devices | step s | rollout s | update s | overlap s | "
          "peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['staleness']} | {r['cores']} | {r['devices']} | {r['step_s']:.1f} | "
              f"{r['rollout_s']:.1f} | {r['update_s']:.1f} | {r['overlap_s']:.1f} | "
              f"{r['peak_rss_mb']:,.0f} |")
    if args.timeline:
        for r in rows:
            print(f"\nmax_staleness {r['staleness']}: step | step s | rollout s (its own) | "
                  f"waited for it s | update s")
            for t in r["timeline"]:
                print(f"  {t['step']} | {t['step_s']:.1f} | {t['rollout_s']:.1f} | "
                      f"{t['rollout_wait_s']:.1f} | {t['update_s']:.1f}")
    if len(rows) < 2 or [r["staleness"] for r in rows[:2]] != [0, 1]:
        print(json.dumps(rows))
        return
    sync, lag = rows[0], rows[1]
    print(f"step_s, staleness 1 / 0: {lag['step_s'] / sync['step_s']:.3f} (goal <= 0.85)")
    if args.one_core:
        one = rows[2]
        r1, u1, r2, u2 = one["rollout_s"], one["update_s"], sync["rollout_s"], sync["update_s"]
        split = r1 + (1 - min(r1 / u1, 1.0)) * u2
        print(f"best schedule of the measured speeds: min({r2:.1f} + {u2:.1f}, {r1:.1f} + "
              f"(1 - {r1:.1f} / {u1:.1f}) x {u2:.1f}) = {min(r2 + u2, split):.1f} s, ratio "
              f"{min(r2 + u2, split) / (r2 + u2):.3f}")
        floor = max((r1 + u1) / 2, u2)
        print(f"looser floor: max(({r1:.1f} + {u1:.1f}) / 2, {u2:.1f}) = {floor:.1f} s, ratio "
              f"{floor / (r2 + u2):.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
