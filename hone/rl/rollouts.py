"""One rollout protocol for every RL recipe: single-turn completions and agent episodes alike.

A recipe asks `rollout_scorer` for what scores its rollouts (before it writes the run directory,
so a bad reward spec or environment never leaves a half-made run), then `make_rollouts` for the
object that turns the policy's current weights into training rows. Both kinds answer:

    describe()                    one line for the log: the row layout and, for episodes, turns
    policy(params)                the policy module over those weights (no copy)
    collect(state, batch, step, later=None)
                                  (rows, total reward [B], samples or episodes, host metrics);
                                  later: the next policy version partial episodes go on with
                                  (hone.train.lagged.NextVersion; a single turn never does)
    evaluator(held_out)           params -> held-out metrics (greedy), or None
    partial                       whether its episodes go on with the next policy version
                                  from a turn on (agent.switch_turn; the lag passes `later`)

`Rollouts` (hone/rl/collect.py) samples G completions per prompt; `AgentRollouts`
(hone/rl/episode_collect.py) plays G episodes per record on the same paged engine, each model
turn answered by the environment; `EndpointRollouts` (hone/rl/endpoint_collect.py) has an
outside program play them through hone serve, on the same engine. Rows of each have the layout
the losses read; an episode's rows also carry per-turn rewards and discounts when the run asks
for them (PPO's `turn_gamma`), so no recipe branches on which kind it has.
"""

from __future__ import annotations

from hone.rl.collect import Rollouts
from hone.rl.episode_collect import AgentRollouts


def rollout_scorer(cfg, section, prompts, log=print):
    """What rewards this run's rollouts: the agent's environment factory (episodes are rewarded
    by their environment) or the reward functions of the section; checked now, before the run
    directory is written."""
    if cfg.agent.endpoint is not None:
        from hone.rl.endpoint_collect import endpoint_command
        return endpoint_command(cfg, log)
    if cfg.agent.enabled:
        from hone.agents.factory import environment_factory
        return environment_factory(cfg, log)
    from hone.rl.reward_specs import make_rewards
    return make_rewards(cfg, section, prompts, log)


def make_rollouts(cfg, section, graphdef, template, frozen, tokenizer, prompts, data_iter,
                  scorer, *, tree: bool = False, turn_gamma: float | None = None):
    """The run's rollouts: episodes when `agent.enabled`, single-turn completions otherwise.
    tree: single-turn rows one per prompt group (`tree_layout`; episodes are never tree rows).
    turn_gamma: episodes' rows carry `turn_rewards` and `turn_discount` (PPO's discount within
    a turn; `agent.gamma` between turns)."""
    if cfg.agent.endpoint is not None:
        from hone.rl.endpoint_collect import EndpointRollouts
        return EndpointRollouts(cfg, section, graphdef, template, frozen, tokenizer, prompts,
                                scorer, turn_gamma=turn_gamma)
    if cfg.agent.enabled:
        return AgentRollouts(cfg, section, graphdef, template, frozen, tokenizer, prompts,
                             scorer, turn_gamma=turn_gamma, data_iter=data_iter)
    return Rollouts(cfg, section, graphdef, template, frozen, tokenizer, prompts, data_iter,
                    scorer, tree=tree)
