"""Multi-turn rollout speed on SmolLM2-135M-Instruct: episodes of 3 turns against single-turn
decoding at the same batch, and against re-running the whole history every turn.

Three ways to produce the same amount of model text (B rows, 3 turns of N tokens each, a short
environment message between turns; no row stops early, so every row samples 3·N tokens):

  single-turn   `hone.generate` of 3·N new tokens per row: the ceiling (one prefill, one
                decode loop)
  agent         `hone.agents.rollout`: one prefill, then per turn a decode loop and an
                `extend` that appends the environment's tokens to the live KV cache
  re-prefill    per turn, `hone.generate` over the whole episode so far (opening, earlier
                turns and environment messages) as a new prompt: what a sampler without an
                extend mode does

Each is run once to compile and then timed (median of --repeats). Reported: model tokens per
second (sampled tokens / wall time) and the agent's share of the single-turn figure.

    .venv/bin/python benchmarks/agent_rollout.py [--batch 8] [--turn-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import hone
from hone.agents import Step
from hone.agents.rollout import rollout
from hone.sampling.generate import encode_prompt

QUESTIONS = ["What is 4821 * 367?", "Plan a three-day trip to Kyoto.",
             "Explain how a heat pump works.", "Write a short story about a lighthouse.",
             "What is the derivative of x^3 sin x?", "List five facts about octopuses.",
             "How do vaccines train the immune system?", "Describe the rules of chess briefly."]


class KeepGoing:
    """Asks for more after each turn; done after `turns` replies."""

    tools = None
    turns = 3

    def reset(self, example):
        self.left = self.turns
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        self.left -= 1
        return Step([{"role": "user", "content": "Good. Now say more about it, in detail."}],
                    done=self.left <= 0)


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
    args = ap.parse_args()
    KeepGoing.turns = args.turns
    source = "smollm2-135m-instruct"
    tok = hone.load_tokenizer(source)
    model = hone.load_model(source, dtype="float32")
    examples = [{"prompt": QUESTIONS[i % len(QUESTIONS)]} for i in range(args.batch)]
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
    figures = {}
    for name, sec in seconds.items():
        figures[name] = {"seconds": sec, "tokens_per_s": sampled / sec}
        print(f"{name:12s} {sec:7.2f} s  {sampled / sec:8.1f} model tokens/s", flush=True)
    share = figures["agent"]["tokens_per_s"] / figures["single-turn"]["tokens_per_s"]
    print(f"agent / single-turn: {share:.2f}; re-prefill / single-turn: "
          f"{figures['re-prefill']['tokens_per_s'] / figures['single-turn']['tokens_per_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": platform.processor(),
                       "batch": b, "turns": turns, "turn_tokens": n, "figures": figures,
                       "agent_share": share}, f, indent=1)


def _turn_start(ep, t: int) -> int:
    """The index of the first token of model turn t (0-based) in an episode."""
    starts = [k for k, m in enumerate(ep.model_mask) if m and (k == 0 or not ep.model_mask[k - 1])]
    return starts[t]


if __name__ == "__main__":
    main()
