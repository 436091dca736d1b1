"""Tiny SFT, DPO and GRPO on 8 host devices: every mesh shape gives the single-device loss
trajectory (1e-5 relative over 10 steps; SFT its held-out loss too), the explicit all-reduce
mode and sequence parallelism (rows' tokens split over mesh.seq, ring attention) too; parameter plus
optimizer bytes per device fall as 1/fsdp; a checkpoint written on one mesh continues on others;
the tiny mixture-of-experts model's SFT and GRPO with its experts split over mesh.expert too.

Each test runs tests/parallel/mesh_runs.py in a subprocess, since the device count is fixed
when JAX starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hostenv import host_devices_env

ROOT = Path(__file__).resolve().parents[2]
# data,fsdp,tp[,seq][,mode]: the two seq shapes split each row's tokens 4 ways, and 2 ways
# with the rows over fsdp=4 (tests/parallel/mesh_runs.py).
SEQ = ["1,1,1,4", "1,4,1,2"]
# Every axis at once, (2,2,2), the explicit all-reduce mode and the two seq shapes, for SFT, DPO
# and GRPO (each mesh is one more compile, ~10 s of the suite): an 8-way data, fsdp or tp mesh of
# its own adds no path these runs do not take. fsdp's 1/fsdp bytes per device are checked on
# (1,4,1,2); DPO's pair-keeping splits run on every shape; GRPO's rows split like SFT's in the
# all-reduce mode, so GRPO skips it.
MESHES = ["1,1,1", "2,2,2", "8,1,1,allreduce"] + SEQ


def mesh_runs(tmp_path, *args) -> list[dict]:
    env = host_devices_env(8)
    out = subprocess.run([sys.executable, str(ROOT / "tests/parallel/mesh_runs.py"), *args[:1],
                          str(tmp_path), *args[1:]], env=env, cwd=ROOT, timeout=900,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def assert_same_trajectory(run: dict, base: dict, floor: float = 0.0) -> None:
    """Losses equal to 1e-5 relative (below `floor` in size: to 1e-5 * floor absolute)."""
    assert run["steps"] == base["steps"] == list(range(1, 11))
    got, want = np.array(run["loss"]), np.array(base["loss"])
    scale = np.maximum(np.abs(want), floor)
    assert np.all(np.abs(got - want) <= 1e-5 * scale), (run["mesh"], got, want)
    np.testing.assert_allclose(run["grad_norm"], base["grad_norm"], rtol=1e-5,
                               atol=1e-5 * floor, err_msg=run["mesh"])


def assert_ring_on_seq_meshes(runs: list[dict]) -> None:
    """The seq meshes trained with ring attention, the others without any."""
    for run in runs:
        want = "RingAttention" if run["mesh"] in SEQ else "NoneType"
        assert run["ring"] == want, run["mesh"]


def test_sft_on_every_mesh_matches_one_device_and_fsdp_shards_the_state(tmp_path):
    runs = mesh_runs(tmp_path, "sft", *MESHES)
    assert [r["mesh"] for r in runs] == MESHES
    for run in runs[1:]:
        assert_same_trajectory(run, runs[0])
        # The held-out evaluation after step 10, sharded as the training batches are.
        np.testing.assert_allclose(run["eval_loss"], runs[0]["eval_loss"], rtol=1e-5,
                                   err_msg=run["mesh"])
    assert len(runs[0]["eval_loss"]) == 1
    assert_ring_on_seq_meshes(runs)
    one, fsdp4 = runs[0]["device_bytes"], runs[MESHES.index("1,4,1,2")]["device_bytes"]
    print(f"\nparams + optimizer bytes per device: 1 device {one}, fsdp=4 {fsdp4} "
          f"(ratio {one / fsdp4:.2f})")
    # Every array with an `embed` axis (all of them but a few scalars) splits 4 ways.
    assert one / 4 <= fsdp4 <= one / 4 * 1.02
    # Data parallelism (all-reduce mode) keeps a whole copy per device.
    assert runs[MESHES.index("8,1,1,allreduce")]["device_bytes"] == one


def test_dpo_on_every_mesh_matches_one_device(tmp_path):
    """Also covers pair_split: each device / micro-batch keeps chosen rows with their pairs."""
    runs = mesh_runs(tmp_path, "dpo", *MESHES)
    assert [r["mesh"] for r in runs] == MESHES
    for run in runs[1:]:
        assert_same_trajectory(run, runs[0])
    assert_ring_on_seq_meshes(runs)


def test_grpo_on_every_mesh_matches_one_device(tmp_path):
    """kl k1: with k3 (or k2) the first update's gradient is the KL's own roundoff (policy ==
    reference), which Adam scales up to a full step, so the trajectories part at the roundoff
    of each mesh's reduction order, not through any error. The first step's loss is 0 up to
    roundoff (all advantages 0), hence the absolute floor. Of the seq meshes, the one that also
    splits rows over fsdp (SFT and DPO take both)."""
    runs = mesh_runs(tmp_path, "grpo", *MESHES[:2], SEQ[1], "--", "grpo.kl_kind=k1")
    assert [r["mesh"] for r in runs] == MESHES[:2] + SEQ[1:]
    for run in runs[1:]:
        assert_same_trajectory(run, runs[0], floor=1e-3)
    assert_ring_on_seq_meshes(runs)


def test_checkpoint_from_one_mesh_continues_on_others(tmp_path):
    """Saved on (data 2, fsdp 4) at step 5; continued on (1,4), (8,1) and one device. The
    first run and its (1,4) continuation scan their blocks over weights stored stacked and
    sharded (remat full); the checkpoint is per block either way."""
    runs = mesh_runs(tmp_path, "elastic")
    # hone.parallel.replicas: the check the loop runs after every restore finds one device's
    # copy of an array one ulp off.
    assert runs.pop() == {"name": "replicas", "mismatches": ["['bad']"], "replicated": 2}
    straight, resumed = runs[0], runs[1:]
    assert len(resumed) == 3
    for run in resumed:
        assert run["steps"] == list(range(1, 11))
        np.testing.assert_allclose(run["loss"][5:], straight["loss"][5:], rtol=1e-5,
                                   err_msg=run["mesh"])


def test_moe_sft_dpo_and_grpo_with_experts_split_match_one_device(tmp_path):
    """tiny-moe (8 experts, top-2, router losses in the loss) in one process: SFT and GRPO on
    expert 4 x data 2 and expert 2 x fsdp 2 x tp 2, DPO (4 steps) on expert 4 x data 2
    (tests/parallel/mesh_runs.py `moe_meshes`). The experts are split by sharding their stacked
    weights: each device keeps E / expert of them, and no all-gather in the compiled step
    rebuilds them."""
    runs = mesh_runs(tmp_path, "moe")
    collectives = runs.pop()
    sft = [r for r in runs if r["name"] == "moe_sft"]
    dpo = [r for r in runs if r["name"] == "moe_dpo"]
    grpo = [r for r in runs if r["name"] == "moe_grpo"]
    assert [r["mesh"] for r in sft] == ["1,1,1", "2,1,1,e4", "1,2,2,e2"]
    assert [r["mesh"] for r in grpo] == ["1,1,1", "2,1,1,e4", "1,2,2,e2"]
    assert [r["mesh"] for r in dpo] == ["1,1,1", "2,1,1,e4"]
    for run in sft[1:]:
        assert_same_trajectory(run, sft[0])
    # DPO, 4 steps: each chosen row stays with its rejected row when the pairs split over
    # expert x data; the same losses as one device (1e-5 relative).
    assert dpo[0]["steps"] == dpo[1]["steps"] == [1, 2, 3, 4]
    np.testing.assert_allclose(dpo[1]["loss"], dpo[0]["loss"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(dpo[1]["grad_norm"], dpo[0]["grad_norm"], rtol=1e-5, atol=0)
    # The first step's policy loss is 0 up to roundoff; the router losses (coefficients 0.01
    # and 0.001) make the total about 0.02, far above the floor.
    for run in grpo[1:]:
        assert_same_trajectory(run, grpo[0], floor=1e-3)
    assert sft[-1]["loss"][-1] < sft[-1]["loss"][0] - 1.0  # it trains: 5.6 to 3.9 measured
    # Whole experts per device: 8 / 4 on the expert axis; the rows' all-gathers carry tokens
    # (and router logits), never an expert weight.
    assert collectives["expert_full"] == [8, 64, 32] and collectives["expert_shard"] == [2, 64, 32]
    for shape in collectives["all_gather"]:
        dims = [int(x) for x in shape.split(",") if x]
        assert not (len(dims) == 3 and dims[0] in (2, 4, 8)), collectives["all_gather"]
    # Expert 4 x data 2 keeps a quarter of the experts' bytes; the rest is replicated as in
    # data parallelism.
    assert sft[1]["device_bytes"] < sft[0]["device_bytes"] * 0.5
