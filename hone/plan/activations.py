"""Bytes of what one micro-batch's forward and backward pass hold on a device: the activations
saved for the backward pass under the remat policy, the LM head's logits chunk, the attention
working set, and the weights the step stacks or gathers.

Per device a micro-batch is b = rows / (data x fsdp x grad_accum) rows of t = row_len / seq
tokens; tp splits the heads and the MLP width. Letters as in hone/models/layers.py: D hidden,
F MLP width, N query heads, K kv heads, H head dim, V vocabulary, L blocks, a = bytes of the
compute dtype.

What each remat policy keeps per block (hone/models/transformer.py `remat_policy`,
hone/models/scan_layers.py):
- none: every intermediate of the block (norms, q/k/v before and after rotary, the attention
  output, the MLP's gate/up/product), and with dense attention the [N, T] probabilities of
  each token.
- full (scanned blocks): the block's input only, [b, t, D] per block; one block is recomputed
  at a time in the backward pass, so one block's intermediates are alive on top.
- save_dots: the input plus the outputs of the projections (q, k, v, o, gate, up, down).
- save_attention: the input plus, with blockwise attention, the attention's output (N·H) and
  its float32 log-sum-exp and boolean emptiness per head (5 bytes); with dense attention as
  full (nothing is named there).
- offload: as save_dots, but the dots go to host memory; the device keeps the input.
Remat with the Python loop (train.scan_layers: loop) is counted as none: XLA:CPU ran every
block's recomputation early there and kept it (hone/models/scan_layers.py says why the scan
exists).

The scan reads trained block weights stored stacked (hone/models/stacked.py) as they are, and
stacks the frozen ones inside the step: one copy of those. Trained weights that cannot be
stored stacked (model.train_layers: not every group trains) are stacked in the step too, about
three copies (the stack, its gradient, the backward scan's buffer).

The coefficients below are counts of arrays (each a per-token width in compute-dtype
elements); they were set from the arrays named above and checked against XLA's
memory_analysis() of the compiled step (docs/guides/planning.md, benchmarks/plan_validation.py).
"""

from __future__ import annotations

from hone.models.blockwise import DEFAULT_BLOCK
from hone.plan.inputs import PlanInput, compute_bytes, param_bytes
from hone.plan.weights import block_params, targeted, trainable_params

# Copies of the logits chunk [b, c, V] (float32) alive while the head's loss and its gradient
# run. Supervised and preference losses: the logits and their gradient (the softmax fuses into
# it). GRPO/PPO also take the policy's entropy of each position (log-probabilities and
# probabilities of the chunk, kept with the logits). Distillation: the student's logits and
# gradient, the teacher's logits, and both distributions the divergence compares.
# A reward model's head is a scalar per row: no vocabulary logits at all.
HEAD_COPIES = {"grpo": 4, "ppo": 4, "distill": 5, "reward": 0}
HEAD_COPIES_DEFAULT = 2
# Copies of the [b, N, T, S] attention scores alive in one block's backward pass (scores,
# probabilities, their gradient), float32.
SCORE_COPIES = 3


def micro_rows(p: PlanInput) -> float:
    """Rows of one micro-batch on one device (fractional when the rows do not split)."""
    return p.rows / (p.batch_shards * p.grad_accum)


def tokens(p: PlanInput) -> float:
    return micro_rows(p) * p.row_len / p.seq


def _widths(p: PlanInput, layer: int) -> dict[str, float]:
    """Per-token widths of one block's arrays on a device (tp splits heads and MLP)."""
    a, tp = p.arch, p.tp
    if a.routed(layer):  # k experts per token, each of width F_e, plus the sorted copies of x
        m = a.moe
        mlp = m.num_experts_per_tok * (m.moe_intermediate_size / tp + a.hidden_size)
        mlp += 3 * m.shared_expert_intermediate_size / tp + m.num_experts
    else:
        mlp = a.intermediate_size / tp
    return {"d": a.hidden_size, "q": a.num_heads * a.head_dim / tp,
            "kv": a.num_kv_heads * a.head_dim / tp, "f": mlp, "n": a.num_heads / tp}


