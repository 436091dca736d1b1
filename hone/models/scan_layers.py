"""Running the transformer's blocks as a `jax.lax.scan` over their stacked weights, so that
gradient checkpointing (train.remat) bounds what the backward pass keeps.

Why: with a Python loop over separately checkpointed blocks, each block's recomputation in the
backward pass depends only on that block's saved input, never on the cotangent flowing down, and
XLA:CPU ran the recomputations of all blocks early: in the compiled step of 4 SmolLM2-135M
blocks at 2k tokens, the peak (the LM head's backward pass, before any block's) held the
recomputed MLP and attention intermediates of every block. Remat "full" kept ~52 KB per token
per block against 2.3 KB for the one hidden state it should keep. A scan's iterations run in
order, one block's recomputation and backward at a time, so what stays alive across the
backward pass is the block inputs the scan saved (at most 2.6 KB per token per block: the
whole step's temporaries grew 79 KB per token from 2k to 8k tokens over 30 blocks).

Design choices:
- The module tree is unchanged (loading, LoRA, quantized storage, sharding rules and every
  public name keep the per-layer blocks). The train state stores the trained block weights
  stacked (hone/models/stacked.py) and hands the stacks to the scan (`give`), which reads them
  as they are: the step neither stacks them nor slices their gradient, and the optimizer
  updates one array per kind of weight, so the compiled step does not grow with depth. Any
  leaf without a stored stack (frozen weights, a model built from per-layer parameters) is
  stacked inside the traced pass (`jnp.stack`); its gradient, if any, flows back through the
  stack (about three copies of those weights in the step).
- Blocks are grouped by period: the smallest p such that block i has the structure (graph
  definition: layer type, adapters, quantized storage) of block i - p for every block of the
  whole groups. A uniform stack scans one block per step (p = 1); Gemma 2's alternating
  sliding/global layers scan pairs, Gemma 3's five sliding + one global scan groups of six.
  Blocks past the last whole group (and every block when fewer than two groups form) run in
  the loop, as before.
- Inside a group each block is checkpointed on its own (`jax.checkpoint` under the remat
  policy), so the scan saves each block's input: the residuals of the loop, in a bounded order.
- The body reads its weights as an `nnx.merge` of one slice of the stack: it may not change a
  module's state (a scan body's state changes would be lost), so blocks holding random streams
  (LoRA dropout) are not scanned; `scannable` says so and the caller keeps the loop.
"""

from __future__ import annotations

import weakref
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

# step(block, x) -> (x, report): one block on the hidden states [B, T, D], and any pytree the
# block reports (a routed MLP's router sums; None when there is nothing to report).
Step = Callable[[nnx.Module, jax.Array], tuple[jax.Array, object]]


# Transformer -> {position j: {block-relative key: [G, ...] array}}: the stacked weights its next
# scan reads instead of stacking its blocks' own (hone.models.stacked.provide). Weak keys: an
# entry lives as long as the model built for one forward pass.
_GIVEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def give(transformer, given: dict[int, dict[str, jax.Array]]) -> None:
    """Let `transformer`'s scan read these stacked weights (hone.models.stacked)."""
    _GIVEN[transformer] = given


def given_to(transformer) -> dict[int, dict[str, jax.Array]] | None:
    return _GIVEN.get(transformer)


def scan_setting(setting: str, remat: str) -> bool:
    """Transformer.scan_layers from train.scan_layers ("auto", "scan", "loop") and
    train.remat: auto scans when the blocks are rematerialised, the case the scan exists for
    (without remat the loop keeps the same activations without stacking the weights)."""
    if setting == "auto":
        return remat != "none"
    return setting == "scan"


def scannable(blocks) -> bool:
    """Can these blocks run as a scan? Not when any holds a random stream (LoRA dropout): a
    scan body may not advance it."""
    return not any(jax.tree.leaves(nnx.state(b, nnx.RngState)) for b in blocks)


def period(graphdefs: list) -> int:
    """The smallest p with at least two whole groups of p blocks in which each block has the
    structure of the block p before it; 0 when there is none (then nothing is scanned)."""
    n = len(graphdefs)
    for p in range(1, n // 2 + 1):
        whole = n // p * p
        if all(graphdefs[i] == graphdefs[i - p] for i in range(p, whole)):
            return p
    return 0


def _stacked_state(states: list, given: dict[str, jax.Array]):
    """One state with leaves [G, ...] from per-block states: a leaf from `given` (stored
    stacked, hone.models.stacked) where it has one, else the blocks' own leaves stacked."""
    flats = [nnx.to_flat_state(s) for s in states]
    leaves = []
    for n, (path, var) in enumerate(flats[0]):
        stored = given.get("/".join(str(part) for part in path))
        if stored is not None and stored.shape[0] == len(states):
            value = stored
        else:
            value = jnp.stack([f[n][1][...] for f in flats])
        leaves.append((path, var.replace(value)))
    return nnx.from_flat_state(leaves)


def run_blocks(blocks, x: jax.Array, step: Step, policy=None,
               given: dict | None = None) -> tuple[jax.Array, list]:
    """x [B, T, D] through every block in order, as `for b in blocks: x, r = step(b, x)` does,
    with whole groups of blocks (see `period`) run as a scan; returns x and each block's report,
    in block order (the scanned ones stacked by the scan, sliced back). policy: the
    jax.checkpoint policy of each block (None = no rematerialisation). given: {position j:
    {key: [G, ...]}}, weights stored stacked (`give`), read instead of the blocks' own."""
    blocks = list(blocks)
    splits = [nnx.split(b) for b in blocks]
    graphdefs = [g for g, _ in splits]

    def pure(graphdef, state, x):
        return step(nnx.merge(graphdef, state), x)

    def remat(prevent_cse: bool):
        if policy is None:
            return pure
        return jax.checkpoint(pure, policy=policy, prevent_cse=prevent_cse, static_argnums=(0,))

    # prevent_cse=False inside the scan: there the recomputation cannot merge with the forward.
    one, loose = remat(False), remat(True)
    p = period(graphdefs)
    groups = len(blocks) // p if p else 0
    reports = []
    if groups:
        given = given if given is not None and max(given, default=-1) < p else {}
        stacked = [_stacked_state([splits[g * p + j][1] for g in range(groups)],
                                  given.get(j, {})) for j in range(p)]

        def body(x, states):  # states: the weights of one group, a block per position
            out = []
            for j in range(p):
                x, report = one(graphdefs[j], states[j], x)
                out.append(report)
            return x, out

        x, stacked_reports = jax.lax.scan(body, x, stacked)  # each report leaf: [groups, ...]
        reports = [jax.tree.map(lambda a, g=g: a[g], stacked_reports[j])
                   for g in range(groups) for j in range(p)]
    for graphdef, state in splits[groups * p:]:  # the ragged tail of the pattern, or all
        x, report = loose(graphdef, state, x)
        reports.append(report)
    return x, reports
