"""`hone grpo` and `hone ppo` with an `agent:` section on the tiny preset: the episodes train
(metrics of turns, environment tokens and limits; the sampler's log-probabilities are the
trainer's), PPO's per-turn rewards and discounts reach GAE over the model's tokens only, and
config mistakes are exit-code-2 errors naming the key before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hone.config import GRPOConfig, PPOConfig, load_config
from hone.errors import InputError
from hone.losses.rl import gae, gae_over_mask
from hone.recipes.grpo import run_grpo
from hone.recipes.ppo import run_ppo

ROOT = Path(__file__).resolve().parents[2]
GAME = ["data.path=builtin:guess-number", "data.eval_path=builtin:guess-number-eval",
        "agent.environment=hone.agents.tasks:GuessNumber", "agent.max_turns=3",
        "agent.max_episode_tokens=416", "agent.max_env_tokens=64"]


def rows(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_gae_over_mask_skips_the_environments_tokens():
    # Two turns [model, model, env, env, model] and padding; the second turn's reward must
    # reach the first turn's tokens through the per-turn discount.
    mask = np.array([[1, 1, 0, 0, 1, 0]], np.float32)
    rewards = np.array([[0.0, 0.5, 9.0, 9.0, 1.0, 9.0]], np.float32)
    values = np.array([[0.1, 0.2, 7.0, 7.0, 0.3, 7.0]], np.float32)
    discount = np.array([[0.9, 0.9 * 0.5, 0.9, 0.9, 0.9, 0.9]], np.float32)
    adv, ret = gae_over_mask(rewards, values, mask, gamma=discount, lam=0.8)
    # By hand over the model tokens only (r 0, .5, 1; V .1, .2, .3; gammas .9, .45):
    d2 = 1.0 - 0.3
    d1 = 0.5 + 0.45 * 0.3 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.1
    a2, a1 = d2, d1 + 0.45 * 0.8 * d2
    a0 = d0 + 0.9 * 0.8 * a1
    np.testing.assert_allclose(np.asarray(adv)[0], [a0, a1, 0, 0, a2, 0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[0], [a0 + .1, a1 + .2, 0, 0, a2 + .3, 0],
                               atol=1e-6)
    # With nothing between the model tokens it is plain GAE.
    full = np.ones((1, 4), np.float32)
    a, _ = gae_over_mask(rewards[:, :4], values[:, :4], full, gamma=np.full((1, 4), .9), lam=.8)
    b, _ = gae(jnp.asarray(rewards[:, :4]), jnp.asarray(values[:, :4]), full, gamma=.9, lam=.8)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_agentic_ppo_trains_on_episodes_with_per_turn_rewards(tmp_path):
    cfg = load_config(PPOConfig, str(ROOT / "configs/tiny/ppo.yaml"), [
        f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=2", "train.eval_every=2",
        "ppo.max_prompt_tokens=224", "ppo.max_new_tokens=12", "ppo.eval_prompts=2",
        "ppo.top_k=64", "agent.gamma=0.9", *GAME])
    lines = []
    run_ppo(cfg, log=lines.append)
    assert any("episodes of up to 3 turns" in l for l in lines)
    start, *m = rows(tmp_path)
    assert start["step"] == 0 and "eval_turns" in start
    last = m[-1]
    assert 1 <= last["agent/turns_mean"] <= 3 and last["agent/env_tokens_mean"] > 0
    assert last["agent/cut_fraction"] + last["agent/done_fraction"] == pytest.approx(1.0)
    assert "agent/bad_replies" in last and np.isfinite(last["loss"])


@pytest.mark.parametrize("overrides,key", [
    (["agent.environment=hone.agents.nowhere:Env"], "agent.environment"),
    (["agent.environment=hone.agents.calculator:calculator"], "agent.environment"),
    (["agent.environment=hone.agents.tasks:GuessNumber", "agent.tools=[x:y]"], "agent.tools"),
    (["agent.environment=null", "agent.tools=[hone.datasets.arithmetic:nothing]"],
     "agent.tools[0]"),
    (["agent.environment=null", "agent.tools=[hone.agents.calculator:calculator]",
      "agent.parser=nope"], "agent.parser"),
    (["agent.environment=hone.agents.tasks:GuessNumber", "agent.max_episode_tokens=200"],
     "agent.max_episode_tokens"),
    (["agent.environment=hone.agents.tasks:GuessNumber",
      "agent.template_args=[enable_thinking=false,oops]"], "agent.template_args[1]"),
    (["agent.environment=null", "agent.endpoint=python3 env.py",
      "grpo.dynamic_sampling_rounds=2"], "grpo.dynamic_sampling_rounds"),
])
def test_config_mistakes_name_the_key_before_anything_is_written(tmp_path, overrides, key):
    from hone.agents.factory import environment_factory
    run_dir = tmp_path / "run"
    args = [f"run_dir={run_dir}", "grpo.max_prompt_tokens=224", *overrides]
    with pytest.raises(InputError) as err:
        cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/agent_grpo.yaml"), args)
        environment_factory(cfg, log=lambda s: None)
    assert err.value.key == key
    assert not run_dir.exists()


def test_template_args_are_the_chat_templates_keywords():
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/agent_grpo.yaml"), [
        "agent.template_args=[enable_thinking=false,depth=3,name=x y]"])
    assert cfg.agent.template_kwargs() == {"enable_thinking": False, "depth": 3, "name": "x y"}


def test_the_cli_exits_with_code_2_on_an_environment_that_is_not_one(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hone.cli", "grpo", "--config",
                          str(ROOT / "configs/tiny/agent_grpo.yaml"), f"run_dir={tmp_path / 'r'}",
                          "agent.environment=hone.agents.calculator:calculator"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "agent.environment" in out.stderr
    assert not (tmp_path / "r").exists()


TIMING = ("rollout_s", "update_s", "tokens_per_s", "step_s", "rollout_wait_s", "overlap_s")


def scripted_run(run_dir, at, *overrides):
    """configs/tiny/agent_grpo.yaml with tests/agents/scripted.py's StopsOnReset, which sends
    SIGTERM on reset call `at` (None: never): (run_grpo's result, resets played)."""
    from scripted import StopsOnReset
    StopsOnReset.AT.update(at=at, calls=0)
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/agent_grpo.yaml"), [
        f"run_dir={run_dir}", "log.sinks=[jsonl]", "data.eval_path=null",
        "checkpoint.every_steps=100", "agent.environment=scripted:StopsOnReset", *overrides])
    return run_grpo(cfg, log=lambda s: None), StopsOnReset.AT["calls"]


