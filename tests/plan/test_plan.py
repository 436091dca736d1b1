"""hone/plan: the byte model against hand-computed counts, the fit and suggestion logic, the
command line, and two of the validated configs (docs/guides/planning.md) against XLA's
memory_analysis() of hone's compiled SFT step, on a SmolLM2-shaped model cut to 2 blocks."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from hone.models.config import PRESETS
from hone.plan import PlanInput, make_plan, suggestions
from hone.plan.budget import HEADROOM
from hone.plan.rollout_memory import cache_bytes, pool_pages, rollout_lines
from hone.plan.weights import frozen_bytes, lora_params, transfer_bytes, weight_lines

TINY = PRESETS["tiny"]  # V 264, D 64, F 128, L 2, N 4, K 2, H 16, tied


def test_full_training_weights_are_num_params_times_bytes():
    p = PlanInput("sft", TINY)
    lines = weight_lines(p)
    n = TINY.num_params()
    assert lines["parameters (trained)"] == n * 4
    assert lines["gradients"] == n * 4
    assert lines["optimizer state (Adam m, v)"] == 2 * n * 4
    assert lines["parameters (frozen base)"] == 0
    assert lines["reference copy"] == 0
    # accumulation carries a gradient sum beside each micro-batch's; bf16 storage halves all
    assert weight_lines(p.with_(grad_accum=2))["gradients"] == 2 * n * 4
    assert weight_lines(p.with_(param_dtype="bfloat16"))["parameters (trained)"] == n * 2
    # fsdp x tp shard every weight; a DPO copy reference is one more set of trained weights
    sharded = weight_lines(p.with_(fsdp=4, tp=2, command="dpo", reference="copy"))
    assert sharded["parameters (trained)"] == sharded["reference copy"] == n * 4 / 8


@pytest.mark.parametrize("name", ["llama3.1-8b", "gemma3-1b", "qwen3-30b-a3b"])
def test_blocks_and_embeddings_add_up_to_the_model(name):
    from hone.plan.weights import block_params
    a = PRESETS[name]
    embeddings = a.vocab_size * a.hidden_size * (1 if a.tie_embeddings else 2) + a.hidden_size
    blocks = sum(block_params(a, i) for i in range(a.num_layers))
    assert blocks + embeddings == a.num_params()


def test_lora_and_nf4_counts_by_hand():
    p = PlanInput("sft", TINY, lora_rank=8)
    # per block, rank x (in + out): q 64+64, k 64+32, v 64+32, o 64+64, gate/up 64+128,
    # down 128+64
    per_block = 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert lora_params(p) == 2 * per_block
    assert weight_lines(p)["parameters (trained)"] == 2 * per_block * 4
    assert frozen_bytes(p) == TINY.num_params() * 4
    # nf4: the 7 kernels of each block at 0.5625 bytes per weight, the rest in float32
    kernels = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)
    q = p.with_(quantize="nf4")
    assert frozen_bytes(q) == (TINY.num_params() - kernels) * 4 + kernels * 0.5625


def test_kv_cache_by_hand():
    p = PlanInput("grpo", TINY, rollout_rows=16, rollout_len=96, data=2)
    # 2 (k, v) x 8 rows per device x 2 layers x 96 slots x 2 kv heads x 16 x 4 bytes
    assert cache_bytes(p) == 2 * 8 * 2 * 96 * 2 * 16 * 4
    assert cache_bytes(p.with_(cache_dtype="bfloat16")) == cache_bytes(p) / 2
    # The paged engine's pool: 1 trash page + 4 sequences x ceil(96 / 64) pages + 1 page for a
    # forked sample's copy, on one device
    paged = p.with_(engine="paged", max_seqs=4)
    assert pool_pages(paged) == 2 + 4 * 2
    assert cache_bytes(paged) == 2 * 2 * 10 * 64 * 2 * 16 * 4
    assert pool_pages(p.with_(engine="paged")) == 2 + 16 * 2  # max_seqs: every row, at most 64
    assert "10 pages of 64 slots" in next(iter(rollout_lines(paged)))


def test_a_policy_lag_keeps_versions_and_both_phases_at_once():
    p = PlanInput("grpo", TINY, rollout_rows=16, rollout_len=96, lora_rank=4)
    lag = p.with_(staleness=2)
    sync_plan, lag_plan = make_plan(p), make_plan(lag)
    adapters = lora_params(p, range(TINY.num_layers)) * 4  # float32 adapters, in bytes
    assert lag_plan.persistent["policy versions kept (max_staleness)"] == 2 * adapters
    rollout = sum(sync_plan.rollout.values())
    assert lag_plan.peak == sum(lag_plan.persistent.values()) + lag_plan.update_peak + rollout
    assert sync_plan.peak == sum(sync_plan.persistent.values()) + max(sync_plan.update_peak,
                                                                      rollout)
    assert transfer_bytes(lag) == adapters


def test_save_attention_keeps_the_blockwise_output_and_statistics_by_hand():
    from hone.plan.activations import saved_activations
    arch = PRESETS["smollm2-135m"]  # D 576, N 9, H 64, 30 blocks
    full = PlanInput("sft", arch, rows=1, row_len=2048, head_len=2048, remat="full", scan=True)
    kept = full.with_(remat="save_attention")
    # 30 blocks x 2048 tokens x (576 fp32 inputs + 9 x 64 fp32 outputs + 9 x (4 + 1) bytes)
    assert saved_activations(full)[0] == 30 * 2048 * 576 * 4
    assert saved_activations(kept)[0] == 30 * 2048 * (576 * 4 + 576 * 4 + 9 * 5)
    # rows within one block run dense attention, which names nothing: as full
    short = dict(row_len=256, head_len=256)
    assert saved_activations(kept.with_(**short)) == saved_activations(full.with_(**short))


def test_fit_and_smallest_changes():
    p = PlanInput("sft", PRESETS["smollm2-135m"], rows=8, row_len=2048, head_len=2048)
    plan = make_plan(p)
    assert plan.fits(plan.peak / HEADROOM) and not plan.fits(plan.peak / HEADROOM - 1)
    remat = make_plan(p.with_(remat="full", scan=True)).peak
    assert remat < plan.peak
    # a device just big enough for remat full: save_dots does not fit, full is the first fix
    found = suggestions(p, remat / HEADROOM)
    assert found[0] == ("train.remat=full", remat)
    # every suggestion fits, and since one knob suffices none turns two (a knob's settings
    # are single keys, but LoRA with nf4 and fsdp with data are one knob of two keys)
    assert all(peak <= remat for _, peak in found)
    assert all(s.count("=") == 1 or s.startswith(("model.lora", "mesh")) for s, _ in found)
    # a device nothing fits on gets no suggestion
    assert suggestions(p, 1e3) == []


def test_command_line_json(capsys):
    from hone.cli import main
    assert main(["plan", "--preset", "tiny", "--command", "sft", "--seq", "64", "--batch",
                 "4", "--device-memory", "1KB", "--json", "train.remat=full"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 4 and out["row_len"] == 64 and out["fits"] is False
    assert out["persistent"]["parameters (trained)"] == TINY.num_params() * 4
    assert out["device_bytes"] == 1000
    # bad input is an InputError naming what is wrong: exit code 2
    assert main(["plan", "--preset", "no-such-model"]) == 2
    assert "hone plan: error" in capsys.readouterr().err


def test_rows_read_from_configs():
    """Each command's rows, as its recipe lays them out (hone/plan/inputs.py)."""
    from hone.config import COMMANDS, load_config
    from hone.plan import from_config

    def rows(command, *overrides):
        p = from_config(command, load_config(COMMANDS[command], None, list(overrides)))
        return p.rows, p.row_len, p.head_len, p.reference, p.rollout_rows

    # DPO: one [prompt | chosen | rejected] row per pair, a copy reference without LoRA
    assert rows("dpo", "train.batch_size=4", "data.max_length=128") == (4, 256, 256, "copy", 0)
    assert rows("dpo", "train.batch_size=4", "model.lora.rank=8")[3] == "adapters_off"
    # GRPO: one tree row [prompt | 4 samples] per prompt; beta 0 keeps no reference
    assert rows("grpo", "train.batch_size=8", "grpo.group_size=4", "grpo.max_prompt_tokens=32",
                "grpo.max_new_tokens=16") == (2, 32 + 4 * 16, 64, None, 8)
    # agentic GRPO: a row per episode of max_episode_tokens, scored after the opening
    assert rows("grpo", "train.batch_size=8", "grpo.group_size=4", "grpo.max_prompt_tokens=32",
                "agent.environment=hone.agents.tasks:Countdown",
                "agent.max_episode_tokens=96") == (8, 96, 64, None, 8)
    # KTO: each example and its KL row
    assert rows("kto", "train.batch_size=4", "data.max_length=64")[:2] == (8, 64)


