"""How `hone bench` (and benchmarks/*_hone.py) builds and times the sft, lora, dpo and decode
rows; grpo is hone/bench/grpo.py. Each returns a `Measured`.

Every row runs what the matching command runs, on a model from `hone.load_model(source)` (random
init for a preset such as `smollm2-135m` or `tiny`):
- sft / lora: the step hone/recipes/sft.py wires: the model's `remat` (train.remat),
  `scan_layers` (train.scan_layers at its default, auto: on with remat),
  `attention` and `head_chunk` (model.attention and train.head_chunk at their config defaults,
  as `build_model` sets them), `split_model`, `build_optimizer` (AdamW, constant lr 1e-4, global-norm clipping at 1.0),
  `new_train_state` and `make_train_step(..., sft_step_loss, target_tokens, accum=1,
  precision)`: one jitted, state-donating function doing forward, masked next-token loss,
  gradients, clipping and the update. lora: `apply_lora` rank
  16, alpha 32 on attn q/k/v/o and mlp gate/up/down, only `LoRAParam` trained. Batch: B rows of
  T random ids, all real tokens, the loss on all B x T; the same batch every step.
- dpo: what `run_dpo` wires: `build_model(cfg)`, `compile_steps(cfg, model, nnx.Param,
  make_dpo_loss(cfg, "copy"), pair_count)` and the frozen copy of the initial weights as the
  step's aux; sigmoid DPO, beta 0.1. Batch: B pairs of a P-token prompt + two C-token
  completions in the layout `run_dpo` uses by default: one row [prompt | chosen | rejected] per
  pair (`hone.data.shared_prefix`; `shared_prompt=False`: two rows [2B, P + C], as Tunix and
  PyTorch run it), loss on the completions.
- decode: `hone.generate(model, None, prompts, temperature=0.0, eos_ids=())`: greedy, no EOS, so
  every row runs to M new tokens.

Timing: the first step (trace + compile + run) alone is first_s; median_s is the median of the
next `repeats` steps, each until its outputs are ready (wall clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.bench import flops
from hone.bench.timing import finite, first_and_median

LORA_RANK, LORA_ALPHA = 16, 32.0
LORA_TARGETS = r".*/(attn/(q|k|v|o)|mlp/(gate|up|down))"
# The AdamW settings every implementation in benchmarks/ uses.
OPTIM = SimpleNamespace(lr=1e-4, schedule="constant", warmup_steps=0, max_steps=1000,
                        min_lr_ratio=0.0, max_grad_norm=1.0, b1=0.9, b2=0.999, eps=1e-8,
                        weight_decay=0.01)
DPO_PAD_ID = 2  # SmolLM2's; the batch has no padding


@dataclass
class Measured:
    """One row's measurement; `tokens` is what one step processes (tokens_per_s counts it)."""

    first_s: float  # the first step: trace + compile + run
    median_s: float  # median of the timed steps after it
    tokens: int  # tokens per step
    flops: float  # model FLOPs per step (hone.bench.flops)
    first_loss: float | None = None  # None for decode
    peak_mb: float | None = None  # peak RSS when the row read it; None: read it when reporting
    extra: dict = field(default_factory=dict)  # row-specific fields, e.g. GRPO's phase medians
    series: dict = field(default_factory=dict)  # per-step seconds lists (GRPO)


def quiet(*_):
    pass


def assert_fp32(model, kind=nnx.Param) -> None:
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, kind))}
    assert dtypes == {jnp.dtype(jnp.float32)}, dtypes


def step_remat(graphdef, *states) -> str:
    """The remat setting of the model the step's graphdef rebuilds, i.e. what its program runs
    (the JSON reports this, not the option it was asked for)."""
    return nnx.merge(graphdef, *states).remat


def _timed_steps(one: Callable, repeats: int, log: Callable) -> tuple[float, float, float]:
    """(first_s, median_s, first loss) of a step function returning metrics with "loss"."""
    log(f"timing: 1 first step (trace + compile + run), then {repeats} step(s)")
    first, med, loss0 = first_and_median(one, repeats, wait=jax.block_until_ready,
                                         value=lambda metrics: finite(metrics["loss"]))
    log(f"first step {first:.2f} s, median {med:.4f} s")
    return first, med, loss0


def train_batch(rng: np.random.Generator, b: int, t: int, vocab: int) -> dict:
    """B rows of T random ids (3..V-1) with their random next tokens as targets, all real."""
    ids = rng.integers(3, vocab, size=(b, t + 1))
    ones = np.ones((b, t), np.int32)
    batch = {
        "tokens": ids[:, :-1].astype(np.int32),
        "targets": ids[:, 1:].astype(np.int32),
        "loss_mask": np.ones((b, t), np.float32),
        "attention_mask": ones,
        "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        "segment_ids": ones,
    }
    return {k: jnp.asarray(v) for k, v in batch.items()}