def assert_same_run(a, b, params_a, params_b):
    """Two runs' metrics (timing aside) and final weights, equal bit for bit."""
    clean = lambda d: [{k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
                       for r in rows(d)]
    assert clean(a) == clean(b)
    for k in params_a:
        assert np.array_equal(np.asarray(params_a[k]), np.asarray(params_b[k]))


def test_partial_episodes_resume_exactly_with_a_rollout_in_flight(tmp_path):
    """max_staleness 1 with agent.switch_turn 1: each rollout's first turns use the version
    before, its later turns wait for the update beside it; a SIGTERM during step 2's rollout
    (on its thread) resumes to the numbers of a run never stopped."""
    from hone.train.loop import Interrupted
    lagged = ("train.max_steps=4", "grpo.max_staleness=1", "agent.switch_turn=1")
    (_, straight, _), _ = scripted_run(tmp_path / "straight", None, *lagged)
    with pytest.raises(Interrupted):  # 8 episodes a rollout: the 3rd reset of rollout 2's
        scripted_run(tmp_path / "stopped", 2 * 8 + 3, *lagged)
    # Rollout 2 (0-based) starts beside update 1: the run stops after it, saved at step 2,
    # and the rollout in flight (waiting for version 2) is dropped and sampled again.
    assert sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()) == ["2"]
    (_, resumed, _), _ = scripted_run(tmp_path / "stopped", None, *lagged)
    assert_same_run(tmp_path / "stopped", tmp_path / "straight", straight["params"],
                    resumed["params"])
    m = rows(tmp_path / "straight")
    assert any(r["partial_fraction"] > 0 for r in m[1:])  # episodes that spanned two versions
    assert all(0.0 <= r["policy_lag"] <= 1.0 for r in m)
    assert any(0.0 < r["policy_lag"] < 1.0 for r in m)  # mixed: a version and the next