def _measured_sft(overrides: list[str]) -> tuple[float, float]:
    """(planned, measured) bytes of hone's compiled SFT step of a 2-block SmolLM2 shape."""
    from flax import nnx

    from hone.bench.rows import train_batch
    from hone.config import SFTConfig, load_config
    from hone.models.transformer import Transformer
    from hone.plan import from_config
    from hone.train.sft_objective import sft_step_loss, target_tokens
    from hone.train.build import compile_steps, make_layout, prepare_for_training
    arch = PRESETS["smollm2-135m"].replace(num_layers=2, layer_types=())
    cfg = load_config(SFTConfig, None, ["mesh.data=1", "train.batch_size=4",
                                        "data.max_length=256"] + overrides)
    model = Transformer(arch, rngs=nnx.Rngs(0))
    trainable = prepare_for_training(model, cfg)
    layout = make_layout(cfg, devices=jax.devices()[:1])
    _, _, frozen, state, step, _ = compile_steps(cfg, model, trainable, sft_step_loss,
                                                 target_tokens, layout=layout)
    batch = train_batch(np.random.default_rng(0), 4, 256, arch.vocab_size)
    m = step.fn.lower(state, frozen, batch).compile().memory_analysis()
    measured = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                + m.temp_size_in_bytes)
    return make_plan(from_config("sft", cfg, arch=arch)).peak, measured


@pytest.mark.parametrize("overrides", [[], ["model.lora.rank=16"]], ids=["full", "lora"])
def test_planner_within_15_percent_of_xla(overrides):
    planned, measured = _measured_sft(overrides)
    assert abs(planned - measured) <= 0.15 * measured, (planned, measured)
