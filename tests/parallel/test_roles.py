"""The RL reference on devices of its own (`grpo/ppo.reference_devices`): on 4 host devices, the
policy on the first 2 (mesh.data=2) and the reference's weights on the last 2 give the losses of
the reference inside the policy's step on the same 2-device policy mesh (1e-5 relative); the
reference's weights are on its devices only, half on each; settings that cannot work are
refused, naming the key, before the run folder is written.

The runs go through a subprocess, since the device count is fixed when JAX starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hone.config import GRPOConfig, PPOConfig, load_config
from hone.errors import InputError

from hostenv import host_devices_env

ROOT = Path(__file__).resolve().parents[2]

RUNS = """
import json, sys
from pathlib import Path
import jax
assert jax.device_count() == 4, jax.devices()
import hone.recipes.grpo as grpo
import hone.recipes.ppo as ppo
from hone.config import GRPOConfig, PPOConfig, load_config
from hone.errors import InputError
from hone.rl.remote_reference import RemoteReference

made = []

class Captured(RemoteReference):  # keeps the reference a run builds, to look at its weights
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        made.append(self)

grpo.RemoteReference = ppo.RemoteReference = Captured
import hone.rl.rollout_devices as rollout_devices
placed = []

class CapturedPlacement(rollout_devices.RolloutPlacement):  # the rollout's own devices
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        placed.append(self)

    def params(self, params):  # the weights a rollout sampled with, as sent
        self.sent = super().params(params)
        return self.sent

rollout_devices.RolloutPlacement = CapturedPlacement
root = Path(sys.argv[1])
RECIPES = {"grpo": (GRPOConfig, grpo.run_grpo), "ppo": (PPOConfig, ppo.run_ppo)}

def devices_of(tree):
    return sorted({d.id for x in jax.tree.leaves(tree) for d in x.devices()})