def attention_impl(p: PlanInput) -> str:
    """dense or blockwise, as model.attention resolves it for a row (hone/models/attention.py:
    auto is dense while a row fits one block; cudnn/splash keep blockwise's memory order)."""
    if p.attention == "dense" or (p.attention == "auto" and p.row_len <= DEFAULT_BLOCK):
        return "dense"
    return "blockwise"


def _keys(p: PlanInput, layer: int) -> int:
    """Keys each query attends over in block `layer` (a sliding window caps it)."""
    window = None
    if p.arch.layer_types[layer] == "sliding" and p.arch.sliding_window:
        window = p.arch.sliding_window
    return min(p.row_len, window) if window else p.row_len


def block_all(p: PlanInput, layer: int) -> float:
    """Elements per token of every intermediate of one block (what remat none saves): 8 of
    width D (the input, its norm, the attention output before and after o, the residual sum,
    its norm, the MLP output, the block output), 3 of N·H (q before and after rotary, the
    attention's heads), 4 of K·H (k and v before and after rotary), 4 of F (gate, up, the
    activation, the product), and the scores and probabilities of each query, N·T for dense
    attention (a sliding window only masks them) or N softmax statistics for blockwise."""
    w = _widths(p, layer)
    scores = 2 * w["n"] * p.row_len if attention_impl(p) == "dense" else 2 * w["n"]
    return 8 * w["d"] + 3 * w["q"] + 4 * w["kv"] + 4 * w["f"] + scores


def block_dots(p: PlanInput, layer: int) -> float:
    """Elements per token save_dots keeps: input, q, k, v, o, gate, up, down."""
    w = _widths(p, layer)
    return 3 * w["d"] + w["q"] + 2 * w["kv"] + 2 * w["f"]


def block_attention_kept(p: PlanInput, layer: int) -> float:
    """Bytes per token save_attention keeps besides the block's input: blockwise attention's
    output (N·H in the compute dtype) and its statistics (5 bytes per head); 0 with dense."""
    if attention_impl(p) == "dense":
        return 0.0
    w = _widths(p, layer)
    return w["q"] * compute_bytes(p) + w["n"] * 5


def policy(p: PlanInput) -> str:
    """The remat policy the blocks run under: none unless scanned (module docstring)."""
    return p.remat if p.scan else "none"


def backward_layers(p: PlanInput) -> range:
    """The blocks the backward pass runs through: the top model.train_layers, else all (the
    blocks below them only run forward, keeping nothing)."""
    n = p.arch.num_layers
    return range(n - (p.train_layers or n), n)


def saved_activations(p: PlanInput) -> tuple[float, float]:
    """(device bytes, host bytes) of the activations the blocks keep for the backward pass."""
    a, layers = compute_bytes(p), backward_layers(p)
    t = tokens(p)
    if policy(p) == "none":
        return sum(block_all(p, i) for i in layers) * t * a, 0.0
    inputs = len(layers) * p.arch.hidden_size * t * a
    dots = sum(block_dots(p, i) for i in layers) * t * a
    if policy(p) == "save_attention":
        return inputs + sum(block_attention_kept(p, i) for i in layers) * t, 0.0
    return {"full": (inputs, 0.0), "save_dots": (dots, 0.0),
            "offload": (inputs, dots)}[policy(p)]


def recomputed_block(p: PlanInput) -> float:
    """One block's intermediates, recomputed in its backward pass under remat (0 without)."""
    if policy(p) == "none":
        return 0.0
    return max(block_all(p, i) for i in backward_layers(p)) * tokens(p) * compute_bytes(p)