def test_dynamic_sampling_refills_episode_groups_and_resumes_exactly(tmp_path):
    """grpo.dynamic_sampling_rounds with an agent: groups whose rewards are all equal are
    replaced by groups of further records, each round played with its own seed; the refills
    move the prompt iterator, whose position the checkpoint keeps, so a SIGTERM in the middle
    of a later step's refills resumes to the numbers of a run never stopped."""
    from hone.train.loop import Interrupted
    refills = ("train.max_steps=3", "train.batch_size=4", "grpo.dynamic_sampling_rounds=3")
    (_, straight, _), resets = scripted_run(tmp_path / "straight", None, *refills)
    m = rows(tmp_path / "straight")
    assert all(0 <= r["refill_rounds"] <= 3 for r in m) and any(r["refill_rounds"] for r in m)
    per_step = [4 * (1 + r["refill_rounds"]) for r in m]  # one record's 4 episodes a round
    assert resets == sum(per_step)
    with pytest.raises(Interrupted):  # inside step 2's last round
        scripted_run(tmp_path / "stopped", sum(per_step[:2]) - 3, *refills)
    (_, resumed, _), _ = scripted_run(tmp_path / "stopped", None, *refills)
    assert_same_run(tmp_path / "stopped", tmp_path / "straight", straight["params"],
                    resumed["params"])


def test_an_environment_in_an_outside_process_drives_the_policy_over_http_and_it_learns(tmp_path):
    """agent.endpoint: tests/agents/endpoint_env.py plays two-turn episodes through the openai
    client against hone serve; the trainer's rows are the server's ids; shorter replies earn
    more and the policy learns to write them."""
    pytest.importorskip("openai")
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/grpo.yaml"), [
        f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=6", "train.eval_every=6",
        "train.lr=6e-3",
        f"agent.endpoint={sys.executable} {ROOT / 'tests/agents/endpoint_env.py'}",
        "agent.max_episode_tokens=400", "grpo.max_prompt_tokens=144", "grpo.beta=0.0",
        "rewards.length=0.0", "rewards.answer_match=0.0", "grpo.eval_prompts=4"])
    lines = []
    run_grpo(cfg, log=lines.append)
    assert any("played by" in l for l in lines)
    start, *m = rows(tmp_path)
    first, last = m[0], m[-1]
    assert first["agent/turns_mean"] == 2.0 and first["agent/env_tokens_mean"] > 0
    assert max(r["sampler_gap"] for r in m) < 1e-5  # the server's log-probs are the trainer's
    assert first["completion_len_mean"] > 24  # two turns near the 16-token limit
    # The greedy policy played by the program: from replies at the limit to short ones.
    assert start["eval_reward"] < 0.2 and last["eval_reward"] > 0.6
    assert last["completion_len_mean"] < first["completion_len_mean"]
    assert "agent/missing_rewards" not in last


def test_partial_episodes_played_by_an_outside_process(tmp_path):
    """agent.endpoint with a lag and agent.switch_turn 1: the program's second turns are served
    by the next version's weights (a second engine in the server), which the episodes record."""
    pytest.importorskip("openai")
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/grpo.yaml"), [
        f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=2", "train.lr=6e-3",
        f"agent.endpoint={sys.executable} {ROOT / 'tests/agents/endpoint_env.py'}",
        "agent.max_episode_tokens=400", "grpo.max_prompt_tokens=144", "grpo.beta=0.0",
        "rewards.length=0.0", "rewards.answer_match=0.0", "data.eval_path=null",
        "grpo.max_staleness=1", "agent.switch_turn=1"])
    run_grpo(cfg, log=lambda s: None)
    m = rows(tmp_path)
    assert [r["agent/turns_mean"] for r in m] == [2.0] * 2
    # Step 1 samples both turns with version 0; later steps' second turns the next version.
    assert m[0]["partial_fraction"] == 0.0 and m[0]["policy_lag"] == 0.0
    assert all(r["partial_fraction"] == 1.0 and 0.0 < r["policy_lag"] < 1.0 for r in m[1:])
