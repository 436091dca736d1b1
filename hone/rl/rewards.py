"""Reward functions for RL, and `Rewards`: their weighted sum, protected against their failures.

A reward function has TRL's shape, `fn(prompts, completions, **columns) -> list[float]`, called
with keywords (so TRL's `def f(completions, **kwargs)` works): lists of N strings, the dataset's
other fields as aligned lists, and always `completion_tokens` (each completion's token count).
Built-ins: `answer_match`, `format_match`, `length_penalty`, `overlong_penalty`, `reward_model`;
others by import path, "package.module:function". `build_rewards` turns config specs (see its
docstring) into a `Rewards`. Design choices:

- The trainer never crashes because of a reward function. Each call runs in a daemon thread
  joined with a timeout; Python cannot kill a thread, so a hung one is abandoned (it runs on,
  holding what it holds; one that hangs every step leaks a thread per step). A raise, a timeout
  or a result that is not N values gives the call's every sample the spec's `fallback`; a value
  that is not a finite number gives that sample alone the fallback. Each case is counted in
  `RewardResult.events` and reported through `log`.
- A value of None means "does not apply to this sample" (TRL's convention) and counts as 0.
- Misconfiguration fails before training: spec errors are `InputError`s naming `rewards[i].key`,
  and `Rewards.check_columns` names a built-in's column the dataset lacks.
- Each function gets its own copies of the input lists, so one cannot corrupt the next one's.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hone.errors import InputError
from hone.grading import is_correct
from hone.plugins import load_function

RewardFn = Callable[..., Sequence[Any]]
EVENTS = ("reward_errors", "reward_timeouts", "reward_invalid")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _named(fn, name: str, columns: tuple[str, ...] = ()):
    fn.name, fn.columns = name, columns  # `columns`: dataset fields it reads (check_columns)
    return fn


def _number(value, key: str, *, integer: bool = False, least: float | None = None) -> float:
    """`value` if it is a finite number (an int when `integer`) >= least, else an InputError."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        raise InputError(f"must be {'an integer' if integer else 'a number'}, got {value!r}",
                         key=key)
    if least is not None and value < least:
        raise InputError(f"must be >= {least}, got {value!r}", key=key)
    return value


# ---- built-ins ------------------------------------------------------------------------------

def answer_match(column: str = "answer", correct: float = 1.0, wrong: float = 0.0) -> RewardFn:
    """`correct` where `is_correct(completion, answer)` (the last "The answer is N", else the last
    number, equals the `column` field as a number), else `wrong`."""
    correct, wrong = _number(correct, "correct"), _number(wrong, "wrong")

    def fn(prompts, completions, **columns):
        answers = columns[column]
        return [correct if is_correct(c, a) else wrong for c, a in zip(completions, answers)]
    return _named(fn, "answer_match", (column,))


def format_match(pattern: str, score: float = 1.0) -> RewardFn:
    """`score` where `re.search(pattern, completion, re.DOTALL)` finds a match, else 0. Search,
    not fullmatch: anchor with ^...$ to ask for the whole completion; DOTALL lets `.` cross lines
    (a reasoning block spans several)."""
    try:
        regex = re.compile(pattern, re.DOTALL)
    except (re.error, TypeError) as err:
        raise InputError(f"not a valid regular expression: {err}", key="pattern") from err
    score = _number(score, "score")

    def fn(prompts, completions, **columns):
        return [score if regex.search(c) else 0.0 for c in completions]
    return _named(fn, "format")


def length_penalty(target_tokens: int, per_token: float = -0.001) -> RewardFn:
    """per_token * max(0, completion_tokens - target_tokens): negative per_token penalises every
    token past the target."""
    target = _number(target_tokens, "target_tokens", integer=True, least=0)
    per_token = _number(per_token, "per_token")

    def fn(prompts, completions, completion_tokens, **columns):
        return [per_token * max(0, n - target) for n in completion_tokens]
    return _named(fn, "length")


def overlong_penalty(max_tokens: int, cache_tokens: int) -> RewardFn:
    """DAPO's soft overlong punishment of a completion of L tokens: 0 up to max_tokens -
    cache_tokens, then falling linearly to -1 at max_tokens, and -1 beyond."""
    top = _number(max_tokens, "max_tokens", integer=True, least=1)
    cache = _number(cache_tokens, "cache_tokens", integer=True, least=1)
    if cache > top:
        raise InputError(f"must be <= max_tokens ({top}), got {cache}", key="cache_tokens")
    free = top - cache

    def fn(prompts, completions, completion_tokens, **columns):
        return [0.0 if n <= free else (free - n) / cache if n <= top else -1.0
                for n in completion_tokens]
    return _named(fn, "overlong")