def head_bytes(p: PlanInput) -> float:
    """The LM head's logits chunk and its loss: HEAD_COPIES of [b, c, V] float32, the final
    hidden states and their gradient [b, t, D], and with a trained tied embedding the head's
    own [V, D] gradient, summed into the table's only after the backward pass reaches it."""
    chunk = p.head_len if p.head_chunk <= 0 or p.head_len <= p.head_chunk else p.head_chunk
    arch = p.arch
    # With fsdp > 1 GSPMD runs the head on the rows of the whole fsdp group: the table's embed
    # axis is sharded over fsdp like the rows, and it gathers the activations rather than the
    # [V, D] table (measured: the logits then grow with the fsdp group's rows, not a device's).
    b = p.rows / (p.data * p.grad_accum) if p.fsdp > 1 else micro_rows(p)
    copies = HEAD_COPIES.get(p.command, HEAD_COPIES_DEFAULT)
    logits = copies * b * chunk / p.seq * arch.vocab_size / p.tp * 4
    tied = arch.tie_embeddings and not p.lora_rank and p.train_layers is None
    # The head's gradient of the table is computed from the gathered rows too: whole over
    # fsdp (only tp splits it) until it is reduced into the sharded gradient.
    table = arch.vocab_size * arch.hidden_size * param_bytes(p) / p.tp if tied else 0
    return logits + 2 * tokens(p) * arch.hidden_size * compute_bytes(p) + table


def attention_bytes(p: PlanInput) -> float:
    """One block's attention scores in its backward pass: [b, N, T, S] (dense) or
    [b, N, T, block] (blockwise), SCORE_COPIES float32 copies."""
    b, t = micro_rows(p), p.row_len / p.seq
    n = p.arch.num_heads / p.tp
    keys = max(_keys(p, i) for i in range(p.arch.num_layers))
    width = p.row_len if attention_impl(p) == "dense" else min(keys, DEFAULT_BLOCK)
    return SCORE_COPIES * b * n * t * width * 4


def stacked_weights(p: PlanInput) -> float:
    """Bytes the scan adds: one copy of the frozen blocks' weights, and ~3 of trained ones
    not stored stacked (module docstring); 0 without the scan."""
    if not p.scan:
        return 0.0
    arch = p.arch
    blocks = sum(block_params(arch, i) for i in range(arch.num_layers))
    if p.lora_rank:  # adapters in every block: stored stacked
        unstacked, frozen = 0, blocks
    else:
        trained = min(blocks, trainable_params(p))
        unstacked = 0 if trained >= blocks else trained  # the top blocks only: per block
        frozen = blocks - trained
    return (3 * unstacked + frozen) * param_bytes(p) / (p.fsdp * p.tp)


def dequantized_kernels(p: PlanInput) -> float:
    """QLoRA: each quantized kernel is dequantized to the compute dtype inside its projection
    and kept for the backward pass (x's gradient multiplies by it): every targeted kernel
    without remat, one block's with it."""
    if not p.lora_rank or p.quantize == "none":
        return 0.0
    per_block = [sum(i * o for i, o in targeted(p, layer).values())
                 for layer in range(p.arch.num_layers)]
    count = sum(per_block) if policy(p) == "none" else max(per_block)
    return count * compute_bytes(p) / (p.fsdp * p.tp)


def gathered_weights(p: PlanInput) -> float:
    """With fsdp > 1, GSPMD all-gathers one block's weights (and the LM head's table for its
    matmul) before using them: that block's full tp-shard, twice (forward + backward)."""
    if p.fsdp == 1:
        return 0.0
    arch, pb = p.arch, compute_bytes(p)
    widest = max(block_params(arch, i) for i in range(arch.num_layers))
    return (2 * widest + arch.vocab_size * arch.hidden_size) * pb / p.tp


def activation_lines(p: PlanInput) -> tuple[dict, dict, dict]:
    """Per-device bytes of one training micro-batch: (lines alive through the whole backward
    pass, working sets of which only the larger is alive at once, host-memory lines). The LM
    head's working set peaks before the blocks' backward pass starts, the blocks' after it."""
    device, host = saved_activations(p)
    kept = {f"activations saved (remat {policy(p)})": device}
    if p.scan:
        kept["stacked block weights (scan)"] = stacked_weights(p)
    if p.fsdp > 1:
        kept["all-gathered weights (fsdp)"] = gathered_weights(p)
    if p.quantize != "none" and p.lora_rank:
        kept["dequantized kernels (QLoRA)"] = dequantized_kernels(p)
    working = {"LM head: logits chunk + loss": head_bytes(p),
               f"block backward: recompute + attention ({attention_impl(p)})":
                   recomputed_block(p) + attention_bytes(p)}
    return kept, working, ({"offloaded activations": host} if host else {})
