"""Tiny training runs on several meshes in one process, for tests/parallel (run as a script
under XLA_FLAGS=--xla_force_host_platform_device_count=8; prints one JSON line per run).

    python tests/parallel/mesh_runs.py ALGO RUN_ROOT MESH... [-- key=value ...]

ALGO is a command (its config configs/tiny/ALGO.yaml) or `moe_` and a command (the
mixture-of-experts config configs/tiny/moe_ALGO.yaml). A MESH is
`data,fsdp,tp[,seq][,eN][,mode]` (seq: tokens of each row split that many ways; eN: experts
split N ways over mesh.expert; e.g. `1,1,1,4`, `1,4,1,2`, `2,1,1,e4`, `8,1,1,allreduce`);
`elastic` instead of ALGO runs the elastic-restore scenario, `ring` the ring-attention check
(hone/parallel/ring_attention.py against dense), `moe` the expert-parallel scenario (`moe_meshes`).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hone.config import COMMANDS, load_config  # noqa: E402
from hone.parallel import Layout  # noqa: E402


def run(algo: str, run_dir: Path, mesh: str, overrides: list[str],
        evaluate: bool = False) -> dict:
    """One 10-step run; `evaluate`: with the held-out evaluation at its end (its loss returned
    as eval_loss), else without a held-out set (data.eval_path=null), which saves compiling
    and running the evaluation (GRPO's: greedy sampling at the start and the end) where a test
    compares only the training trajectory."""
    d, f, t, *rest = mesh.split(",")
    seq = next((x for x in rest if x.isdigit()), "1")
    expert = next((x[1:] for x in rest if x[:1] == "e" and x[1:].isdigit()), "1")
    mode = next((x for x in rest if not x.isdigit() and not x[1:].isdigit()), "gspmd")
    command = algo.removeprefix("moe_")
    cfg = load_config(COMMANDS[command], ROOT / f"configs/tiny/{algo}.yaml", [
        f"run_dir={run_dir}", "train.max_steps=10", "log.sinks=[jsonl]", "train.eval_every=0",
        "checkpoint.every_steps=0", "data.max_records=256", f"mesh.data={d}", f"mesh.fsdp={f}",
        f"mesh.tp={t}", f"mesh.seq={seq}", f"mesh.expert={expert}", f"mesh.mode={mode}"]
        + ([] if evaluate else ["data.eval_path=null"]) + overrides)
    recipe = importlib.import_module(f"hone.recipes.{command}")
    model, state = getattr(recipe, f"run_{command}")(cfg, log=lambda *a: None)[:2]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    rows = [r for r in rows if "loss" in r]
    # Which attention ran across the seq axis (None: no seq axis, attention within each row).
    ring = type(getattr(model, "sequence_attention", None)).__name__
    return {"mesh": mesh, "ring": ring, "steps": [r["step"] for r in rows],
            "loss": [r["loss"] for r in rows],
            "grad_norm": [r["grad_norm"] for r in rows], "eval_loss": evals,
            "device_bytes": Layout.device_bytes({"params": state["params"],
                                                 "opt_state": state["opt_state"]})}


def elastic(root: Path, overrides: list[str]) -> None:
    """An uninterrupted 10-step run on one device; a run stopped at step 5 on (2,4,1) and
    continued to 10 on (1,4,1), (8,1,1) and one device. Constant schedule: max_steps=5 then 10
    is the same run as 10 straight. The stopped run and its (1,4,1) continuation rematerialise
    their blocks, so they scan them over weights stored stacked and sharded over fsdp
    (hone/models/stacked.py); the checkpoint keeps them per block, and the other two continue
    with the loop (remat changes no number)."""
    keep = ["train.schedule=constant", "checkpoint.every_steps=5"] + overrides
    print(json.dumps(dict(run("sft", root / "straight", "1,1,1", keep), name="straight")),
          flush=True)
    scan = ["train.remat=full"]
    run("sft", root / "first", "2,4,1", keep + ["train.max_steps=5"] + scan)
    for mesh, extra in (("1,4,1", scan), ("8,1,1", []), ("1,1,1", [])):
        target = root / f"resumed-{mesh.replace(',', '')}"
        shutil.copytree(root / "first", target)
        print(json.dumps(dict(run("sft", target, mesh, keep + extra), name="resumed")),
              flush=True)


def replica_check() -> None:
    """hone.parallel.replicas on 8 devices: agreeing copies pass, one differing copy is
    found (an array built from per-device buffers, as a bad restore would leave it)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from hone.parallel.replicas import count_replicated, replica_mismatches
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    sharding = NamedSharding(mesh, P("fsdp"))  # 4 shards, each on 2 devices
    good = jax.device_put(np.arange(8.0, dtype=np.float32), sharding)
    parts = [np.asarray(s.data) for s in good.addressable_shards]
    parts[5] = parts[5].copy()
    parts[5][0] = np.nextafter(parts[5][0], np.float32(1e9))  # one ulp off on one device
    bad = jax.make_array_from_single_device_arrays(
        (8,), sharding, [jax.device_put(p, s.device) for p, s in
                         zip(parts, good.addressable_shards)])
    tree = {"good": good, "bad": bad, "one": jax.device_put(np.ones(3), jax.devices()[0])}
    print(json.dumps({"name": "replicas", "mismatches": replica_mismatches(tree),
                      "replicated": count_replicated(tree)}), flush=True)


def ring_check() -> None:
    """hone.parallel.ring_attention on 8 devices: ring attention against dense (outputs and the
    gradients of q, k and v) for masks with left and right padding, packed segments, a sliding
    window with a soft-cap, and shared-prefix branches, on (seq 4) and (fsdp 2, seq 2, tp 2);
    place_batch's token split and its error for rows seq does not divide; place_model's hook."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hone.config import MeshSection
    from hone.errors import InputError
    from hone.models.attention import dense_attention
    from hone.models.config import PRESETS
    from hone.models.masks import MaskSpec
    from hone.models.transformer import Transformer
    from hone.parallel.mesh import build_mesh
    from hone.parallel.ring_attention import RingAttention

    b, t, n, kv, h = 4, 16, 4, 2, 8
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
               for s in [(b, t, n, h), (b, t, kv, h), (b, t, kv, h)])
    valid = jnp.asarray(np.array([[0] * 3 + [1] * 13, [1] * 10 + [0] * 6] * 2), bool)
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    segment = jnp.asarray(np.array([[0] * 7 + [1] * 9, [0] * 5 + [1] * 11] * 2), jnp.int32)
    branch = jnp.asarray(np.array([[0] * 6 + [1] * 5 + [2] * 5] * b), jnp.int32)
    position = jnp.asarray(np.array([list(range(11)) + list(range(6, 11))] * b), jnp.int32)
    specs = {"padding": (MaskSpec(slots, slots, valid), None),
             "segments": (MaskSpec(slots, slots, valid, None, segment, segment), None),
             "window": (MaskSpec(slots, slots, valid, 5), 5.0),
             "branches": (MaskSpec(position, position, valid[::-1], None, None, None, branch,
                                   branch), None)}
    weight = jnp.cos(jnp.arange(n * h, dtype=jnp.float32)).reshape(n, h)  # a loss of all outputs
    errors, permutes = {}, {}
    for shape in ({"seq": 4}, {"data": 1, "fsdp": 2, "seq": 2, "tp": 2}):
        mesh = build_mesh(MeshSection(**({"data": 1} | shape)))
        ring = RingAttention(mesh)
        # The ring really runs (not the fallback): its forward passes blocks by collective permutes.
        hlo = jax.jit(lambda q, k, v: ring(q, k, v, specs["padding"][0], scale=0.3)).lower(
            q, k, v).compile().as_text()
        permutes[str(dict(mesh.shape))] = hlo.count("collective-permute(")
        for name, (spec, cap) in specs.items():
            def run(q, k, v, attend):
                out = attend(q, k, v)
                return (out * weight).sum(), out
            dense = lambda q, k, v: dense_attention(  # noqa: E731
                q, k, v, spec.build(), scale=0.3, softcap=cap)[0]
            # block=2: each device's 4 or 8 queries are scored in chunks of 2 per ring step
            split = lambda q, k, v: ring(q, k, v, spec, scale=0.3, softcap=cap,  # noqa: E731
                                         block=2)
            want = jax.grad(run, argnums=(0, 1, 2), has_aux=True)(q, k, v, dense)
            got = jax.jit(jax.grad(run, argnums=(0, 1, 2), has_aux=True),
                          static_argnums=3)(q, k, v, split)
            errors[f"{dict(mesh.shape)}/{name}"] = max(float(jnp.max(jnp.abs(x - y))) for x, y in
                                            zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    layout = Layout(build_mesh(MeshSection(data=1, fsdp=2, seq=2, tp=2)))
    batch = layout.place_batch({"tokens": np.zeros((4, 16), np.int32),
                                "loss_mask": np.zeros((4, 16, 3), np.float32),
                                "score_index": np.zeros((4, 2, 16), np.int32)})
    try:
        layout.place_batch({"tokens": np.zeros((4, 15), np.int32)})
        error = ""
    except InputError as e:
        error = str(e)
    # The whole tiny model on that layout, with the default positions (a cumsum along the
    # seq-split tokens) and left padding: logits and parameter gradients as on one device.
    from flax import nnx
    model = Transformer(PRESETS["tiny"])
    tokens = rng.integers(0, 256, (4, 16)).astype(np.int32)
    mask = np.array(valid, np.int32)

    def loss(model, tokens, mask):
        logits = model(tokens, attention_mask=mask)  # [B, T, V]
        return (logits * jnp.sin(jnp.arange(logits.shape[-1]))).sum(), logits

    grad = nnx.jit(nnx.grad(loss, has_aux=True))
    want_g, want = grad(model, tokens, mask)
    layout.place_model(model)
    placed = layout.place_batch({"tokens": tokens, "attention_mask": mask})
    got_g, got = grad(model, placed["tokens"], placed["attention_mask"])
    errors["model"] = max(float(jnp.max(jnp.abs(x - y)) / (1.0 + jnp.max(jnp.abs(y))))
                          for x, y in zip(jax.tree.leaves((got_g, got)),
                                          jax.tree.leaves((want_g, want))))
    # Again with the blocks rematerialised and run as a scan over their stacked, sharded
    # weights (hone/models/scan_layers.py), the ring inside the scan's body.
    model.remat, model.scan_layers = "full", True
    got_g, got = grad(model, placed["tokens"], placed["attention_mask"])
    errors["model_scan"] = max(float(jnp.max(jnp.abs(x - y)) / (1.0 + jnp.max(jnp.abs(y))))
                               for x, y in zip(jax.tree.leaves((got_g, got)),
                                               jax.tree.leaves((want_g, want))))
    print(json.dumps({"name": "ring", "errors": errors,
                      "permutes": permutes,
                      "specs": {k: str(x.sharding.spec) for k, x in batch.items()},
                      "error": error,
                      "hook": type(model.sequence_attention).__name__}), flush=True)


# The expert-parallel scenario: tiny-moe SFT on one device, expert 4 x data 2 and expert 2 x
# fsdp 2 x tp 2; GRPO on one device and expert 4 x data 2. GRPO: kl k1 (test_mesh_parity's
# GRPO test says why); one row per sample on every mesh (grpo.shared_prompt=false), since the
# router losses count every real token of the rows scored, so a prompt shared by its group's
# samples counts once where per-sample rows count it once per sample, and one device would
# take the shared rows that 4 prompts cannot give 8 row shards (hone/rl/rollout.tree_layout).
# 2 prompts x 4 samples of 8 tokens: one row per device, and half the decoding (the programs,
# whose compiling is most of the time, are the same).
MOE_SFT = ["1,1,1", "2,1,1,e4", "1,2,2,e2"]
MOE_GRPO = ["1,1,1", "2,1,1,e4", "1,2,2,e2"]
MOE_DPO = MOE_GRPO[:2]  # 4 steps: DPO's pair split on the expert axis, beside SFT's 10-step parity


def moe_meshes(root: Path, overrides: list[str]) -> None:
    """MOE_SFT, MOE_DPO and MOE_GRPO (one JSON line each, named moe_sft / moe_dpo / moe_grpo),
    then what XLA made of the routed MLP on expert 4 x data 2 (`expert_collectives`)."""
    for algo, meshes, extra in (("moe_sft", MOE_SFT, []),
                                ("moe_dpo", MOE_DPO, ["train.max_steps=4"]),
                                ("moe_grpo", MOE_GRPO,
                                 ["grpo.kl_kind=k1", "grpo.shared_prompt=false",
                                  "grpo.max_new_tokens=8", "train.batch_size=8"])):
        for mesh in meshes:
            start = time.perf_counter()
            out = run(algo, root / f"{algo}-{mesh.replace(',', '-')}", mesh, extra + overrides)
            print(json.dumps(dict(out, name=algo, seconds=time.perf_counter() - start)),
                  flush=True)
    start = time.perf_counter()
    out = expert_collectives()
    print(json.dumps(dict(out, seconds=time.perf_counter() - start)), flush=True)


def expert_collectives() -> dict:
    """The compiled gradient of tiny-moe's forward on expert 4 x data 2: the shapes every
    all-gather produces, and the stacked expert weights' per-device shape. Expert parallelism
    by sharding works only if no all-gather rebuilds the experts' [E, ...] weights."""
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from hone.config import MeshSection
    from hone.models.config import PRESETS
    from hone.models.transformer import Transformer
    from hone.parallel.mesh import build_mesh

    layout = Layout(build_mesh(MeshSection(data=2, expert=4)))
    model = layout.place_model(Transformer(PRESETS["tiny-moe"]))
    tokens = layout.place_batch({"tokens": np.random.default_rng(0).integers(
        0, 256, (16, 32)).astype(np.int32)})["tokens"]
    grad = nnx.jit(nnx.grad(lambda m, x: m(x).astype(jnp.float32).mean()))
    hlo = grad.lower(model, tokens).compile().as_text()
    gathered = sorted({m.group(1) for m in re.finditer(
        r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", hlo)})
    gate = model.layers[0].mlp.gate[...]
    return {"name": "collectives", "all_gather": gathered,
            "expert_shard": list(gate.addressable_shards[0].data.shape),
            "expert_full": list(gate.shape)}


def main(argv: list[str]) -> None:
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    algo, root, meshes = argv[0], Path(argv[1]), argv[2:]
    if algo == "ring":
        ring_check()
        return
    if algo == "moe":
        moe_meshes(root, overrides)
        return
    if algo == "elastic":
        elastic(root, overrides)
        replica_check()
        return
    for mesh in meshes:
        # SFT's runs end with the held-out evaluation, compared across meshes; the others
        # compare their training losses only.
        out = run(algo, root / f"{algo}-{mesh.replace(',', '-')}", mesh, overrides,
                  evaluate=algo == "sft")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
