"""One line naming the machine a timing was taken on: CPU model, vector extensions, cores, and
the fp32 matrix-product rate measured now (2048^3, median of 7, about a second).

`make test` prints it after the suite, so its time is never quoted without the machine. Why it
matters: machines that report the same "AMD EPYC" name with AVX-512 differ by 2.5x in that rate
(about 175 GFLOP/s on one, 445 on another, FACTS.md), and the suite is mostly compiling and
running small programs on them.
"""

from __future__ import annotations

import os
import time


def cpu() -> str:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = set(info.get("flags", "").split())
    vector = ("AVX-512 bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
              else "AVX2" if "avx2" in flags else "no AVX2")
    return (f"{info.get('model name', '?')} (vendor {info.get('vendor_id', '?')}, family "
            f"{info.get('cpu family', '?')} model {info.get('model', '?')}), {vector}, "
            f"{os.cpu_count()} cores")


def matmul_gflops(n: int = 2048, repeats: int = 7) -> float:
    import jax
    import jax.numpy as jnp
    x = jnp.ones((n, n), jnp.float32)
    product = jax.jit(lambda a: a @ a)
    product(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / sorted(times)[repeats // 2] / 1e9


if __name__ == "__main__":
    print(f"machine: {cpu()}; fp32 matmul 2048^3 {matmul_gflops():.0f} GFLOP/s")