def reward_model(path: str, tokenizer=None, batch_size: int = 16, max_length: int | None = None,
                 dtype: str = "float32") -> RewardFn:
    """The scalar reward of a folder written by `hone reward`/`hone export` (or transformers) for
    the text prompt + completion; see `hone.rl.reward_model_scorer`."""
    from hone.rl.reward_model_scorer import RewardModelScorer
    return RewardModelScorer(path, tokenizer, batch_size, max_length, dtype)


BUILTINS: dict[str, Callable[..., RewardFn]] = {
    "answer_match": answer_match, "format": format_match, "length": length_penalty,
    "overlong": overlong_penalty, "reward_model": reward_model}
_COMMON = ("name", "weight", "timeout_s", "fallback")  # keys every spec may carry


# ---- specs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RewardEntry:
    fn: RewardFn
    name: str  # unique among the entries: the key of per_function and of the events
    weight: float = 1.0
    timeout_s: float | None = 30.0  # None = wait as long as it takes
    fallback: float = 0.0  # the value of a sample whose reward failed
    where: str = "rewards"  # the spec's config key, for error messages


def _timeout(value, key: str) -> float | None:
    if value is not None and _number(value, key) <= 0:
        raise InputError(f"must be > 0 (seconds) or null (no limit), got {value!r}", key=key)
    return value


def _rekey(err: InputError, where: str) -> InputError:
    """The same message with its key moved under `where` (rewards[i].key)."""
    prefix = "".join(f"{p}: " for p in (err.path, err.key and f"'{err.key}'") if p)
    message = str(err).removeprefix(prefix)
    return InputError(message, path=err.path, key=f"{where}.{err.key}" if err.key else where)


def _make(name: str, kwargs: dict, where: str) -> RewardFn:
    if name in BUILTINS:
        factory = BUILTINS[name]
        params = inspect.signature(factory).parameters
        for k in (k for k in kwargs if k not in params):
            raise InputError(f"unknown key for reward {name!r}; it takes "
                             f"{', '.join([*params, *_COMMON[1:]])}", key=f"{where}.{k}")
        for k in (k for k, p in params.items() if p.default is p.empty and k not in kwargs):
            raise InputError(f"reward {name!r} needs this key", key=f"{where}.{k}")
        try:
            return factory(**kwargs)
        except InputError as err:
            raise _rekey(err, where) from err
    if ":" not in name:
        raise InputError(f"unknown reward {name!r}; built-ins: {', '.join(BUILTINS)}, or a "
                         "function 'package.module:function'", key=f"{where}.name")
    if kwargs:
        raise InputError(f"unknown key; a function reward takes {', '.join(_COMMON)}",
                         key=f"{where}.{next(iter(kwargs))}")
    return load_function(name, key=f"{where}.name")


def build_rewards(specs: Sequence[Mapping | RewardFn], *, key: str = "rewards",
                  timeout_s: float | None = 30.0, fallback: float = 0.0,
                  log: Callable[[str], Any] = print) -> Rewards:
    """`Rewards` from specs, each a dict {"name": ..., "weight": 1.0, "timeout_s": ...,
    "fallback": ..., **the built-in's arguments} or a plain callable (weight 1). name is a
    built-in (answer_match, format, length, overlong, reward_model) or "package.module:function".
    `timeout_s` and `fallback` are the defaults of the specs that set none (a reward model's
    default timeout is its own, 600 s: its first calls compile). Names repeat as name_2, ..."""
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Sequence) or not specs:
        raise InputError("must be a non-empty list of reward specs", key=key)
    _timeout(timeout_s, "timeout_s")
    _number(fallback, "fallback")
    entries, seen = [], set()
    for i, spec in enumerate(specs):
        where = f"{key}[{i}]"
        if callable(spec) and not isinstance(spec, Mapping):
            spec = {"name": spec}
        if not isinstance(spec, Mapping):
            raise InputError("must be a mapping with a 'name'", key=where)
        name = spec.get("name")
        if callable(name):
            fn, name = name, getattr(name, "name", getattr(name, "__name__", "reward"))
        elif isinstance(name, str) and name:
            fn = _make(name, {k: v for k, v in spec.items() if k not in _COMMON}, where)
        else:
            raise InputError(f"must be a reward name, got {name!r}", key=f"{where}.name")
        limit = _timeout(spec.get("timeout_s", getattr(fn, "timeout_s", timeout_s)),
                         f"{where}.timeout_s")
        unique = name if name not in seen else next(
            f"{name}_{k}" for k in itertools.count(2) if f"{name}_{k}" not in seen)
        seen.add(unique)
        entries.append(RewardEntry(
            fn, unique, _number(spec.get("weight", 1.0), f"{where}.weight"), limit,
            _number(spec.get("fallback", fallback), f"{where}.fallback"), where))
    return Rewards(tuple(entries), log)


