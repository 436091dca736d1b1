"""Where tool calls run: `ToolRunner`, a pool of worker processes it can kill, and
`InlineRunner`, this process. Design choices:

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
- A call's timeout covers the tool's run only: before a worker's first call of a module, the
  worker imports that module under its own, longer limit (`load_timeout_s`, default 120 s). A
  tool module with heavy imports (numpy, a model) would otherwise time out on every fresh
  worker, and each timeout starts another fresh worker.
- `InlineRunner` (`runner="inline"`) calls tools in-process: no isolation and no timeout, for
  trusted fast tools and tests.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import multiprocessing
import signal
import threading
import weakref
from typing import Callable

from hone.agents.tools import Result, run_tool


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
    """A worker's loop: receive (function, arguments), send back run_tool's result; or receive
    a module's name (a str), import it and send back None or the error's text."""
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
        if isinstance(request, str):
            try:
                importlib.import_module(request)
            except BaseException as err:  # noqa: BLE001 - reported to the caller, who decides
                conn.send(f"{type(err).__name__}: {err}")
            else:
                conn.send(None)
            continue
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
        self.loaded: set[str] = set()  # modules imported in this worker (before any timer)

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

    def __init__(self, max_workers: int = 2, context: str = "forkserver",
                 load_timeout_s: float = 120.0):
        self.max_workers = max_workers
        self.load_timeout_s = load_timeout_s
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
            module = getattr(fn, "__module__", None)
            if isinstance(module, str) and module not in worker.loaded:
                loaded = self._load(worker, module, name)
                if loaded is None:
                    continue
                if loaded is not True:
                    return loaded
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

    def _load(self, worker: _Worker, module: str, name: str) -> Result | bool | None:
        """Import `module` in `worker` within load_timeout_s: True when done; None when the
        worker was found dead (dropped: the caller takes another); else the error Result."""
        try:
            worker.conn.send(module)
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            worker.kill()
            self._release(None)
            return None
        try:
            if not worker.conn.poll(self.load_timeout_s):
                worker.kill()
                self._release(None)
                return (False, f"error: the worker could not import {name!r}'s module "
                        f"{module!r} within {self.load_timeout_s:g} s", "tool_timeouts")
            error = worker.conn.recv()
        except (EOFError, OSError):
            worker.kill()
            self._release(None)
            return (False, f"error: importing {module!r} crashed the worker of {name!r} (exit "
                    f"code {worker.process.exitcode})", "tool_errors")
        except BaseException:
            worker.kill()
            self._release(None)
            raise
        if error is not None:
            self._release(worker)
            return False, f"error: cannot load the tool in its worker: {error}", "tool_errors"
        worker.loaded.add(module)
        return True

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
