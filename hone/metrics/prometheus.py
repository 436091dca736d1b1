"""A metrics sink that serves the latest logged values on an HTTP /metrics endpoint for Prometheus.

Design choices:

- Every value is a gauge of the latest logged value: `hone_<key>` (hone_loss, hone_tokens_per_s,
  hone_eval_loss, ...) plus `hone_step`. Keys that count things (`*_count`, `events/*`, `guard*`)
  are gauges too, not Prometheus counters: the loop already reports their cumulative value, and a
  counter would need increments and could not follow a resumed run back to its restored value.
- Names are sanitised to Prometheus rules: every character outside [a-zA-Z0-9_] becomes "_"
  ("events/reward_timeout" -> hone_events_reward_timeout); keys that sanitise alike share a gauge.
- Non-finite numbers are served as NaN (a diverged loss stays visible); strings, None and arrays
  with more than one element are skipped. A gauge keeps its last value until the key is logged
  again, so an evaluation metric logged every N steps stays on the dashboard in between.
- One registry per sink, not prometheus_client's global one, so two runs (or tests) in one
  process do not collide. A scrape reads one snapshot taken under a lock, so it never sees the
  step of one row with the loss of another.
- Loopback by default: the endpoint has no authentication. Only process 0 of a multi-host run
  serves (decided in `make_sinks`); the others would repeat the same numbers on every host.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from numbers import Real

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str) -> str:
    """Prometheus name of a key: "events/reward_timeout" -> "hone_events_reward_timeout"."""
    return "hone_" + _NOT_ALLOWED.sub("_", key)


def _scalar(value) -> float | None:
    """A logged value as a float gauge value, or None when it is not a numeric scalar."""
    if getattr(value, "size", 1) != 1:  # arrays: only single elements are scalars
        return None
    if hasattr(value, "item"):  # numpy / JAX scalars and one-element arrays
        value = value.item()
    if not isinstance(value, Real):  # bool is an int, so True/False serve as 1/0
        return None
    value = float(value)
    return value if math.isfinite(value) else math.nan


class _Latest(Collector):
    """The latest value of every key logged so far, collected as gauges at scrape time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values: dict[str, tuple[str, float]] = {}  # name -> (original key, value)

    def update(self, values: dict[str, tuple[str, float]]) -> None:
        with self.lock:
            self.values.update(values)

    def collect(self):
        with self.lock:
            snapshot = sorted(self.values.items())
        for name, (key, value) in snapshot:
            yield GaugeMetricFamily(name, f"hone: latest logged value of {key!r}", value=value)


class PrometheusSink:
    """Serves http://host:port/metrics from a background thread until `close()`."""

    def __init__(self, port: int = 9464, host: str = "127.0.0.1", stream=None):
        self.registry = CollectorRegistry()
        self.latest = _Latest()
        self.registry.register(self.latest)
        # prometheus_client >= 0.16 returns (server, thread); keep both to shut down in close().
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.server.server_port  # the port the OS picked when asked for 0
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"
        stream = stream or sys.stderr
        stream.write(f"prometheus: serving {self.url}\n")
        stream.flush()

    def write(self, step: int, metrics: dict) -> None:
        values = {}
        for key, value in metrics.items():
            value = _scalar(value)
            if value is not None:
                values[metric_name(key)] = (key, value)
        values["hone_step"] = ("step", float(step))  # the step argument wins over any "step" key
        self.latest.update(values)

    def close(self) -> None:
        self.server.shutdown()  # stop serve_forever, then free the port
        self.server.server_close()
        self.thread.join()