for spec in sys.argv[2:]:
    algo, name, *overrides = spec.split()
    cls, run = RECIPES[algo]
    cfg = load_config(cls, f"configs/tiny/{algo}.yaml", [
        f"run_dir={root / name}", "log.sinks=[jsonl]", "data.eval_path=null",
        "checkpoint.every_steps=0", "mesh.data=2", *overrides])
    made.clear()
    placed.clear()
    try:
        _, state, _ = run(cfg, log=lambda s: None)
    except InputError as e:
        print(json.dumps({"name": name, "error": e.key, "written": (root / name).exists()}))
        continue
    rows = [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    out = {"name": name, "loss": [r["loss"] for r in rows],
           "kl": [r.get("kl", r.get("kl_seq")) for r in rows],
           "policy_devices": devices_of(state["params"])}
    if placed:
        out["rollout_devices"] = devices_of([placed[0].frozen, placed[0].sent])
        out["frozen_devices"] = devices_of(placed[0].frozen)
    if made:
        weights = made[0].weights
        out["ref_devices"] = devices_of(weights)
        out["ref_bytes"] = [made[0].layout.device_bytes(weights, d) for d in jax.devices()]
        out["ref_total"] = sum(x.nbytes for x in jax.tree.leaves(weights))
    print(json.dumps(out), flush=True)
"""


def role_runs(tmp_path, *specs: str) -> dict[str, dict]:
    """{name: result} of each "ALGO NAME key=value ..." run, on 4 host devices."""
    env = host_devices_env(4)
    out = subprocess.run([sys.executable, "-c", RUNS, str(tmp_path), *specs], env=env,
                         cwd=ROOT, timeout=600, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in results}


def assert_same_run(remote: dict, inside: dict, steps: int, floor: float) -> None:
    """Losses to 1e-5 relative, those below `floor` in size to 1e-5 * floor absolute (GRPO's
    first loss is 0 up to roundoff: its advantages are all 0). The KL metric to 1e-5 absolute:
    it is a difference of log-probabilities of size ~5 that two programs round apart by ~1e-7
    each (PPO's sums 16 tokens of them), so its roundoff is not relative to its own size."""
    got, want = np.array(remote["loss"], float), np.array(inside["loss"], float)
    assert len(got) == len(want) == steps, (got, want)
    scale = np.maximum(np.abs(want), floor)
    assert np.all(np.abs(got - want) <= 1e-5 * scale), (remote["name"], got, want)
    np.testing.assert_allclose(remote["kl"], inside["kl"], rtol=0, atol=1e-5,
                               err_msg=remote["name"])


def assert_on_reference_devices(run: dict) -> None:
    """Policy on devices 0-1; the reference's weights on 2-3 only, split in half (fsdp)."""
    assert run["policy_devices"] == [0, 1]
    assert run["ref_devices"] == [2, 3]
    per_device = run["ref_bytes"]
    assert per_device[0] == per_device[1] == 0
    assert 0 < per_device[2] == per_device[3] <= 0.55 * run["ref_total"], run


def test_grpo_with_the_reference_on_its_own_devices_trains_the_same(tmp_path):
    """GRPO with kl k1 (k3's first gradient is its own roundoff, see test_mesh_parity). PPO's
    reference on its own devices is the next test's EMA case (a copy sent every step covers a
    frozen one, which is sent once)."""
    grpo = "grpo.kl_kind=k1 train.max_steps=3"
    runs = role_runs(tmp_path, f"grpo g0 {grpo}", f"grpo g2 {grpo} grpo.reference_devices=2",
                     "grpo all grpo.reference_devices=4")
    assert_same_run(runs["g2"], runs["g0"], 3, floor=1e-3)
    assert_on_reference_devices(runs["g2"])
    # Every device the reference's: refused before anything is written.
    assert runs["all"] == {"name": "all", "error": "grpo.reference_devices", "written": False}


def test_grpo_with_the_rollout_on_its_own_devices_trains_the_same(tmp_path):
    """The rollout a version behind on devices 2-3 while the update runs on 0-1: the losses of
    the same lagged run with the rollout on the policy's devices. Under LoRA the frozen base is
    placed there once and only the adapters are sent."""
    grpo = "grpo.kl_kind=k1 train.max_steps=3 grpo.max_staleness=1"
    lora = f"{grpo} model.lora.rank=4"
    runs = role_runs(tmp_path, f"grpo r0 {grpo}", f"grpo r2 {grpo} grpo.rollout_devices=2",
                     f"grpo l0 {lora}", f"grpo l2 {lora} grpo.rollout_devices=2",
                     "grpo rall grpo.rollout_devices=4")
    assert_same_run(runs["r2"], runs["r0"], 3, floor=1e-3)
    assert_same_run(runs["l2"], runs["l0"], 3, floor=1e-3)
    for name in ("r2", "l2"):
        assert runs[name]["policy_devices"] == [0, 1]
        assert runs[name]["rollout_devices"] == [2, 3]
    assert runs["l2"]["frozen_devices"] == [2, 3]  # the base, placed once
    assert "rollout_devices" not in runs["r0"]
    assert runs["rall"] == {"name": "rall", "error": "grpo.rollout_devices", "written": False}


def test_ema_reference_sent_each_step_and_adapters_off_reference_train_the_same(tmp_path):
    """PPO's EMA reference changes every step: its weights are transferred to the reference's
    devices before each step. PPO runs without advantage whitening: the tiny model's first
    completions all score the same, so the whitened advantages are roundoff divided by a
    near-zero std, and the last bits of the KL term (1e-9 here, which a separate program is
    free to round differently) decide them; unwhitened, both runs agree to 1e-6. GRPO with LoRA: the reference is the frozen base (adapters
    zeroed) on the reference's devices."""
    ema = "ppo.reference=ema ppo.whiten_advantages=false train.max_steps=3"
    lora = "grpo.kl_kind=k1 model.lora.rank=4 train.max_steps=3"
    runs = role_runs(tmp_path, f"ppo e0 {ema}", f"ppo e2 {ema} ppo.reference_devices=2",
                     f"grpo l0 {lora}", f"grpo l2 {lora} grpo.reference_devices=2")
    assert_same_run(runs["e2"], runs["e0"], 3, floor=1e-3)
    assert_same_run(runs["l2"], runs["l0"], 3, floor=1e-3)
    for name in ("e2", "l2"):
        assert_on_reference_devices(runs[name])


@pytest.mark.parametrize("cls, name, overrides, key", [
    (GRPOConfig, "grpo", ["grpo.beta=0", "grpo.reference_devices=1"], "grpo.reference_devices"),
    (PPOConfig, "ppo", ["ppo.kl_coef=0", "ppo.reference_devices=1"], "ppo.reference_devices"),
])
def test_a_reference_on_its_own_devices_needs_a_kl_term(tmp_path, cls, name, overrides, key):
    with pytest.raises(InputError, match=key):
        load_config(cls, str(ROOT / f"configs/tiny/{name}.yaml"),
                    [f"run_dir={tmp_path / 'run'}", *overrides])
    assert not (tmp_path / "run").exists()