def sft_step(net, seed: int = 0, precision: str = "fp32"):
    """(jitted SFT step, its train state, the frozen state) for a built model with every
    parameter trained: the step `hone sft` runs, with the rows' optimizer (OPTIM)."""
    from hone.train.sft_objective import sft_step_loss, target_tokens
    from hone.train.optimizer import build_optimizer
    from hone.train.state import new_train_state, split_model, train_params
    from hone.train.step import make_train_step
    graphdef, params, frozen = split_model(net, nnx.Param)
    optimizer, schedule = build_optimizer(OPTIM)
    state = new_train_state(train_params(net, params), optimizer, seed)
    step = make_train_step(graphdef, params, sft_step_loss, target_tokens, optimizer, schedule,
                           accum=1, precision=precision)
    return step, state, frozen


def train_row(row: str, model: str = "smollm2-135m", batch: int = 4, seq: int = 128,
              repeats: int = 5, precision: str = "fp32", seed: int = 0, remat: str = "none",
              log: Callable = quiet) -> Measured:
    """One training step, row "sft" (every parameter) or "lora" (adapters only); `remat` is
    the blocks' gradient checkpointing (train.remat's settings)."""
    from hone.config.schema import ModelSection, TrainSection
    from hone.models.lora import LoRAParam, apply_lora
    from hone.models.scan_layers import scan_setting
    from hone.train.sft_objective import sft_step_loss, target_tokens
    from hone.train.optimizer import build_optimizer
    from hone.train.state import flatten, new_train_state, split_model, train_params
    from hone.train.step import make_train_step
    from hone.weights.loading import load_model

    assert row in ("sft", "lora"), row
    log(f"{row}: building {model}, batch {batch} x seq {seq}, {precision}, remat {remat}")
    net = load_model(model, seed=seed)
    assert_fp32(net)
    # As build_model sets them from the config (train.remat, model.attention, train.head_chunk;
    # the last two at their defaults): static, so in the step's graphdef. Without head_chunk the
    # row would form the full [B, T, V] logits that `hone sft` never does past one chunk.
    net.remat = remat
    net.scan_layers = scan_setting(TrainSection().scan_layers, remat)
    net.attention = ModelSection().attention
    net.head_chunk = TrainSection().head_chunk
    cfg, trainable, n_lora = net.config, nnx.Param, None
    if row == "lora":
        apply_lora(net, rank=LORA_RANK, alpha=LORA_ALPHA, targets=LORA_TARGETS,
                   rngs=nnx.Rngs(seed))
        trainable = LoRAParam
    graphdef, params, frozen = split_model(net, trainable)
    built_remat = step_remat(graphdef, params, frozen)
    built = nnx.merge(graphdef, params, frozen)  # what the step's program runs
    settings = {"remat": built_remat, "scan_layers": built.scan_layers,
                "attention": built.attention,
                "head_chunk": built.head_chunk}
    del built
    if row == "lora":
        per_block = flatten(params)
        assert all("lora_" in k for k in per_block) and len(per_block) == 2 * 7 * cfg.num_layers
        n_lora = sum(int(np.prod(x.shape)) for x in per_block.values())
    flat = train_params(net, params)
    optimizer, schedule = build_optimizer(OPTIM)
    state = new_train_state(flat, optimizer, seed)
    step = make_train_step(graphdef, params, sft_step_loss, target_tokens, optimizer, schedule,
                           accum=1, precision=precision)
    data = train_batch(np.random.default_rng(seed), batch, seq, cfg.vocab_size)
    del net, params, flat

    def one():
        nonlocal state
        state, metrics = step(state, frozen, data)
        return metrics

    first, med, loss0 = _timed_steps(one, repeats, log)
    return Measured(first, med, batch * seq, flops.sft_flops(cfg, batch, seq, n_lora), loss0,
                    extra=settings)


def dpo_batch(rng: np.random.Generator, pairs: int, prompt_len: int, completion_len: int,
              vocab: int, shared_prompt: bool = True) -> dict:
    """B random pairs in one of hone's layouts, loss on the C completion tokens of each side:
    [B, P + 2C] shared-prompt rows, or [2B, P + C] rows."""
    from hone.data.preference import Pair, pair_batch, pair_rows
    from hone.data.shared_prefix import shared_rows
    draw = lambda n: rng.integers(3, vocab, size=n).astype(np.int32)  # noqa: E731
    made = [Pair(draw(prompt_len), draw(completion_len), draw(completion_len))
            for _ in range(pairs)]
    if shared_prompt:
        batch = shared_rows(made, DPO_PAD_ID, length=prompt_len + 2 * completion_len,
                            width=completion_len)
        assert batch["score_mask"].sum() == 2 * pairs * completion_len
    else:
        batch = pair_batch(pair_rows(made, prompt_len + completion_len, DPO_PAD_ID))
        assert batch["tokens"].shape == (2 * pairs, prompt_len + completion_len)
        assert batch["loss_mask"].sum() == 2 * pairs * completion_len
    return {k: jnp.asarray(v) for k, v in batch.items()}


