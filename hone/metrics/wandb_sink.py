"""The Weights & Biases sink (`log.sinks=[console, wandb]`), for users who have wandb installed.

hone does not depend on wandb: the package is imported only when the sink is asked for, and
its absence is a config error naming `log.sinks`. W&B's own settings come from the environment
as usual (WANDB_API_KEY, WANDB_ENTITY, WANDB_MODE=offline, ...); `log.wandb_project` names the
project (None: WANDB_PROJECT or W&B's default).

A resumed run logs into the same W&B run: the run's id is kept in run_dir/wandb_id and passed
back with resume="allow". hone's step goes in as the `step` metric rather than as W&B's own
step counter, because a guard rollback logs a step again and W&B drops a step that goes back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from hone.errors import InputError


class WandbSink:
    def __init__(self, run_dir: Path, *, project: str | None, resume_step: int | None):
        try:
            import wandb
        except ImportError:
            raise InputError("the wandb sink needs the wandb package, which is not installed: "
                             "`pip install wandb` into hone's environment, or take wandb out of "
                             "log.sinks", key="log.sinks") from None
        id_file = run_dir / "wandb_id"
        if resume_step is not None and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:16]
            id_file.write_text(run_id + "\n")
        config_file = run_dir / "config.yaml"
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else None
        self.run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow",
                              dir=str(run_dir), config=config)

    def write(self, step: int, metrics: dict) -> None:
        values = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        self.run.log(dict(values, step=step))

    def close(self) -> None:
        self.run.finish()
