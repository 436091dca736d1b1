"""Metric sinks: console progress, metrics.jsonl, TensorBoard."""

from hone.metrics.sinks import ConsoleSink, JsonlSink, TensorBoardSink, make_sinks

__all__ = ["ConsoleSink", "JsonlSink", "TensorBoardSink", "make_sinks"]
