"""Metric sinks: console progress, metrics.jsonl, TensorBoard, a Prometheus endpoint."""

from hone.metrics.prometheus import PrometheusSink
from hone.metrics.sinks import ConsoleSink, JsonlSink, TensorBoardSink, make_sinks

__all__ = ["ConsoleSink", "JsonlSink", "PrometheusSink", "TensorBoardSink", "make_sinks"]
