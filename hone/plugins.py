"""Loading a user's code by name: "package.module:function" in a config -> the callable.

Reward functions, tool functions, environments and tool-call parsers are all named this way in
configs (`rewards.functions`, `agent.tools`, `agent.environment`, `agent.parser`). One loader
gives one error for each way a name can be wrong (the module does not import, has no such
attribute, or names something that cannot be called), always naming the config key, so a typo
fails before training starts.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

from hone.errors import InputError


def load_function(path: str, key: str = "name") -> Callable[..., Any]:
    """The callable named by "package.module:function" (attribute paths like "mod:Cls.fn" too)."""
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever the module raised while importing
        raise InputError(f"cannot import module {module_name!r} of {path!r} "
                         f"({type(err).__name__}: {err})", key=key) from err
    try:
        obj = functools.reduce(getattr, attr.split("."), obj)
    except AttributeError as err:
        raise InputError(f"module {module_name!r} has no {attr!r}", key=key) from err
    if not callable(obj):
        raise InputError(f"{path!r} is a {type(obj).__name__}, not a function", key=key)
    return obj
