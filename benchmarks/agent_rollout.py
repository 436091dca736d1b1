"""Multi-turn rollout speed on SmolLM2-135M-Instruct: episodes of 3 turns against single-turn
decoding at the same batch, and against re-running the whole history every turn.

Three ways to produce the same amount of model text (B rows, 3 turns of N tokens each, a short
environment message between turns; no row stops early, so every row samples 3·N tokens):

  single-turn   `hone.generate` of 3·N new tokens per row: the ceiling (one prefill, one
                decode loop)
  agent         `hone.agents.rollout` on the paged engine: each turn's environment tokens
                are prefilled into the episode's own pages, then the next turn decodes
  re-prefill    per turn, `hone.generate` over the whole episode so far (opening, earlier
                turns and environment messages) as a new prompt: what a sampler without an
                extend mode does

With --tunix, a fourth row: the same episodes with Tunix's agentic rollout (its
RolloutOrchestrator, trajectory engine, ModelAgent and vanilla sampler on the same SmolLM2
weights, which this script writes with hone.save_hf to a temporary folder), run by
agent_rollout_tunix.py in the Tunix venv (_venvs.py creates it if missing) as a separate process
after hone's rows, never beside them.

Each is run once to compile and then timed (median of --repeats). Reported: model tokens per
second (sampled tokens / wall time) and the agent's share of the single-turn figure.

    .venv/bin/python benchmarks/agent_rollout.py [--batch 8] [--turn-tokens 32] [--repeats 3]
    .venv/bin/python benchmarks/agent_rollout.py --tunix     # and Tunix's episodes
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import hone
from hone.agents import Step
from hone.agents.rollout import rollout
from hone.sampling.generate import encode_prompt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402
from _agent_task import FOLLOW_UP, question  # noqa: E402


class KeepGoing:
    """Asks for more after each turn; done after `turns` replies."""

    tools = None
    turns = 3

    def reset(self, example):
        self.left = self.turns
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        self.left -= 1
        return Step([{"role": "user", "content": FOLLOW_UP}], done=self.left <= 0)


def timed(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, run in rotation after one compiling call each (so a
    change in the machine's load falls on all of them alike)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the figures here too")
    ap.add_argument("--tunix", action="store_true",
                    help="also time Tunix's agentic rollout on the same episodes")
    args = ap.parse_args()
    if args.tunix:
        _driver.python_for("tunix")  # create the Tunix venv now, before any timing
    KeepGoing.turns = args.turns
    source = "smollm2-135m-instruct"
    tok = hone.load_tokenizer(source)
    model = hone.load_model(source, dtype="float32")
    examples = [{"prompt": question(i)} for i in range(args.batch)]
    n, turns, b = args.turn_tokens, args.turns, args.batch
    never = (-1,)  # no end token: every turn samples exactly n tokens

    def agent():
        return rollout(model, tok, KeepGoing, examples, max_turns=turns, max_new_tokens=n,
                       max_episode_tokens=2048, max_env_tokens=64, temperature=1.0, seed=0,
                       eos_ids=never)

    prompts = [encode_prompt(tok, tok.apply_chat_template(
        [{"role": "user", "content": e["prompt"]}], add_generation_prompt=True)) for e in examples]

    def single():
        return hone.generate(model, tok, prompts, max_new_tokens=turns * n, temperature=1.0,
                             seed=0, eos_ids=never)

    episodes = agent()  # the histories the re-prefill baseline replays

    def reprefill():
        for t in range(turns):  # the prompt of turn t: everything before its first token
            hist = [ep.tokens[:_turn_start(ep, t)] for ep in episodes]
            hone.generate(model, tok, hist, max_new_tokens=n, temperature=1.0, seed=t,
                          eos_ids=never)

    sampled = b * turns * n
    seconds = timed({"single-turn": single, "agent": agent, "re-prefill": reprefill},
                    args.repeats)
    if args.tunix:
        seconds["tunix"] = tunix_seconds(model, tok, args)
    figures = {}
    for name, sec in seconds.items():
        figures[name] = {"seconds": sec, "tokens_per_s": sampled / sec}
        print(f"{name:12s} {sec:7.2f} s  {sampled / sec:8.1f} model tokens/s", flush=True)
    share = figures["agent"]["tokens_per_s"] / figures["single-turn"]["tokens_per_s"]
    print(f"agent / single-turn: {share:.2f}; " + "; ".join(
        f"{name} / single-turn: "
        f"{figures[name]['tokens_per_s'] / figures['single-turn']['tokens_per_s']:.2f}"
        for name in figures if name not in ("single-turn", "agent")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": platform.processor(),
                       "batch": b, "turns": turns, "turn_tokens": n, "figures": figures,
                       "agent_share": share}, f, indent=1)


def tunix_seconds(model, tok, args) -> float:
    """Median seconds of one batch of Tunix episodes (agent_rollout_tunix.py, in its own process,
    on this model's weights written as a Hugging Face folder)."""
    with tempfile.TemporaryDirectory(prefix="agent_rollout_") as tmp:
        weights = Path(tmp) / "smollm2"
        hone.save_hf(model, weights, tokenizer=tok)
        cmd = _driver.command("tunix", "agent_rollout_tunix.py", "--weights", weights,
                              "--batch", args.batch, "--turns", args.turns,
                              "--turn-tokens", args.turn_tokens, "--repeats", args.repeats)
        rows = _driver.run_json("tunix", cmd, timeout=3600.0, busy=_driver.BUSY)
    return rows[-1]["seconds"]


def _turn_start(ep, t: int) -> int:
    """The index of the first token of model turn t (0-based) in an episode."""
    starts = [k for k, m in enumerate(ep.model_mask) if m and (k == 0 or not ep.model_mask[k - 1])]
    return starts[t]


if __name__ == "__main__":
    main()
