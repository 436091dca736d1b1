"""The environment of the tests' JAX subprocesses: N host CPU devices, and the other XLA flags the
test run was started with (`make test` sets compile-time flags that every process should use)."""

from __future__ import annotations

import os
import re

_COUNT = re.compile(r"--xla_force_host_platform_device_count=\S+")


def host_devices_env(devices: int = 1, base: dict | None = None) -> dict:
    """A copy of `base` (default os.environ) on the CPU with `devices` host devices."""
    env = dict(os.environ if base is None else base, JAX_PLATFORMS="cpu")
    flags = _COUNT.sub("", env.get("XLA_FLAGS", "")).split()
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env
