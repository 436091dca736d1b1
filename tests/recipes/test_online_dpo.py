"""`hone dpo` with dpo.online on the tiny preset: the judge's pairing (chosen = best, ties
skipped and counted), the update (the micro-batch split never changes it; a batch without a
usable pair leaves the weights alone), a run that learns and resumes exactly after SIGTERM, and
bad configs that exit 2 naming the key."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import rl_toy_rewards
from hone.cli import main
from hone.config import DPOConfig, load_config
from hone.models.config import PRESETS
from hone.models.transformer import Transformer
from hone.recipes.online_dpo import make_online_loss, make_online_step, run_online_dpo
from hone.rl.judge_pairs import pair_samples, pick_pairs
from hone.rl.rollout import Samples, pack_tree_rows
from hone.sampling.generate import Completion
from hone.train.loop import Interrupted
from hone.train.state import flatten, new_train_state, split_model

ROOT = Path(__file__).resolve().parents[2]
ONLINE = str(ROOT / "configs/tiny/online_dpo.yaml")
QUIET = dict(log=lambda s: None)


def rows(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_pairs_take_the_best_against_the_worst_and_skip_ties():
    # 4 prompts x 2 samples: a clear pair each way, a tie, and a tie at a non-zero score.
    pairs = pick_pairs([0.2, 0.7, 1.0, -0.5, 0.3, 0.3, -1.0, -1.0], 2)
    assert pairs.chosen.tolist() == [1, 0, 0, 0] and pairs.rejected.tolist() == [0, 1, 0, 0]
    assert pairs.usable.tolist() == [True, True, False, False]
    assert pairs.margin == pytest.approx([0.5, 1.5, 0.0, 0.0])
    assert pairs.metrics() == pytest.approx(
        {"judge_margin": 1.0, "usable_pairs": 2.0, "skipped_pairs": 2.0})  # (0.5 + 1.5) / 2
    # Groups of 3: best against worst (first of equals); all-equal and NaN groups skipped.
    pairs = pick_pairs([1, 3, 3, 2, 0, 2, 5, 5, 5, 1, np.nan, 4], 3)
    assert pairs.chosen.tolist()[:2] == [1, 0] and pairs.rejected.tolist()[:2] == [0, 1]
    assert pairs.usable.tolist() == [True, True, False, False]
    assert pairs.metrics() == pytest.approx(
        {"judge_margin": 2.0, "usable_pairs": 2.0, "skipped_pairs": 2.0})
    # No usable pair at all: margin 0, every prompt counted as skipped.
    assert pick_pairs([1.0, 1.0], 2).metrics() == {"judge_margin": 0.0, "usable_pairs": 0.0,
                                                   "skipped_pairs": 1.0}
    # The paired samples: chosen first, then rejected, each with its own prompt and columns.
    c = [Completion(f"{i}", [10 + i], [-0.1 * i]) for i in range(6)]
    samples = Samples([[1]] * 3 + [[2]] * 3, ["a"] * 3 + ["b"] * 3, c,
                      {"answer": ["x"] * 3 + ["y"] * 3}, 3)
    paired = pair_samples(samples, pick_pairs([0, 2, 1, 5, 4, 3], 3))
    assert paired.texts == ["1", "0", "3", "5"] and paired.group_size == 2
    assert paired.columns["answer"] == ["x", "x", "y", "y"] and paired.prompt_ids[2] == [2]


@pytest.fixture(scope="module")
def tiny_update():
    """A one-layer tiny model and a batch of 4 prompts' pairs as the recipe lays them out
    ([prompt | chosen | rejected] rows), built once."""
    cfg = load_config(DPOConfig, ONLINE, ["train.batch_size=4"])
    arch = dataclasses.replace(PRESETS["tiny"], num_layers=1, layer_types=("global",))
    graphdef, params, frozen = split_model(Transformer(arch, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 200, size=n)) for n in (5, 7, 4, 6)]
    comps = [Completion("", list(rng.integers(3, 200, size=n)), list(-rng.random(n)))
             for n in (3, 5, 2, 4, 6, 1, 4, 4)]
    samples = Samples([p for p in prompts for _ in range(2)], [""] * 8, comps, {}, 2)
    return (cfg, graphdef, params, frozen), pack_tree_rows(samples, 8, 6, 0)


def _steps(tiny_update):
    """Steps with 1 and 2 micro-batches, a copied reference, and plain SGD at 1e4 (the update
    is the gradient, far above the weights' rounding; tests/grpo_sgd.py says why not Adam)
    after a weight decay, which moves the weights even on zero gradients."""
    (cfg, graphdef, params, frozen), _ = tiny_update
    opt = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(1e4))
    steps = {accum: make_online_step(cfg, graphdef, params, make_online_loss(cfg, "copy"), opt,
                                     optax.constant_schedule(1e4), accum, None)
             for accum in (1, 2)}
    return opt, steps


def _update(tiny_update, opt, step, valid):
    """(train state before, after, metrics) of one step."""
    (cfg, graphdef, params, frozen), batch = tiny_update
    state = new_train_state(flatten(params), opt, 0)
    before = jax.tree.map(np.asarray, state)
    aux = jax.tree.map(jnp.copy, state["params"])
    new, metrics = step(state, frozen, dict(batch, pair_valid=np.asarray(valid, np.float32)),
                        aux)
    return before, jax.tree.map(np.asarray, new), jax.device_get(metrics)


def test_update_is_the_same_for_any_micro_batch_split_and_withheld_without_pairs(tiny_update):
    opt, steps = _steps(tiny_update)
    valid = [1, 0, 1, 1]  # pair 1 is a tie: it must not count
    before, one, m1 = _update(tiny_update, opt, steps[1], valid)
    _, two, m2 = _update(tiny_update, opt, steps[2], valid)
    assert m1["pairs"] == m2["pairs"] == 3 and m1["update_skipped"] == 0
    # At the starting weights the policy is its reference: every pair's loss is log 2.
    assert m1["loss"] == pytest.approx(np.log(2.0), abs=1e-6)
    assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-6)
    for k in one["params"]:
        d1, d2 = one["params"][k] - before["params"][k], two["params"][k] - before["params"][k]
        assert np.max(np.abs(d1)) > 0, k
        assert np.max(np.abs(d1 - d2)) <= 1e-6 * np.max(np.abs(d1)), k
    # No usable pair: the weights and the optimizer state stay bit for bit (the weight decay
    # alone would have moved them); the step counter moves on.
    before, none, m0 = _update(tiny_update, opt, steps[1], [0, 0, 0, 0])
    assert m0["update_skipped"] == 1 and m0["loss"] == 0 and int(none["step"]) == 1
    for a, b in zip(jax.tree.leaves(none["params"]) + jax.tree.leaves(none["opt_state"]),
                    jax.tree.leaves(before["params"]) + jax.tree.leaves(before["opt_state"])):
        assert np.array_equal(a, b)


# The judge: the tiny config's (length penalty + answer match) and a stop_signal function of
# weight 0 (a SIGTERM from inside a rollout, as a preemption would land). 4 samples per prompt
# (best against worst): fewer prompts tie than with the config's 2, so 6 steps are enough.
RUN = ["train.max_steps=6", "train.eval_every=6", "dpo.group_size=4", "dpo.eval_prompts=8",
       "checkpoint.every_steps=100", "log.sinks=[jsonl]",
       "rewards.functions=[rl_toy_rewards:stop_signal]", "rewards.function_weights=[0.0]"]


def test_tiny_online_dpo_learns_and_resumes_exactly_after_sigterm(tmp_path):
    rl_toy_rewards.STOP_ON_CALL.update(at=None, calls=0)
    cfg = load_config(DPOConfig, ONLINE, [f"run_dir={tmp_path / 'straight'}", *RUN])
    _, straight, _ = run_online_dpo(cfg, **QUIET)
    start, *m = rows(tmp_path / "straight")
    assert len(m) == 6 and int(straight["step"]) == 6
    # The random model writes all 16 tokens greedily; the judge prefers shorter ones, and
    # after 6 steps the greedy answers stop early (measured: 16 -> 1 token, reward -0.16 ->
    # -0.01).
    assert start["eval_completion_len"] == 16 and m[-1]["eval_completion_len"] < 8
    assert m[-1]["eval_reward"] > start["eval_reward"] + 0.05
    assert all(r["usable_pairs"] + r["skipped_pairs"] == 8 for r in m)
    assert all(r["judge_margin"] > 0 for r in m if r["usable_pairs"])
    assert max(r["sampler_gap"] for r in m) < 1e-5  # fp32 sampler and trainer agree
    assert all(k in m[-1] for k in ("rewards_chosen", "rewards_rejected", "margin", "accuracy",
                                    "kl", "reward_mean", "update_skipped", "rollout_s"))

    rl_toy_rewards.STOP_ON_CALL.update(at=4, calls=0)  # the start's eval, then step 3's rollout
    cfg = load_config(DPOConfig, ONLINE, [f"run_dir={tmp_path / 'stopped'}", *RUN])
    with pytest.raises(Interrupted):
        run_online_dpo(cfg, **QUIET)
    assert (tmp_path / "stopped" / "checkpoints" / "3").exists()
    _, resumed, _ = run_online_dpo(cfg, **QUIET)
    drop = ("rollout_s", "update_s", "tokens_per_s", "step_s")
    clean = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]  # noqa: E731
    assert clean(rows(tmp_path / "stopped")) == clean(rows(tmp_path / "straight"))
    for k in straight["params"]:
        assert np.array_equal(np.asarray(straight["params"][k]), np.asarray(resumed["params"][k]))


@pytest.mark.parametrize("config,override,key", [
    (ONLINE, "dpo.loss_type=simpo", "dpo.loss_type"),
    (ONLINE, "dpo.reference=precomputed", "dpo.reference"),
    (ONLINE, "data.path=builtin:arithmetic-pref", "data.path"),  # pairs, no `answer` to judge
    (str(ROOT / "configs/tiny/dpo.yaml"), "dpo.max_new_tokens=8", "dpo.max_new_tokens"),
    (str(ROOT / "configs/tiny/dpo.yaml"), "rewards.length=1.0", "rewards.length"),
])
def test_inconsistent_online_settings_exit_2_naming_the_key(config, override, key, tmp_path,
                                                            capsys):
    assert main(["dpo", "--config", config, f"run_dir={tmp_path}", override]) == 2
    assert key in capsys.readouterr().err
