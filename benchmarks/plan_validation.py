"""The memory planner (`hone plan`, hone/plan/) against XLA's own accounting of hone's compiled
train steps on this CPU: prints a markdown table (config, planned, measured, error %).

Measured = the per-device peak of the compiled step, from `step.lower(...).compile()
.memory_analysis()`: argument + output - aliased (the donated state) + temporaries. That is
what the step's program needs at its peak on one device (for a mesh: XLA's partitioned program,
per device), without the allocator's own slack. Planned = `make_plan(...).peak` of the same
settings.

Each step is built with the recipes' own pieces (`prepare_for_training` / `build_model`,
`compile_steps`, the DPO/GRPO losses and scoring, the distillation loss and teacher) on a
SmolLM2-135M-shaped model cut to 4 blocks (the teacher: 8), registered as presets here so the
configs name them like any other; GRPO's figure is its update program (the rollout's program
holds less: its KV cache is 1.3 MB here). The driver forces 8 host devices for the meshes;
single-device rows use a one-device mesh.

    nice -n 5 .venv/bin/python benchmarks/plan_validation.py           # every row
    nice -n 5 .venv/bin/python benchmarks/plan_validation.py sft-full dpo
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# This checkout's hone, not whichever the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hone.models.config import PRESETS, MoE  # noqa: E402

STUDENT, TEACHER, ROUTED = "plan-smollm2-4l", "plan-smollm2-8l", "plan-moe-4l"
PRESETS.setdefault(STUDENT, PRESETS["smollm2-135m"].replace(num_layers=4, layer_types=()))
PRESETS.setdefault(TEACHER, PRESETS["smollm2-135m"].replace(num_layers=8, layer_types=()))
# The same 4 blocks with Qwen3-MoE-style routed MLPs: 8 experts of width 384, top 2.
PRESETS.setdefault(ROUTED, PRESETS[STUDENT].replace(
    family="qwen3_moe", moe=MoE(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=384)))

B, T = 4, 512  # rows x tokens of the supervised rows
COMMON = [f"model.source={STUDENT}", "mesh.data=1"]

# name -> (command, overrides); every row's shapes are small enough to compile in < 1 minute.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "sft-full": ("sft", [f"train.batch_size={B}", f"data.max_length={T}"]),
    "sft-full-remat": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                               "train.remat=full"]),
    "sft-save-attention": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                                   "train.remat=save_attention"]),
    "sft-lora": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                         "model.lora.rank=16"]),
    "sft-qlora": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                          "model.lora.rank=16", "model.lora.quantize=nf4"]),
    "sft-top2": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                         "model.train_layers=2"]),
    "dpo": ("dpo", ["train.batch_size=4", "data.max_length=256"]),
    "grpo": ("grpo", ["train.batch_size=8", "grpo.group_size=4", "grpo.max_prompt_tokens=64",
                      "grpo.max_new_tokens=128", "grpo.beta=0.04"]),
    "distill": ("distill", [f"train.batch_size={B}", f"data.max_length={T}",
                            f"teacher.source={TEACHER}"]),
    "sft-fsdp8": ("sft", ["train.batch_size=8", f"data.max_length={T}", "mesh.fsdp=8",
                          "train.remat=full"]),
    "sft-fsdp8-noremat": ("sft", ["train.batch_size=8", f"data.max_length={T}",
                                  "mesh.fsdp=8"]),
    "sft-data2-fsdp4": ("sft", ["train.batch_size=8", f"data.max_length={T}", "mesh.data=2",
                                "mesh.fsdp=4"]),
    "sft-data8": ("sft", ["train.batch_size=8", f"data.max_length={T}", "mesh.data=8"]),
}

# Measured only when named: XLA:CPU lowers the routed MLP's ragged_dot to a masked product over
# every expert (hone/models/moe.py), so the CPU keeps per-expert intermediates a grouped matmul
# on a GPU or TPU does not; the plan counts the grouped path's arrays (-20% here, 2026-12-02).
EXTRA: dict[str, tuple[str, list[str]]] = {
    "sft-moe": ("sft", [f"train.batch_size={B}", f"data.max_length={T}",
                        f"model.source={ROUTED}"]),
}


def sft_batch(rows: int, length: int, vocab: int) -> dict:
    from hone.bench.rows import train_batch
    return train_batch(np.random.default_rng(0), rows, length, vocab)


def _measure(step, *args) -> int:
    m = step.lower(*args).compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)


def measure_supervised(command: str, cfg) -> int:
    """sft and distill steps as their recipes compile them, on random rows."""
    from hone.train.build import build_model, compile_steps, make_layout
    layout = make_layout(cfg)
    length, rows = cfg.data.max_length, cfg.train.batch_size
    if command == "sft":
        from hone.recipes.sft import sft_step_loss, target_tokens
        model, trainable = build_model(cfg, layout=layout)
        _, _, frozen, state, step, _ = compile_steps(cfg, model, trainable, sft_step_loss,
                                                     target_tokens, layout=layout)
        batch = layout.place_batch(sft_batch(rows, length, model.config.vocab_size))
        return _measure(step.fn, state, frozen, batch)
    if command == "distill":
        from hone.distill.loss import make_distill_loss, normalizer
        from hone.distill.student import build_student, layer_maps, load_teacher
        tgraph, tstate, tconfig = load_teacher(cfg)
        student, trainable = build_student(cfg, tconfig.hidden_size)
        maps = layer_maps(cfg, student.config.num_layers, tconfig.num_layers)
        loss = make_distill_loss(cfg, tgraph, maps, None)
        _, _, frozen, state, step, _ = compile_steps(cfg, student, trainable, loss, normalizer,
                                                     layout=layout)
        batch = layout.place_batch(sft_batch(rows, length, tconfig.vocab_size))
        return _measure(step.fn, state, frozen, batch, layout.place_state(tstate))
    raise ValueError(command)


def measure_dpo(cfg) -> int:
    from hone.bench.rows import dpo_batch
    from hone.losses.preference import pair_count
    from hone.recipes.dpo import make_dpo_loss
    from hone.train.build import build_model, compile_steps, make_layout
    layout = make_layout(cfg)
    model, trainable = build_model(cfg, layout=layout)
    _, _, frozen, state, step, _ = compile_steps(cfg, model, trainable,
                                                 make_dpo_loss(cfg, "copy"), pair_count,
                                                 layout=layout)
    aux = jax.tree.map(jnp.copy, state["params"])
    length = cfg.data.max_length
    # [prompt | chosen | rejected] rows of 2 x max_length tokens, the planner's row
    batch = dpo_batch(np.random.default_rng(0), cfg.train.batch_size, length // 2,
                      3 * length // 4, model.config.vocab_size)
    return _measure(step.fn, state, frozen, batch, aux)


def measure_grpo(cfg) -> int:
    """The update program of `run_grpo` (tree rows, beta > 0: a copy reference scored in it)."""
    from hone.losses.rl import policy_loss_denominator
    from hone.recipes.grpo import make_grpo_loss, make_scoring
    from hone.rl.rollout import Samples, pack_tree_rows
    from hone.rl.step import make_rl_step
    from hone.sampling.generate import Completion
    from hone.train.build import build_model
    from hone.train.optimizer import rl_optimizer
    from hone.train.reference import reference_mode
    from hone.train.state import flatten, new_train_state, split_model
    g = cfg.grpo
    model, trainable = build_model(cfg)
    mode = reference_mode(cfg)
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = rl_optimizer(cfg.train, g.iterations)
    state = new_train_state(flatten(params), optimizer, cfg.train.seed)
    aux = jax.tree.map(jnp.copy, state["params"])
    step = make_rl_step(
        graphdef, params, make_grpo_loss(cfg),
        lambda b: policy_loss_denominator(b["loss_mask"], g.loss_agg, max_len=g.max_new_tokens),
        optimizer, schedule, accum=cfg.train.grad_accum, precision=cfg.train.precision,
        epochs=g.iterations, score=make_scoring(cfg, graphdef, params, mode))
    rng = np.random.default_rng(0)
    v, groups = model.config.vocab_size, cfg.train.batch_size // g.group_size
    prompts = [rng.integers(1, v, g.max_prompt_tokens).tolist() for _ in range(groups)]
    done = [Completion(None, rng.integers(1, v, g.max_new_tokens).tolist(),
                       [-1.0] * g.max_new_tokens) for _ in range(cfg.train.batch_size)]
    samples = Samples([p for p in prompts for _ in range(g.group_size)], [""] * len(done),
                      done, {}, g.group_size)
    rows = pack_tree_rows(samples, g.max_prompt_tokens, g.max_new_tokens, 0)
    rows["advantages"] = rng.standard_normal((groups, g.group_size)).astype(np.float32)
    return _measure(step, state, frozen, rows, aux)


def measure(name: str) -> tuple[int, float]:
    """(measured bytes, planned bytes) of one row of CONFIGS."""
    from hone.config import COMMANDS, load_config
    from hone.plan import from_config, make_plan
    command, overrides = {**CONFIGS, **EXTRA}[name]
    cfg = load_config(COMMANDS[command], None, COMMON + overrides)
    devices = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tp * cfg.mesh.seq  # all fixed here
    planned = make_plan(from_config(command, cfg, devices=devices)).peak
    if command in ("sft", "distill"):
        got = measure_supervised(command, cfg)
    elif command == "dpo":
        got = measure_dpo(cfg)
    else:
        got = measure_grpo(cfg)
    return got, planned


def main(names: list[str]) -> None:
    print("| config | planned MiB | measured MiB | error |")
    print("|---|---:|---:|---:|")
    for name in names or list(CONFIGS):
        got, planned = measure(name)
        err = 100 * (planned - got) / got
        print(f"| {name}: {' '.join({**CONFIGS, **EXTRA}[name][1])} | {planned / 2**20:.0f} | "
              f"{got / 2**20:.0f} | {err:+.1f}% |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
