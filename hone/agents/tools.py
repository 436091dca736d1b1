"""Tools for agents: a Python function's JSON schema, the text that describes tools to a model,
and `ToolRunner`, which runs tool calls in worker processes it can kill.

A tool is a plain module-level function with type hints and a Google-style docstring; the model
calls it with keyword arguments decoded from JSON. Design choices:

- `tool_schema` derives the OpenAI function schema from the hints and the docstring, so a tool is
  written once. A function without them is a TypeError naming it: the model would be calling a
  tool it cannot read about.
- `run_tool` turns every outcome into `(ok, text, event)`: never raises for a tool's fault. The
  result must be a string; int, float and bool results are written as JSON ("3", "2.5", "true")
  and count as fine; anything else (None, dict, list, ...) is an error, `tool_bad_results`.
- `ToolRunner` keeps a small pool of worker processes (started lazily, reused across calls and
  episodes) because Python cannot kill a thread: a tool that hangs past its timeout has its worker
  SIGKILLed and dropped, and the next call starts a fresh one, so nothing leaks per step.
  Workers come from the `forkserver` context: forking a process that runs JAX's threads is unsafe,
  and a fork server that has this module preloaded starts a worker in milliseconds (spawn would
  import hone and JAX again per worker). A call sends the function by reference (its module and
  name) and the JSON arguments through a pipe, well under a millisecond once the fork server runs;
  starting it (the first call of a process) costs about an import of hone. As with any spawn or
  forkserver multiprocessing, a script that uses workers needs `if __name__ == "__main__":`.
  Workers are killed on `close()`, on leaving a `with` block, and at interpreter exit.
- `InlineRunner` (`runner="inline"`) calls tools in-process: no isolation and no timeout, for
  trusted fast tools and tests.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import json
import math
import multiprocessing
import re
import signal
import threading
import types
import typing
import weakref
from typing import Any, Callable, Literal, Union

from hone.agents.tool_messages import tools_system_text as describe_tools  # noqa: F401 (re-export)

Result = tuple[bool, str, "str | None"]  # (ok, result or error text, event counter or None)

# ---- schemas ---------------------------------------------------------------------------------

_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean"}
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$")


def _type_schema(hint: Any, where: str) -> dict:
    """The JSON schema of a type hint: int, float, str, bool, list[...], dict, Literal, X | None."""
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if origin is Literal:
        kinds = {_SIMPLE.get(type(a)) for a in args}
        return {**({"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}),
                "enum": list(args)}
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _type_schema(next(a for a in args if a is not type(None)), where)
        if isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    raise TypeError(f"{where}: unsupported type hint {hint!r}; use int, float, str, bool, "
                    "list[...], dict, Literal[...] or X | None")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph as one line, {parameter: description} of a Google-style Args section)."""
    lines = doc.splitlines()
    first = []
    for line in lines:
        if not line.strip():
            break
        first.append(line.strip())
    described: dict[str, str] = {}
    in_args, current, indent = False, None, None
    for line in lines:
        header = _SECTION.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if header:
            in_args, current = header.group(1) in ("Args", "Arguments", "Parameters"), None
            continue
        if not in_args or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        entry = re.match(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if entry and (indent is None or width <= indent):
            indent, current = width, entry.group(1)
            described[current] = entry.group(2).strip()
        elif current is not None:  # a continuation line of the current parameter
            described[current] = (described[current] + " " + line.strip()).strip()
    return " ".join(first), described


def tool_schema(fn: Callable) -> dict:
    """The OpenAI function schema of `fn`: {"type": "function", "function": {"name",
    "description", "parameters"}} from its type hints and docstring. Parameters with a default are
    not required. Raises TypeError naming `fn` when it lacks hints, a docstring, or uses *args."""
    name = getattr(fn, "__name__", repr(fn))
    doc = inspect.getdoc(fn)
    if not doc:
        raise TypeError(f"tool {name!r} has no docstring: its first paragraph is the description "
                        "the model reads")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # a hint naming what the module does not define
        raise TypeError(f"tool {name!r}: cannot resolve its type hints ({err})") from err
    description, described = _docstring_parts(doc)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {name!r}: parameter {p.name!r} must be an ordinary keyword "
                            "parameter (no *args, **kwargs or positional-only)")
        if p.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} has no type hint")
        prop = _type_schema(hints[p.name], f"tool {name!r}, parameter {p.name!r}")
        if p.name in described:
            prop["description"] = described[p.name]
        properties[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


# ---- running one call ------------------------------------------------------------------------

def result_text(name: str, value: Any) -> Result:
    """A tool's return value as message text: strings as they are, numbers and bools as JSON."""
    if isinstance(value, str):
        return True, value, None
    if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return True, json.dumps(value), None
    return (False, f"error: tool {name!r} returned {type(value).__name__}, not text (a bug in "
            "the tool)", "tool_bad_results")


def run_tool(fn: Callable, arguments: dict) -> Result:
    """Call `fn(**arguments)` here; every failure becomes an error text and its event."""
    name = getattr(fn, "__name__", "tool")
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as err:
        return False, f"error: wrong arguments for {name!r}: {err}", "tool_errors"
    try:
        value = fn(**arguments)
    except (Exception, SystemExit) as err:  # SystemExit: a tool that calls sys.exit()
        return False, f"error: {type(err).__name__}: {err}", "tool_errors"
    return result_text(name, value)


class InlineRunner:
    """Runs tools in this process: no isolation, no timeout (trusted fast tools, tests)."""

    def check(self, fn: Callable) -> None:
        pass

    def call(self, fn: Callable, arguments: dict, timeout_s: float | None = None) -> Result:
        return run_tool(fn, arguments)

    def close(self) -> None:
        pass


# ---- worker processes ------------------------------------------------------------------------

def _worker_main(conn) -> None:
    """A worker's loop: receive (function, arguments), send back run_tool's result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; it closes us
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the trainer closed the pipe or died: nothing left to do
            return
        except Exception as err:  # the tool's module cannot be imported here
            conn.send((False, f"error: cannot load the tool in its worker: {err}", "tool_errors"))
            continue
        if request is None:
            return
        fn, arguments = request
        result = run_tool(fn, arguments)
        try:
            conn.send(result)
        except Exception as err:  # a result text that cannot be sent (it is a str: unlikely)
            conn.send((False, f"error: cannot send the result back: {err}", "tool_errors"))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                   name="hone-tool-worker")
        self.process.start()
        child.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: a hung tool may ignore anything milder
        self.process.join(5)
        self.conn.close()


_RUNNERS: weakref.WeakSet = weakref.WeakSet()
_PRELOAD = ["__main__", __name__]  # what the fork server imports once, before forking workers


class ToolRunner:
    """Runs tool calls in up to `max_workers` worker processes with a per-call timeout; a worker
    whose call times out (or dies) is killed and replaced by the next call. Thread-safe."""

    def __init__(self, max_workers: int = 2, context: str = "forkserver"):
        self.max_workers = max_workers
        self._context = context
        self._idle: list[_Worker] = []
        self._started = 0  # workers alive, idle or busy
        self._closed = False
        self._lock = threading.Condition()
        _RUNNERS.add(self)

    def check(self, fn: Callable) -> None:
        """TypeError unless `fn` can be sent to a worker: by reference, so it must be what its
        module's attribute of its qualified name is (a module-level function, not a lambda,
        closure or bound method of a local object)."""
        module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        try:
            found = functools.reduce(getattr, name.split("."), importlib.import_module(module))
        except Exception as err:  # noqa: BLE001 - anything that does not resolve
            found, why = None, f"{type(err).__name__}: {err}"
        else:
            why = "it is not its module's attribute of that name"
        if found is not fn or "<locals>" in name:
            raise TypeError(f"tool {getattr(fn, '__name__', fn)!r} cannot be sent to a worker "
                            f"process ({why}): define it at module level, or use "
                            "runner='inline'")

    def _take(self) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("ToolRunner is closed")
                if self._idle:
                    return self._idle.pop()
                if self._started < self.max_workers:
                    self._started += 1
                    break
                self._lock.wait()
        try:
            ctx = multiprocessing.get_context(self._context)
            if self._context == "forkserver":  # no effect once the fork server is running
                ctx.set_forkserver_preload(_PRELOAD)
            return _Worker(ctx)
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        """Give `worker` back to the pool, or (None) count a dropped one."""
        with self._lock:
            if worker is not None and not self._closed:
                self._idle.append(worker)
            else:
                self._started -= 1
                if worker is not None:
                    worker.kill()
            self._lock.notify()

    def call(self, fn: Callable, arguments: dict, timeout_s: float | None = 10.0) -> Result:
        """run_tool(fn, arguments) in a worker; a call past `timeout_s` seconds is stopped."""
        name = getattr(fn, "__name__", "tool")
        for attempt in range(2):  # a worker found dead before the call is replaced once
            worker = self._take()
            try:
                worker.conn.send((fn, arguments))
            except (BrokenPipeError, ConnectionError, EOFError, OSError):
                worker.kill()
                self._release(None)
                continue
            except Exception as err:  # the request cannot be pickled; the worker is fine
                self._release(worker)
                return False, f"error: cannot send the call to {name!r}: {err}", "tool_errors"
            try:
                if not worker.conn.poll(timeout_s):
                    worker.kill()
                    self._release(None)
                    return (False, f"error: tool {name!r} did not finish within {timeout_s:g} s "
                            "and was stopped", "tool_timeouts")
                result = worker.conn.recv()
            except (EOFError, OSError):  # it died during the call (os._exit, a crash, OOM)
                worker.kill()
                self._release(None)
                return (False, f"error: tool {name!r} crashed its worker process (exit code "
                        f"{worker.process.exitcode})", "tool_errors")
            except BaseException:  # interrupted while waiting: the worker's state is unknown
                worker.kill()
                self._release(None)
                raise
            self._release(worker)
            return result
        return False, f"error: no worker process could run {name!r}", "tool_errors"

    def pids(self) -> list[int]:
        """Process ids of the idle workers (tests: a timed-out worker is replaced)."""
        with self._lock:
            return [w.process.pid for w in self._idle]

    def close(self) -> None:
        """Kill every idle worker; busy ones are killed when their call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._started -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.kill()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@atexit.register
def _close_all() -> None:
    for runner in list(_RUNNERS):
        runner.close()


_DEFAULT: ToolRunner | None = None
_DEFAULT_LOCK = threading.Lock()


def default_runner() -> ToolRunner:
    """The process-wide runner environments share unless given one (workers outlive episodes)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT._closed:
            _DEFAULT = ToolRunner()
        return _DEFAULT


def make_runner(runner) -> ToolRunner | InlineRunner:
    """None -> the shared default runner; "inline" -> an InlineRunner; else `runner` itself."""
    if runner is None:
        return default_runner()
    if runner == "inline":
        return InlineRunner()
    if isinstance(runner, str):
        raise ValueError(f"runner must be None, 'inline' or a runner object, got {runner!r}")
    return runner
