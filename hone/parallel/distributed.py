"""Multi-process (multi-host) runs: one `jax.distributed.initialize` per process, from the
`distributed:` config section or the environment, before JAX touches a device.

Where the three settings come from, first match wins:
- coordinator ("host:port" of process 0): `distributed.coordinator`, else the environment
  variable `JAX_COORDINATOR_ADDRESS`. JAX 0.10.2 reads that variable itself; we read it too, so
  a half-configured run fails here with a config key rather than inside JAX.
- number of processes: `distributed.num_processes` (> 0), else `JAX_NUM_PROCESSES`.
- this process's index: `distributed.process_id` (>= 0), else `JAX_PROCESS_ID`.
  JAX 0.10.2 does NOT read these two variables (only a detected cluster supplies them), so hone
  reads them: one launcher script can then start every process with the same config file.

`distributed.auto: true` calls `jax.distributed.initialize` with only the settings given above
and lets JAX detect the rest (TPU pod slices, SLURM, Open MPI, Kubernetes). With nothing
configured at all the run is a single process and nothing is called.

A second call in the same process is a no-op (JAX refuses a second initialize), so tests and
notebooks can call `initialize` before every run.

CPU collectives: a multi-process CPU run needs a cross-process collectives backend, picked by
`jax_cpu_collectives_implementation` when the CPU client is created. JAX 0.10.2 defaults it to
"gloo" (older versions defaulted to none, and then psum across processes fails); we set "gloo"
when it is unset. Setting it is harmless on GPU and TPU, where only the CPU client reads it, so
no device probe is needed (probing would create the backends before initialize, which JAX
forbids).
"""

from __future__ import annotations

import os

import jax

from hone.errors import InputError

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _env_int(name: str, key: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"environment variable {name}={value!r} is not an integer",
                         key=key) from None


def resolve(section) -> dict | None:
    """The keyword arguments for `jax.distributed.initialize`, or None for a single process.

    With `auto`, only the settings actually given are returned (JAX detects the rest)."""
    coordinator = section.coordinator.strip() or os.environ.get(ENV_COORDINATOR, "").strip()
    num = section.num_processes or _env_int(ENV_NUM_PROCESSES, "distributed.num_processes")
    pid = (section.process_id if section.process_id >= 0
           else _env_int(ENV_PROCESS_ID, "distributed.process_id"))
    if coordinator:
        host, sep, port = coordinator.rpartition(":")
        if not (sep and host and port.isdigit()):
            raise InputError(f"must be 'host:port' (the address of process 0), got "
                             f"{coordinator!r}", key="distributed.coordinator")
    if num is not None and num < 1:
        raise InputError(f"must be at least 1, got {num}", key="distributed.num_processes")
    if pid is not None and pid < 0:
        raise InputError(f"must be 0 or more, got {pid}", key="distributed.process_id")
    if num is not None and pid is not None and pid >= num:
        raise InputError(f"{pid} is not below distributed.num_processes ({num}); processes "
                         f"are numbered 0 .. {num - 1}", key="distributed.process_id")
    given = {k: v for k, v in (("coordinator_address", coordinator or None),
                               ("num_processes", num), ("process_id", pid)) if v is not None}
    if section.auto:
        return given
    if not coordinator:
        if (num is not None and num > 1) or pid is not None:
            which = "process_id" if pid is not None else "num_processes"
            raise InputError(f"is set but no coordinator is: set distributed.coordinator "
                             f"(or {ENV_COORDINATOR}) to process 0's 'host:port', or "
                             f"distributed.auto: true to let JAX detect the cluster",
                             key=f"distributed.{which}")
        return None
    for key, value, env in (("num_processes", num, ENV_NUM_PROCESSES),
                            ("process_id", pid, ENV_PROCESS_ID)):
        if value is None:
            raise InputError(f"is needed with a coordinator ({coordinator}): set "
                             f"distributed.{key} or the environment variable {env}",
                             key=f"distributed.{key}")
    return given


def initialize(section) -> bool:
    """Join the multi-process run described by a `distributed:` section (see the module
    docstring); True when JAX's distributed runtime is up, False for a single process.

    Must run before any JAX computation in the process."""
    if jax.distributed.is_initialized():
        return True
    kwargs = resolve(section)
    if kwargs is None:
        return False
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
    return True
