"""Sharded loading (hone/weights/sharded_load.py): every parameter created on its mesh sharding.

- `hf_block` (hone block -> HF read) against slicing the whole converted tensor, for every
  layout kind, including blocks that split trailing axes (the superset-read fallback).
- Safetensors folders written by `save_hf` load on 8 host devices bit for bit equal to the
  unsharded load, float32 and bfloat16, for several mesh shapes; presets initialise sharded.
- The shipped SmolLM2-135M-Instruct (GGUF) on a data 1 x fsdp 4 x tp 2 mesh: each device holds
  exactly its 1/8 (or 1/4) of every matrix, and logits match the single-device model.

The mesh cases run this file as a script in a subprocess (the device count is fixed when JAX
starts) and read back one JSON line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MESHES = [(1, 4, 2), (1, 1, 8), (1, 8, 1), (2, 2, 2)]  # (data, fsdp, tp)
SHIPPED = "smollm2-135m-instruct"
PROMPTS = [  # four rows of 32 tokens each
    "Water boils at one hundred degrees Celsius at sea level. When water is heated, its "
    "molecules move faster and faster until they escape from the surface as steam, which rises "
    "into the air.",
    "When the summer holidays began, the family packed the car and drove to the coast. The "
    "children wanted to swim in the sea every day, and their parents wanted to rest.",
    "<|im_start|>user\nWhat is the capital of France, and why did it become the capital of "
    "the country in the first place? Please answer in two short sentences.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nprint([fibonacci(i) for i in range(10)])\n",
]


def run_worker(case: str, tmp_path) -> dict:
    from hostenv import host_devices_env  # (this file also runs as a script, without tests/)
    env = host_devices_env(8)
    out = subprocess.run([sys.executable, __file__, case, str(tmp_path)], env=env, cwd=ROOT,
                         timeout=600, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][-1]


# ---- in process: the block arithmetic ----------------------------------------------------------


@pytest.mark.parametrize("shape,kind", [((6,), "same"), ((8, 6), "same"), ((6, 4, 3), "in"),
                                        ((6, 5), "in"), ((4, 3, 6), "out"), ((4, 3), "bias")])
def test_hf_block_equals_the_block_of_the_whole_converted_tensor(shape, kind):
    from hone.weights.sharded_load import hf_block
    from hone.weights.assemble import hf_shape, to_hone
    rng = np.random.default_rng(0)
    full_hf = rng.standard_normal(hf_shape(shape, kind)).astype(np.float32)
    want_all = to_hone(full_hf, shape, kind)
    for _ in range(50):
        index = []
        for n in shape:
            a = int(rng.integers(0, n))
            index.append(slice(a, int(rng.integers(a + 1, n + 1))))
        index = tuple(index)
        reads = []

        def read(hf_index):
            reads.append(full_hf[hf_index].size)
            return full_hf[hf_index]

        got = hf_block(read, index, shape, kind)
        np.testing.assert_array_equal(got, want_all[index])
        # Exact reads when every axis after the first of a flattened group is whole.
        group = {"same": [], "in": list(range(2, len(shape))),
                 "out": list(range(1, len(shape) - 1)), "bias": [1]}[kind]
        if all(index[i] == slice(0, shape[i]) for i in group):
            assert reads == [got.size]


# ---- subprocess workers (8 host devices) -------------------------------------------------------


def _layout(data: int, fsdp: int, tp: int):
    from hone.config.schema import MeshSection
    from hone.parallel import Layout, build_mesh
    return Layout(build_mesh(MeshSection(data=data, fsdp=fsdp, tp=tp)))


def _flat(model) -> list:
    from flax import nnx
    return nnx.to_flat_state(nnx.state(model))


def _placement_errors(model, layout) -> list[str]:
    """Parameters not on the sharding the layout gives their logical names."""
    errors = []
    for path, var in _flat(model):
        want = layout.param(var.get_metadata().get("out_sharding"), var.shape)
        if not var[...].sharding.is_equivalent_to(want, len(var.shape)):
            errors.append(f"{path}: {var[...].sharding} != {want}")
    return errors


def _mismatches(a, b) -> list[str]:
    return [str(pa) for (pa, va), (_, vb) in zip(_flat(a), _flat(b))
            if not np.array_equal(np.asarray(va[...]), np.asarray(vb[...]))]


def worker_safetensors(tmp: Path) -> dict:
    """Tiny llama (tied) and qwen2 (q/k/v bias, untied lm_head) folders with every parameter
    random, stored as float32 and bfloat16, loaded on each mesh against the plain load."""
    import dataclasses

    import jax
    from flax import nnx

    import hone
    from hone.models.config import PRESETS
    from hone.weights.sharded_load import init_sharded
    from hone.models.transformer import Transformer
    from hone.parallel import Layout
    tiny = PRESETS["tiny"]
    configs = {"llama": tiny, "qwen2": dataclasses.replace(
        tiny, family="qwen2", attention_bias=True, tie_embeddings=False)}
    result = {"mismatch": [], "placement": [], "split": {}}
    for family, cfg in configs.items():
        model = Transformer(cfg, rngs=nnx.Rngs(1))
        rng = np.random.default_rng(1)
        nnx.update(model, jax.tree.map(
            lambda x: rng.standard_normal(x.shape).astype(np.float32), nnx.state(model)))
        for dtype in ("float32", "bfloat16"):
            folder = hone.save_hf(model, tmp / f"{family}-{dtype}", dtype=dtype)
            plain = hone.load_model(folder, dtype=dtype)
            for mesh in MESHES:
                layout = _layout(*mesh)
                sharded = hone.load_model(folder, dtype=dtype, layout=layout)
                tag = f"{family} {dtype} {mesh}"
                result["mismatch"] += [f"{tag} {p}" for p in _mismatches(plain, sharded)]
                result["placement"] += [f"{tag} {e}" for e in _placement_errors(sharded, layout)]
                result["split"][tag] = sum(len(var[...].sharding.spec) > 0
                                           for _, var in _flat(sharded))
    # Presets: jitted sharded init (what load_model uses for presets over 1 GiB) equals the
    # jitted unsharded init and the eager init bit for bit.
    layout = _layout(1, 4, 2)
    sharded = init_sharded(tiny, np.float32, 3, layout)
    result["placement"] += [f"tiny init {e}" for e in _placement_errors(sharded, layout)]
    result["init_vs_jit"] = _mismatches(init_sharded(tiny, np.float32, 3, Layout(None)), sharded)
    eager = hone.load_model("tiny", seed=3)
    result["init_vs_eager_rel"] = max(
        float(np.max(np.abs(np.asarray(a[...]) - np.asarray(b[...])) /
                     np.maximum(np.abs(np.asarray(a[...])), 1e-30)))
        for (_, a), (_, b) in zip(_flat(eager), _flat(sharded)))
    return result


def worker_shipped(tmp: Path) -> dict:
    """SmolLM2-135M-Instruct on one device, then loaded sharded on data 1 x fsdp 4 x tp 2."""
    import time

    import jax
    from flax import nnx

    import hone
    from hone.parallel import Layout
    tok = hone.load_tokenizer(SHIPPED)
    tokens = np.array([tok.encode(p)[:32] for p in PROMPTS], np.int32)  # [4, 32]
    forward = nnx.jit(lambda model, t: model(t))
    one = hone.load_model(SHIPPED)
    logits_one = np.asarray(forward(one, tokens))
    # The float32 noise floor of these logits: the same device, one row at a time.
    rows = np.concatenate([np.asarray(forward(one, tokens[i:i + 1])) for i in range(4)])
    one_bytes = Layout.device_bytes(nnx.state(one))
    one_params = [np.asarray(var[...]) for _, var in _flat(one)]
    del one
    layout = _layout(1, 4, 2)
    start = time.perf_counter()
    sharded = hone.load_model(SHIPPED, layout=layout)
    load_s = time.perf_counter() - start
    logits = np.asarray(forward(sharded, jax.device_put(tokens, layout.rows(tokens.shape))))
    mesh = layout.mesh.shape
    params = []
    for path, var in _flat(sharded):
        x = var[...]
        axes = [a for entry in x.sharding.spec if entry is not None
                for a in (entry if isinstance(entry, tuple) else (entry,))]
        params.append({"path": "/".join(map(str, path)), "nbytes": x.nbytes,
                       "device0": Layout.device_bytes(x), "ways": math.prod(mesh[a] for a in axes),
                       "distinct": len({str(s.index) for s in x.addressable_shards})})
    return {"shape": list(tokens.shape), "max_abs": float(np.max(np.abs(logits - logits_one))),
            "rows_noise": float(np.max(np.abs(rows - logits_one))),
            "logit_scale": float(np.max(np.abs(logits_one))), "one_bytes": one_bytes,
            "params_equal": all(np.array_equal(a, np.asarray(var[...]))
                                for a, (_, var) in zip(one_params, _flat(sharded))),
            "load_s": load_s, "params": params,
            "placement": _placement_errors(sharded, layout)}


# ---- the tests ---------------------------------------------------------------------------------


def test_safetensors_and_presets_load_sharded_exactly(tmp_path):
    r = run_worker("safetensors", tmp_path)
    assert r["mismatch"] == []
    assert r["placement"] == []
    # Every mesh really splits parameters (tiny: 2 layers, 20 or 27 parameters; on tp=8 only
    # vocab and MLP width split, its 4 heads do not divide by 8).
    assert all(n >= 7 for n in r["split"].values()), r["split"]
    assert r["split"]["qwen2 float32 (1, 4, 2)"] == 27  # bias [N, H]: heads over tp
    assert r["init_vs_jit"] == []
    assert r["init_vs_eager_rel"] == 0.0


@pytest.mark.real_model
def test_shipped_smollm2_loads_sharded_on_fsdp4_tp2_with_the_same_logits(tmp_path):
    r = run_worker("shipped", tmp_path)
    assert r["shape"] == [4, 32]
    assert r["placement"] == []
    params = {p["path"]: p for p in r["params"]}
    total = sum(p["nbytes"] for p in params.values())
    assert r["one_bytes"] == total  # the plain load: the whole model on device 0
    for p in params.values():
        # Device 0 holds exactly its 1/ways block, and the 8 devices hold `ways` different ones.
        assert p["device0"] * p["ways"] == p["nbytes"], p
        assert p["distinct"] == p["ways"], p
    # vocab (49152) and MLP width (1536) split over tp=2 and the 576-wide embed axis over
    # fsdp=4: 1/8. 9 query / 3 KV heads do not divide over tp=2, so attention weights and norms
    # split over fsdp only: 1/4.
    assert params["embedder/embedding"]["ways"] == 8
    for name in ("gate", "up", "down"):
        assert params[f"layers/0/mlp/{name}/kernel"]["ways"] == 8
    for name in ("q", "k", "v", "o"):
        assert params[f"layers/0/attn/{name}/kernel"]["ways"] == 4
    assert params["final_norm/scale"]["ways"] == 4
    device0 = sum(p["device0"] for p in params.values())
    print(f"\nSmolLM2-135M float32: {total} bytes whole, {device0} on device 0 sharded "
          f"({total / device0:.2f}x less); sharded load {r['load_s']:.1f} s; logits max abs "
          f"diff {r['max_abs']:.2e}, one device row by row {r['rows_noise']:.2e} "
          f"(max |logit| {r['logit_scale']:.1f})")
    assert total / 8 < device0 < total / 6
    # The loaded weights are the single-device weights bit for bit; what remains is the order
    # of float32 sums on the mesh (fsdp and tp split contractions). Measured here: 1.3e-4 max
    # abs with logits up to 44, while the same single device running the rows one at a time
    # already differs by 1.0e-4 from the batch. So 1e-4 absolute is below this model's float32
    # noise floor; the bound is 1e-5 of the largest logit (about 84 ulps at that size).
    assert r["params_equal"]
    assert r["max_abs"] <= 1e-5 * r["logit_scale"]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    case, tmp = sys.argv[1], Path(sys.argv[2])
    print(json.dumps({"safetensors": worker_safetensors, "shipped": worker_shipped}[case](tmp)))
