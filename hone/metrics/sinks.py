"""Where logged metrics go. Each sink takes `write(step, metrics)` and `close()`.

- JsonlSink: one JSON object per logged step in run_dir/metrics.jsonl, floats written with
  Python's shortest exact repr, so equal numbers give byte-identical lines. On resume the lines
  after the restored step are dropped: the file then reads like one uninterrupted run.
- TensorBoardSink: event files under run_dir/tensorboard (tensorboardX, no TensorFlow needed).
- ConsoleSink: a one-line progress bar (step, loss, learning rate, tokens/s, ETA) on a terminal,
  plain lines otherwise.
- PrometheusSink (hone.metrics.prometheus): the latest values as gauges on an HTTP /metrics
  endpoint, served by process 0 only.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them visible rather than invalid
    return v


class JsonlSink:
    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self.file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    def __init__(self, directory: Path):
        from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(str(directory))

    def write(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            v = _plain(v)
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ConsoleSink:
    def __init__(self, max_steps: int, start_step: int = 0, stream=None, label: str = "train"):
        self.max_steps, self.start_step = max_steps, start_step
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.t0 = time.perf_counter()
        self.label = label

    def write(self, step: int, metrics: dict) -> None:
        done = step - self.start_step
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(done, 1) * (self.max_steps - step)
        width = 20
        filled = int(width * step / max(self.max_steps, 1))
        bar = "#" * filled + "-" * (width - filled)
        parts = [f"{self.label} [{bar}] {step}/{self.max_steps}"]
        for key, fmt in (("loss", ".4f"), ("eval_loss", ".4f"), ("reward_mean", ".3f"),
                         ("accuracy", ".1%"), ("eval_reward", ".3f"), ("eval_accuracy", ".1%"),
                         ("lr", ".2e"), ("tokens_per_s", ".0f"), ("mfu", ".1%")):
            if key in metrics:
                parts.append(f"{key} {format(_plain(metrics[key]), fmt)}")
        parts.append(f"ETA {_duration(eta)}")
        line = "  ".join(parts)
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def make_sinks(names, run_dir: Path, *, max_steps: int, resume_step: int | None,
               prometheus_port: int = 9464, prometheus_host: str = "127.0.0.1",
               wandb_project: str | None = None) -> list:
    sinks = []
    for name in names:
        if name == "console":
            sinks.append(ConsoleSink(max_steps, resume_step or 0))
        elif name == "jsonl":
            sinks.append(JsonlSink(run_dir / "metrics.jsonl", resume_step))
        elif name == "tensorboard":
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        elif name == "prometheus":
            import jax  # one endpoint per run: the other hosts would serve the same numbers

            from hone.metrics.prometheus import PrometheusSink
            if jax.process_index() == 0:
                sinks.append(PrometheusSink(prometheus_port, prometheus_host))
        elif name == "wandb":
            from hone.metrics.wandb_sink import WandbSink
            sinks.append(WandbSink(run_dir, project=wandb_project, resume_step=resume_step))
        else:
            raise ValueError(f"unknown metrics sink {name!r}")
    return sinks
