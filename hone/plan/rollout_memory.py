"""Bytes of an RL rollout (GRPO, PPO): the KV cache the sampler fills and the prefill's working
set. The rollout is its own program, run before the update; its arrays are gone when the update
runs, so a step's peak is the larger of the two phases (hone/plan/budget.py), each on top of
the weights and optimizer state that persist across both.

KV cache (hone/sampling/cache.py): per layer a key and a value buffer [B, K, S, H] with
S = prompt + new tokens (a sliding layer keeps at most its window), in grpo.cache_dtype
(auto: the weights' dtype). B is every sampled sequence (prompts x group) split over the batch
axes; tp splits the kv heads. On the paged engine (grpo.engine: paged, and agent episodes)
the cache is the page pool instead (hone/sampling/scheduler.py): 2 + max_seqs x
ceil(len / 64) pages of 64 slots per layer, every layer holding every slot, on one device.
"""

from __future__ import annotations

from hone.plan.inputs import PlanInput, param_bytes
from hone.sampling.pages import default_pool

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


PAGE_SIZE = 64  # the paged engine's default page


def pool_pages(p: PlanInput) -> int:
    """The paged engine's default pool: enough pages for max_seqs sequences of the longest
    length, plus the trash page and the page a sample forked from a waiting group copies (0 on
    the static engine)."""
    if not p.rollout_rows or p.engine != "paged":
        return 0
    seqs = p.max_seqs or min(64, p.rollout_rows)
    return default_pool(seqs, p.rollout_len, PAGE_SIZE)


def cache_bytes(p: PlanInput) -> float:
    """Per-device bytes of the rollout's KV cache (or page pool)."""
    if not p.rollout_rows:
        return 0.0
    arch = p.arch
    each = DTYPE_BYTES.get(p.cache_dtype, param_bytes(p))
    if p.engine == "paged":
        return (2 * len(arch.layer_types) * pool_pages(p) * PAGE_SIZE * arch.num_kv_heads
                * arch.head_dim * each)
    rows = p.rollout_rows / p.batch_shards
    slots = 0
    for kind in arch.layer_types:
        window = arch.sliding_window if kind == "sliding" else None
        slots += min(p.rollout_len, window) if window else p.rollout_len
    return 2 * rows * slots * arch.num_kv_heads / p.tp * arch.head_dim * each


def prefill_bytes(p: PlanInput) -> float:
    """The prefill's largest transient: one block's intermediates over every prompt token
    (no gradient, nothing kept between blocks) and the last position's logits."""
    if not p.rollout_rows:
        return 0.0
    arch = p.arch
    rows = p.rollout_rows / p.batch_shards
    width = 4 * arch.hidden_size + 3 * arch.intermediate_size / p.tp
    each = param_bytes(p)
    return rows * p.rollout_len * width * each + rows * arch.vocab_size / p.tp * 4


def rollout_lines(p: PlanInput) -> dict[str, float]:
    if not p.rollout_rows:
        return {}
    kv = (f"KV page pool (rollout, {pool_pages(p)} pages of {PAGE_SIZE} slots)"
          if p.engine == "paged" else "KV cache (rollout)")
    return {kv: cache_bytes(p), "prefill working set (rollout)": prefill_bytes(p)}
