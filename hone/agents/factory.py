"""The environment factory of an RL config's `agent:` section, checked before a run starts.

`agent.environment: package.module:Name` names an Environment class (or a function returning
one); `agent.tools: [package.module:function, ...]` builds a ToolEnvironment over those tools,
rewarded 1 when the final reply's last number matches the record's answer
(`rewards.answer_column`). Every mistake (a path that does not import, a class that is not an
Environment, a tool without type hints, an unknown parser, a code tool that cannot be confined
here and was not accepted unconfined) is an InputError naming the key, raised before anything of
the run is written; a run with the code tool logs once what its programs can see. Tool calls run
in the process's shared worker pool
(`hone.agents.tool_runner.default_runner`): no episode starts a process of its own.
"""

from __future__ import annotations

import functools

from hone.agents.environment import Environment, ToolEnvironment
from hone.agents.parsers import parser_from_name
from hone.agents.tools import tool_schema
from hone.errors import InputError
from hone.grading import is_correct
from hone.plugins import load_function


class AnswerReward:
    """1.0 when the episode's final reply answers the record's `column`, else 0.0."""

    def __init__(self, column: str):
        self.column = column

    def __call__(self, *, example: dict, reply: str, **_) -> float:
        answer = example.get(self.column)
        return float(answer is not None and is_correct(reply, answer))


def environment_factory(cfg, log=print):
    """A callable returning a fresh Environment for one episode (module docstring)."""
    a = cfg.agent
    if a.environment is not None:
        factory = load_function(a.environment, key="agent.environment")
        if isinstance(factory, type) and not issubclass(factory, Environment):
            raise InputError(f"{a.environment!r} does not subclass hone.agents.Environment",
                             key="agent.environment")
        try:
            probe = factory()
        except Exception as err:  # noqa: BLE001 - a factory that cannot build is a config error
            raise InputError(f"{a.environment!r} could not build an environment "
                             f"({type(err).__name__}: {err})", key="agent.environment") from err
        if not isinstance(probe, Environment):
            raise InputError(f"{a.environment!r} returned a {type(probe).__name__}, not a "
                             "hone.agents.Environment", key="agent.environment")
        log(f"agent: environment {a.environment}, up to {a.max_turns} turns")
        return factory
    tools = []
    for i, path in enumerate(a.tools):
        fn = load_function(path, key=f"agent.tools[{i}]")
        try:
            tool_schema(fn)
        except (TypeError, ValueError) as err:
            raise InputError(str(err), key=f"agent.tools[{i}]") from err
        tools.append(fn)
    if any(getattr(fn, "uses_code_sandbox", False) for fn in tools):
        from hone.agents.code_tool import UnconfinedError, confinement
        try:
            log(f"agent: {confinement(a.code_tool.unconfined)}")
        except UnconfinedError as err:
            raise InputError(str(err), key="agent.code_tool.unconfined") from err
    parser = parser_from_name(a.parser)
    log(f"agent: tools {', '.join(fn.__name__ for fn in tools)}, up to {a.max_turns} turns")
    return functools.partial(ToolEnvironment, tools, AnswerReward(cfg.rewards.answer_column),
                             system_prompt=a.system_prompt, max_turns=a.max_turns,
                             parser=parser, timeout_s=a.tool_timeout_s)