# ---- calling --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RewardResult:
    total: np.ndarray  # float32 [N]: sum over functions of weight * value
    per_function: dict[str, np.ndarray]  # name -> float32 [N], unweighted (fallbacks included)
    # Counts: reward_errors (calls that raised or returned other than N values), reward_timeouts
    # (calls), reward_invalid (samples whose value was not a finite number); each also per
    # function as "reward_errors/<name>". Every key is present, zeros included.
    events: dict[str, int]


def _run(fn: RewardFn, kwargs: dict, timeout_s: float | None) -> tuple[str, Any]:
    """("ok", result) | ("error", exception) | ("timeout", None)."""
    box: dict[str, tuple[str, Any]] = {}

    def target():
        try:
            box["out"] = ("ok", fn(**kwargs))
        except BaseException as err:  # anything at all: reported, never raised in the trainer
            box["out"] = ("error", err)
    thread = threading.Thread(target=target, daemon=True, name="hone-reward")
    thread.start()
    thread.join(timeout_s)
    return box.get("out", ("timeout", None))  # still running: abandoned (see module docstring)


def _values(result, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(values float32 [N], bad [N] bool: not a finite float32); ValueError unless N values."""
    if isinstance(result, (list, tuple)):
        items = list(result)
    elif hasattr(result, "__array__") and not isinstance(result, (str, bytes)):
        array = np.asarray(result)
        if array.ndim != 1:
            raise ValueError(f"returned an array of shape {array.shape}, not [{n}]")
        items = list(array)
    else:
        raise ValueError(f"returned {type(result).__name__}, not a list of {n} numbers")
    if len(items) != n:
        raise ValueError(f"returned {len(items)} values for {n} completions")
    values, bad = np.zeros(n, np.float32), np.zeros(n, bool)
    for i, item in enumerate(items):
        try:
            v = 0.0 if item is None else float(item)  # None: does not apply (TRL)
        except Exception:  # TypeError, ValueError, OverflowError (a huge int), a bad __float__
            v = math.nan
        if isinstance(item, (str, bytes)) or not abs(v) <= _FLOAT32_MAX:  # NaN fails too
            bad[i] = True
        else:
            values[i] = v
    return values, bad


@dataclass(frozen=True)
class Rewards:
    entries: tuple[RewardEntry, ...]
    log: Callable[[str], Any] = print

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def check_columns(self, available: Sequence[str]) -> None:
        """InputError naming the spec whose built-in reads a column the dataset lacks."""
        for e in self.entries:
            for col in getattr(e.fn, "columns", ()):
                if col not in available:
                    raise InputError(f"reward {e.name!r} reads column {col!r}, which the data "
                                     f"lacks; it has {', '.join(available) or 'none'}",
                                     key=f"{e.where}.column")

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 columns: Mapping[str, Sequence], completion_tokens: Sequence[int]
                 ) -> RewardResult:
        """Every function on the N samples; never raises because of a function."""
        n = len(prompts)
        for what, seq in (("completions", completions), ("completion_tokens", completion_tokens),
                          *((f"column {k!r}", v) for k, v in columns.items())):
            if len(seq) != n:  # the caller's bug, not the reward function's
                raise ValueError(f"{what} has {len(seq)} entries for {n} prompts")
        events = {f"{kind}{suffix}": 0 for kind in EVENTS
                  for suffix in ("", *(f"/{e.name}" for e in self.entries))}
        per_function, total = {}, np.zeros(n, np.float32)
        for e in self.entries:
            kwargs = {k: list(v) for k, v in columns.items()}
            kwargs.update(prompts=list(prompts), completions=list(completions),
                          completion_tokens=[int(t) for t in completion_tokens])
            status, out = _run(e.fn, kwargs, e.timeout_s)
            values, bad, kind = np.full(n, e.fallback, np.float32), np.zeros(n, bool), None
            if status == "timeout":
                kind, why = "reward_timeouts", f"ran past its {e.timeout_s} s timeout (abandoned)"
            elif status == "error":
                kind, why = "reward_errors", f"raised {type(out).__name__}: {out}"
            else:
                try:
                    values, bad = _values(out, n)
                except Exception as err:  # not N values (ValueError), or a broken __array__
                    kind, why = "reward_errors", str(err)
            if kind is not None:
                events[kind] += 1
                events[f"{kind}/{e.name}"] += 1
                self.log(f"reward {e.name!r} {why}; its {n} samples get {e.fallback}")
            elif bad.any():
                values[bad] = e.fallback
                count = int(bad.sum())
                events["reward_invalid"] += count
                events[f"reward_invalid/{e.name}"] += count
                first = int(np.flatnonzero(bad)[0])
                self.log(f"reward {e.name!r}: {count} of {n} values are not finite numbers "
                         f"(first: {out[first]!r} at sample {first}); they get {e.fallback}")
            per_function[e.name] = values
            total += np.float32(e.weight) * values
        return RewardResult(total, per_function, events)
