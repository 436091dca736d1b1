"""Multi-turn agents: environments, tools, tool-call parsers and the bundled tasks.

The environment side lives here: `Environment`/`Step` (environment.py), tools and the worker
processes that run them (tools.py), tool messages in chat records (tool_messages.py), tool-call
parsing (parsers.py), the calculator tool (calculator.py) and bundled environments (tasks.py).
The sampler side: multi-turn episodes with the KV cache carried between turns (rollout.py,
render.py), episodes as training rows (episode_rows.py) and the config's environment
(factory.py). The RL step's host side is hone/rl/episode_collect.py.
"""

from hone.agents.calculator import calculator
from hone.agents.environment import Environment, Step, ToolEnvironment
from hone.agents.parsers import HermesParser, ToolCall
from hone.agents.episode import Episode, Switch
from hone.agents.rollout import rollout
from hone.agents.tasks import ArithmeticTool, GuessNumber
from hone.agents.tools import tool_schema

__all__ = ["ArithmeticTool", "Environment", "Episode", "GuessNumber", "HermesParser", "Step",
           "Switch", "ToolCall", "ToolEnvironment", "calculator", "rollout", "tool_schema"]
