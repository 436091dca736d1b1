"""Tiny training runs on several meshes in one process, for tests/parallel (run as a script
under XLA_FLAGS=--xla_force_host_platform_device_count=8; prints one JSON line per run).

    python tests/parallel/mesh_runs.py ALGO RUN_ROOT MESH... [-- key=value ...]

A MESH is `data,fsdp,tp[,mode]`; `elastic` instead of ALGO runs the elastic-restore scenario.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hone.config import COMMANDS, load_config  # noqa: E402
from hone.parallel import Layout  # noqa: E402


def run(algo: str, run_dir: Path, mesh: str, overrides: list[str]) -> dict:
    d, f, t, *mode = mesh.split(",")
    cfg = load_config(COMMANDS[algo], ROOT / f"configs/tiny/{algo}.yaml", [
        f"run_dir={run_dir}", "train.max_steps=10", "log.sinks=[jsonl]", "train.eval_every=0",
        "checkpoint.every_steps=0", "data.max_records=256", f"mesh.data={d}", f"mesh.fsdp={f}", f"mesh.tp={t}",
        f"mesh.mode={(mode or ['gspmd'])[0]}"] + overrides)
    recipe = importlib.import_module(f"hone.recipes.{algo}")
    state = getattr(recipe, f"run_{algo}")(cfg, log=lambda *a: None)[1]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    return {"mesh": mesh, "steps": [r["step"] for r in rows], "loss": [r["loss"] for r in rows],
            "grad_norm": [r["grad_norm"] for r in rows],
            "device_bytes": Layout.device_bytes({"params": state["params"],
                                                 "opt_state": state["opt_state"]})}


def elastic(root: Path, overrides: list[str]) -> None:
    """An uninterrupted 10-step run on one device; a run stopped at step 5 on (2,4,1) and
    continued to 10 on (1,4,1), (8,1,1) and one device. Constant schedule: max_steps=5 then 10
    is the same run as 10 straight."""
    keep = ["train.schedule=constant", "checkpoint.every_steps=5"] + overrides
    print(json.dumps(dict(run("sft", root / "straight", "1,1,1", keep), name="straight")),
          flush=True)
    run("sft", root / "first", "2,4,1", keep + ["train.max_steps=5"])
    for mesh in ("1,4,1", "8,1,1", "1,1,1"):
        target = root / f"resumed-{mesh.replace(',', '')}"
        shutil.copytree(root / "first", target)
        print(json.dumps(dict(run("sft", target, mesh, keep), name="resumed")), flush=True)


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


def main(argv: list[str]) -> None:
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    algo, root, meshes = argv[0], Path(argv[1]), argv[2:]
    if algo == "elastic":
        elastic(root, overrides)
        replica_check()
        return
    for mesh in meshes:
        out = run(algo, root / f"{algo}-{mesh.replace(',', '-')}", mesh, overrides)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
