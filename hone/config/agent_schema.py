"""The `agent:` section of `hone grpo` and `hone ppo` (multi-turn episodes with tools, an
environment or an endpoint process; hone/agents/), and its code tool's confinement. The checks
that need the rest of the config are RLConfig's (hone/config/rl_schema.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from hone.errors import InputError


@dataclass(frozen=True)
class CodeToolSection:
    # Run the code tool (hone.agents.code_tool:run_python) unconfined where its sandbox cannot
    # be built (no user namespaces): the model's code can then read every file this user can.
    # false = such a run refuses to start; where the sandbox works this changes nothing.
    unconfined: bool = False


@dataclass(frozen=True)
class AgentSection:
    # The environment class or factory "package.module:Name" (a hone.agents.Environment);
    # None with no tools = single-turn RL (no agent).
    environment: str | None = None
    # Tool functions "package.module:function" for a hone.agents.ToolEnvironment, rewarded by
    # matching the final reply with the record's answer (rewards.answer_column); used when
    # environment is None.
    tools: tuple[str, ...] = ()
    # System prompt of the tool environment; None = none beyond the tools' description.
    system_prompt: str | None = None
    # Model turns per episode at most.
    max_turns: int = field(default=4, metadata={"min": 1})
    # Tokens of a whole episode at most (the opening, every turn, every environment message):
    # the training row's length. grpo/ppo.max_new_tokens bounds one model turn and
    # max_prompt_tokens the opening.
    max_episode_tokens: int = field(default=1024, metadata={"min": 2})
    # Keyword arguments of the chat template, "name=value" (the value read as YAML: true,
    # 3, text), given to every rendering of an episode, e.g. enable_thinking=false for Qwen3.
    template_args: tuple[str, ...] = ()
    # Tokens of one tool result at most: a longer one is cut and marked.
    max_tool_tokens: int = field(default=256, metadata={"min": 1})
    # Tokens one environment turn may add (template tokens included); None = max_tool_tokens
    # + 64. A longer turn ends the episode (counted).
    max_env_tokens: int | None = field(default=None, metadata={"min": 1})
    # The tool-call parser: hermes (<tool_call>{"name": ..., "arguments": ...}</tool_call>),
    # llama3 (the reply a JSON object {"name": ..., "parameters": ...}, Llama 3.1-3.3's
    # templates) or "package.module:Name".
    parser: str = "hermes"
    # Seconds one tool call may run before its worker process is killed.
    tool_timeout_s: float = field(default=10.0, metadata={"gt": 0.0})
    # Seconds an environment's reset or step may take; a slower one ends its episode with the
    # fallback reward (counted as env_timeouts).
    env_timeout_s: float = field(default=60.0, metadata={"gt": 0.0})
    # Discount of later turns' rewards (PPO/GAE with per-turn rewards); 1 = none.
    gamma: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    # Partial episodes (with grpo/ppo.max_staleness > 0): an episode's model turns from this
    # one on (0-based) are sampled with the next policy version, the one the update running
    # beside the rollout produces; the episode goes on under the new weights (its history
    # prefilled again) and each token records the version that sampled it and its log-prob.
    # None = every turn of a rollout with one version.
    switch_turn: int | None = field(default=None, metadata={"min": 1})

    # An environment that runs as an outside process and drives the policy through an
    # OpenAI-compatible endpoint (hone serve): the command (split like a shell's) is run once
    # per rollout with HONE_BASE_URL and HONE_MODEL set, reads one JSON task a line on stdin
    # ({"episode", "example", "seed"}) and writes {"episode", "reward"} lines to stdout; the
    # episodes' tokens are the server's, exactly as sampled. See docs/guides/agents.md.
    endpoint: str | None = None
    # Seconds one rollout's endpoint process may run before it is killed.
    endpoint_timeout_s: float = field(default=600.0, metadata={"gt": 0.0})
    # The Python code tool's confinement (docs/guides/agents.md, "The code tool").
    code_tool: CodeToolSection = field(default_factory=CodeToolSection)

    @property
    def enabled(self) -> bool:
        return self.environment is not None or bool(self.tools) or self.endpoint is not None

    def template_kwargs(self) -> dict:
        """template_args as keyword arguments; a malformed one is an InputError naming it."""
        out = {}
        for k, item in enumerate(self.template_args):
            name, eq, value = str(item).partition("=")
            if not eq or not name.strip().isidentifier():
                raise InputError(f"expected name=value (a chat template's keyword), got "
                                 f"{item!r}", key=f"agent.template_args[{k}]")
            out[name.strip()] = yaml.safe_load(value) if value.strip() else ""
        return out
