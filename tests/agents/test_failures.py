"""Every failure an environment or a tool can have, in one agentic GRPO step on the tiny preset:
the run finishes, each event is counted in the step's metrics, and only the episode it struck
is affected (tests/agents/faulty_env.py plays a script of tool calls whatever the model says)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from faulty_env import Hangs
from hone.agents.rollout import rollout
from hone.config import GRPOConfig, load_config
from hone.recipes.grpo import run_grpo
from scripted import KW
ROOT = Path(__file__).resolve().parents[2]
MODES = [None, "reset-raise", "step-raise"]


def test_a_step_survives_every_failure_and_counts_it(tmp_path):
    data = tmp_path / "modes.jsonl"
    data.write_text("".join(json.dumps({"prompt": "go", "mode": m}) + "\n" for m in MODES))
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/agent_grpo.yaml"), [
        f"run_dir={tmp_path / 'run'}", "log.sinks=[jsonl]", "train.max_steps=1",
        f"data.path={data}", "data.eval_path=null", "train.batch_size=6", "grpo.group_size=2",
        "grpo.max_prompt_tokens=64", "agent.environment=faulty_env:Faulty", "agent.max_turns=6",
        "agent.max_episode_tokens=512", "agent.max_tool_tokens=24", "agent.max_env_tokens=128"])
    run_grpo(cfg, log=lambda s: None)
    m = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    c = {k[len("agent/"):]: v for k, v in m.items() if k.startswith("agent/")}
    # Two episodes per record: 2 reset failures, 2 step failures (turn 3).
    assert c["reset_errors"] == 2 and c["env_errors"] == 2
    # Tool failures: 4 episodes reach turn 1 (a hung tool) and 2 (one raises, one returns
    # None); 2 reach turn 3 (9,000 characters: cut) and 4 (malformed, unknown).
    assert c["tool_timeouts"] == 4
    assert c["tool_errors"] == 4 and c["tool_bad_results"] == 4
    assert c["tool_results_cut"] == 2 and c["tool_tokens_cut"] >= 2
    assert c["malformed_calls"] == 2 and c["unknown_tools"] == 2
    # Only the two untroubled episodes finish, rewarded 1 each.
    assert m["reward_mean"] == pytest.approx(2 / 6) and c["done_fraction"] == pytest.approx(2 / 6)
    assert m["loss"] == m["loss"]  # a number: the step ran


def test_hung_or_junk_environments_end_their_own_episodes(tiny):
    model, tok = tiny
    modes = ["reset-hang", "step-hang", "junk", "fine"]
    t0 = time.perf_counter()
    eps = rollout(model, tok, Hangs, [{"mode": m} for m in modes], env_timeout_s=0.3, **KW)
    assert time.perf_counter() - t0 < 20  # two hangs of 60 s were cut short
    events = [{k: v for k, v in e.events.items() if k != "turns_cut"} for e in eps]
    assert events == [{"env_timeouts": 1}, {"env_timeouts": 1}, {"env_errors": 1}, {}]
    assert [e.turns for e in eps] == [0, 2, 1, 4] and eps[3].limit == "max_turns"
