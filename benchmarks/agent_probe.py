"""How a model behaves as the countdown agent, beyond its score: how many tries it makes, whether
it answers only after a try hit the target, and how often sampled episodes solve a puzzle.

    .venv/bin/python benchmarks/agent_probe.py --model runs/.../export [--questions 64]
        [--temperatures 0,0.7,1.0] [--samples 4] [--config configs/smollm2/agent_countdown_grpo.yaml]

For each temperature, every one of the first --questions records of the config's eval set
(builtin:countdown-validation) is played once greedily (temperature 0) or --samples times, with
the config's agent section, as `hone eval accuracy --config` and a run's in-run evaluation play
it. Printed per temperature: solved (mean reward), pass@k over a record's samples, the share of
episodes by number of tries, and the environment's counters per episode: `target_hits` (tries
that solve the puzzle) and `unchecked_answers` (answers given before any try had solved it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe(rollouts, model, records: list[dict], temperature: float, samples: int) -> dict:
    from hone.eval.agent import play_records
    k = 1 if temperature == 0 else samples
    episodes = play_records(rollouts, model, records, samples=k, temperature=temperature,
                            batch_size=16)  # 16 records a call, as the recorded figures
    n = len(episodes)
    tries = Counter(ep.events.get("tool_calls", 0) for ep in episodes)
    solved = [ep.reward > 0 for ep in episodes]
    return {
        "temperature": temperature, "episodes": n, "samples": k,
        "solved": sum(solved) / n,
        f"pass@{k}": sum(any(solved[i * k:(i + 1) * k]) for i in range(len(records)))
        / len(records),
        "tries": {str(t): c / n for t, c in sorted(tries.items())},
        "target_hits": sum(ep.events.get("target_hits", 0) for ep in episodes) / n,
        "unchecked_answers": sum(ep.events.get("unchecked_answers", 0) for ep in episodes) / n,
        "turn_limits": sum(ep.limit is not None for ep in episodes) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", default="configs/smollm2/agent_countdown_grpo.yaml")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--temperatures", default="0")
    parser.add_argument("--samples", type=int, default=4, help="episodes per record when sampled")
    args = parser.parse_args()
    from hone.data.loader import load_records
    from hone.eval.agent import agent_config, scoring_rollouts
    from hone.eval.models import load_policy
    cfg = agent_config(str(ROOT / args.config))
    records = load_records(cfg.data.eval_path, None, args.questions)
    model, tokenizer = load_policy(args.model)
    rollouts = scoring_rollouts(cfg, tokenizer)
    for t in (float(x) for x in args.temperatures.split(",")):
        print(json.dumps(probe(rollouts, model, records, t, args.samples)), flush=True)


if __name__ == "__main__":  # the tool runner's worker processes import this module
    main()
