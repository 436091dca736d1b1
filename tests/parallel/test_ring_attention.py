"""Sequence parallelism (hone/parallel/ring_attention.py, mesh.seq): ring attention equals dense
attention, values and gradients, for every kind of mask, on (seq 4) and (fsdp 2, seq 2, tp 2),
and so does the whole tiny model's forward and backward pass (blocks looped, and scanned with
remat);
the layout splits token arrays over seq, rejects rows seq does not divide, and hands the model
its ring. One subprocess on 8 host devices (tests/parallel/mesh_runs.py ring); the training
trajectories on seq meshes are in test_mesh_parity.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hostenv import host_devices_env

ROOT = Path(__file__).resolve().parents[2]


def test_ring_attention_matches_dense_and_the_layout_splits_tokens(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tests/parallel/mesh_runs.py"), "ring",
                          str(tmp_path)], env=host_devices_env(8), cwd=ROOT, timeout=600,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    # 4 masks x 2 meshes, and the whole tiny model (default positions: a cumsum along the
    # split tokens) relative to its largest value, with its blocks looped and scanned
    assert len(result["errors"]) == 10
    for case, error in result["errors"].items():
        assert error <= 2e-6, (case, error)  # float32 summation order, inputs of size ~1
    # keys and values did travel round the ring on both meshes (no fallback to whole rows)
    assert len(result["permutes"]) == 2 and all(n > 0 for n in result["permutes"].values())
    # rows over the row axes (data, fsdp and expert, each of size 1 or more)
    rows = "('data', 'fsdp', 'expert')"
    assert result["specs"] == {"tokens": f"P({rows}, 'seq')",
                               "loss_mask": f"P({rows}, 'seq')",  # [B, T, 3]
                               "score_index": f"P({rows},)"}  # [B, 2, T]: not tokens
    assert "mesh.seq" in result["error"] and "multiple of mesh.seq" in result["error"]
    assert result["hook"] == "RingAttention"