def dpo_row(model: str = "smollm2-135m", pairs: int = 4, prompt_len: int = 64,
            completion_len: int = 64, repeats: int = 5, precision: str = "fp32", seed: int = 0,
            shared_prompt: bool = True, remat: str = "none", log: Callable = quiet) -> Measured:
    """One DPO step: policy and frozen-copy reference over 2 x pairs sequences; `remat` is
    train.remat."""
    from hone.config import DPOConfig
    from hone.config.dpo_schema import DPOSection
    from hone.config.schema import ModelSection, TrainSection
    from hone.losses.preference import pair_count
    from hone.train.dpo_objective import make_dpo_loss
    from hone.train.build import build_model, compile_steps

    seq = prompt_len + completion_len
    log(f"dpo: building {model}, {pairs} pairs of {prompt_len} + {completion_len} tokens, "
        f"{precision}, {'shared prompt' if shared_prompt else 'two rows per pair'}, "
        f"remat {remat}")
    cfg = DPOConfig(
        model=ModelSection(source=model, dtype="float32"),
        train=TrainSection(batch_size=pairs, grad_accum=1, lr=1e-4, schedule="constant",
                           weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0,
                           seed=seed, precision=precision, remat=remat),
        dpo=DPOSection(loss_type="sigmoid", beta=0.1, reference="copy",
                       shared_prompt=shared_prompt))
    net, trainable = build_model(cfg, log=quiet)
    assert trainable is nnx.Param
    assert_fp32(net)
    arch = net.config
    graphdef, params, frozen, state, step, _ = compile_steps(cfg, net, trainable,
                                                             make_dpo_loss(cfg, "copy"),
                                                             pair_count)
    built_remat = step_remat(graphdef, params, frozen)  # build_model set it from train.remat
    aux = jax.tree.map(jnp.copy, state["params"])  # the frozen reference, as run_dpo makes it
    data = dpo_batch(np.random.default_rng(seed), pairs, prompt_len, completion_len,
                     arch.vocab_size, shared_prompt)
    del net

    def one():
        nonlocal state
        state, metrics = step(state, frozen, data, aux)
        return metrics

    first, med, loss0 = _timed_steps(one, repeats, log)
    done = (flops.shared_dpo_flops(arch, pairs, prompt_len, completion_len) if shared_prompt
            else flops.dpo_flops(arch, pairs, seq))
    return Measured(first, med, 2 * pairs * seq, done, loss0, extra={"remat": built_remat})


def decode_row(model="smollm2-135m", batch: int = 8, prompt_len: int = 32,
               new_tokens: int = 64, repeats: int = 5, precision: str = "fp32", seed: int = 0,
               log: Callable = quiet) -> Measured:
    """Greedy decode of M new tokens for B random P-token prompts. `model` is a source for
    `hone.load_model` or an already loaded model (to time several batch sizes on one);
    precision bf16 loads the weights in bfloat16."""
    from hone.sampling.generate import generate
    from hone.weights.loading import load_model
    if isinstance(model, str):
        log(f"decode: building {model}, {precision}")
        model = load_model(model, dtype="bfloat16" if precision == "bf16" else "float32",
                           seed=seed)
    if precision == "fp32":
        assert_fp32(model)
    cfg = model.config
    prompts = np.random.default_rng(seed).integers(
        3, cfg.vocab_size, size=(batch, prompt_len)).tolist()

    def run():
        return generate(model, None, prompts, max_new_tokens=new_tokens, temperature=0.0,
                        eos_ids=())

    def check(out):
        lengths = {len(c.tokens) for c in out}
        assert len(out) == batch and lengths == {new_tokens}, f"generated lengths {lengths}"

    log(f"decode: batch {batch}, {prompt_len}-token prompts, {new_tokens} new tokens; timing "
        f"1 first call (compile + run), then {repeats} call(s)")
    first, med, _ = first_and_median(run, repeats, value=check)
    log(f"first call {first:.2f} s, median {med:.4f} s")
    return Measured(first, med, batch * new_tokens,
                    flops.decode_flops(cfg, batch, prompt_len, new_tokens))
