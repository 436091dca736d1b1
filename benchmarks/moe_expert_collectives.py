"""What XLA exchanges for a routed MLP whose stacked experts are split over mesh.expert
(docs/guides/moe.md, Parallelism): the all-gathers in the gradient of tiny-moe's forward on
8 simulated CPU devices, as compiled for CPU (jax lowers ragged_dot to a masked product) and
as XLA's SPMD partitioner leaves it when jax emits the `ragged-dot` instruction, as it does for
GPU and TPU (forced here on CPU; XLA:CPU cannot run the instruction, so the partitioned HLO
is read from XLA's pass dump and compiling is expected to fail after it).

    python benchmarks/moe_expert_collectives.py [data=2 expert=4 fsdp=1 tp=1]

An all-gather whose shape leads with the number of experts (8) rebuilds every expert's
weights on every device.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

DUMP = Path(tempfile.mkdtemp(prefix="hone-moe-hlo-"))
os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={DUMP} "
                           "--xla_dump_hlo_pass_re=spmd-partitioning")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from hone.config import MeshSection  # noqa: E402
from hone.models.config import PRESETS  # noqa: E402
from hone.models.transformer import Transformer  # noqa: E402
from hone.parallel import Layout, build_mesh  # noqa: E402

GATHER = re.compile(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(")


def gradient(sizes: dict[str, int]):
    """A fresh jitted gradient of tiny-moe's mean logit and its placed inputs."""
    layout = Layout(build_mesh(MeshSection(**sizes)))
    model = layout.place_model(Transformer(PRESETS["tiny-moe"]))
    tokens = layout.place_batch({"tokens": np.random.default_rng(0).integers(
        0, 256, (16, 32)).astype(np.int32)})["tokens"]
    return nnx.jit(nnx.grad(lambda m, x: m(x).astype(jnp.float32).mean())), model, tokens


def main(argv: list[str]) -> None:
    sizes = {"data": 2, "expert": 4} | {k: int(v) for k, v in (a.split("=") for a in argv)}
    grad, model, tokens = gradient(sizes)
    cpu = sorted(set(GATHER.findall(grad.lower(model, tokens).compile().as_text())))
    print(f"mesh {sizes}: CPU lowering, all-gathers of shapes {cpu}")

    from functools import partial

    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal
    mlir.register_lowering(lax_internal.ragged_dot_general_p,
                           partial(lax_internal._ragged_dot_general_lower, platform="cpu"),
                           platform="cpu")
    grad, model, tokens = gradient(sizes)
    try:
        grad.lower(model, tokens).compile()
    except Exception as e:  # expected: XLA:CPU has no ragged-dot thunk
        print(f"(compiling for CPU stops after partitioning, as expected: {str(e)[:80]})")
    dumps = sorted(DUMP.glob("*after_spmd-partitioning*"), key=os.path.getmtime)
    text = dumps[-1].read_text()
    native = sorted(set(GATHER.findall(text)))
    print(f"mesh {sizes}: ragged-dot instruction ({text.count('ragged-dot(')} of them), "
          f"all-gathers of shapes {native}")


if __name__ == "__main__":
    main(sys.argv[1:])
