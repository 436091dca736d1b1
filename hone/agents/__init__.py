"""Multi-turn agents: environments, tools, tool-call parsers and the bundled tasks (issue 26).

The environment side lives here: `Environment`/`Step` (environment.py), tools and the worker
processes that run them (tools.py), tool-call parsing (parsers.py), the calculator tool
(calculator.py) and bundled environments (tasks.py).
"""

from hone.agents.calculator import calculator
from hone.agents.environment import Environment, Step, ToolEnvironment
from hone.agents.parsers import HermesParser, ToolCall
from hone.agents.tasks import ArithmeticTool, GuessNumber
from hone.agents.tools import tool_schema

# rollout: hone.agents.rollout (the multi-turn sampler)

__all__ = ["ArithmeticTool", "Environment", "GuessNumber", "HermesParser", "Step", "ToolCall",
           "ToolEnvironment", "calculator", "tool_schema"]
