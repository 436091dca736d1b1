"""Reward functions: built-ins by hand-computed values, the weighted sum, protection against
functions that raise, hang or return garbage, spec errors naming their key, and the reward-model
scorer against the model itself (compiled once per bucket)."""

import math
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.errors import InputError
from hone.models.config import PRESETS
from hone.models.reward import RewardModel
from hone.models.transformer import Transformer
from hone.rl import reward_model_scorer
from hone.rl.rewards import (answer_match, build_rewards, format_match, length_penalty,
                             overlong_penalty)
from hone.tokenizer import Tokenizer
from hone.weights.hf_reward import save_reward_model

PROMPTS = ["q1", "q2", "q3", "q4"]
COMPLETIONS = ["3 + 4 = 7. The answer is 7.", "The answer is 8.", "I think 12", "no idea"]
COLUMNS = {"answer": ["7", "9", "12", "5"]}
TOKENS = [80, 90, 100, 150]


def call(fn, completions=COMPLETIONS, tokens=TOKENS):
    return fn(prompts=PROMPTS, completions=completions, completion_tokens=tokens, **COLUMNS)


def score(rewards, completions=COMPLETIONS, tokens=TOKENS):
    return rewards(PROMPTS, completions, COLUMNS, tokens)


def quiet():
    lines = []
    return lines, lines.append


def test_builtins_by_hand():
    assert call(answer_match()) == [1.0, 0.0, 1.0, 0.0]
    assert call(answer_match(correct=2.0, wrong=-1.0)) == [2.0, -1.0, 2.0, -1.0]
    assert call(format_match(r"answer is \d+\.$")) == [1.0, 1.0, 0.0, 0.0]
    # search with DOTALL: "." crosses lines; anchors still ask for the whole text.
    assert call(format_match(r"<think>.*</think>", score=0.5),
                completions=["<think>a\nb</think> 4", "x <think>a</think>", "<think>", ""]) == \
        [0.5, 0.5, 0.0, 0.0]
    assert call(length_penalty(85, per_token=-0.01)) == pytest.approx([0.0, -0.05, -0.15, -0.65])
    # max 100, cache 20: free up to 80, then (80 - L) / 20 down to -1 at 100, -1 beyond.
    assert call(overlong_penalty(100, 20)) == pytest.approx([0.0, -0.5, -1.0, -1.0])
    assert call(overlong_penalty(100, 20), tokens=[0, 81, 99, 101]) == \
        pytest.approx([0.0, -0.05, -0.95, -1.0])


def test_weighted_sum_and_per_function():
    lines, log = quiet()
    rewards = build_rewards([
        {"name": "answer_match", "weight": 1.0},
        {"name": "format", "pattern": r"The answer is", "weight": 0.2},
        {"name": "overlong", "max_tokens": 100, "cache_tokens": 20, "weight": 0.5},
        {"name": "format", "pattern": r"\d"}], log=log)
    assert rewards.names == ["answer_match", "format", "overlong", "format_2"]
    result = score(rewards)
    np.testing.assert_allclose(result.per_function["answer_match"], [1, 0, 1, 0])
    np.testing.assert_allclose(result.per_function["format"], [1, 1, 0, 0])
    np.testing.assert_allclose(result.per_function["overlong"], [0, -0.5, -1, -1])
    np.testing.assert_allclose(result.total, [2.2, 0.95, 1.5, -0.5], rtol=1e-6)
    assert result.total.dtype == np.float32 and result.total.shape == (4,)
    assert all(v.dtype == np.float32 for v in result.per_function.values())
    assert set(result.events.values()) == {0} and "reward_errors/format_2" in result.events
    assert lines == []


def raises(completions, **kw):
    raise RuntimeError("boom")


def sleeps(completions, **kw):
    time.sleep(5)
    return [1.0] * len(completions)


def wrong_length(completions, **kw):
    return [1.0]


def one_nan(completions, **kw):
    return [1.0, math.nan, "high", None]  # None: does not apply (TRL) -> 0


def fine(completions, **kw):
    return np.arange(len(completions), dtype=np.float32)  # arrays are accepted


def test_failures_fall_back_and_are_counted():
    lines, log = quiet()
    rewards = build_rewards([
        {"name": raises, "fallback": -1.0}, {"name": sleeps, "timeout_s": 0.2},
        {"name": wrong_length, "fallback": 0.5}, one_nan, {"name": fine, "weight": 2.0}],
        fallback=-0.25, log=log)
    start = time.monotonic()
    result = score(rewards)
    assert time.monotonic() - start < 4  # the sleeper is abandoned, not awaited
    per = result.per_function
    np.testing.assert_array_equal(per["raises"], [-1.0] * 4)
    np.testing.assert_array_equal(per["sleeps"], [-0.25] * 4)
    np.testing.assert_array_equal(per["wrong_length"], [0.5] * 4)
    np.testing.assert_array_equal(per["one_nan"], [1.0, -0.25, -0.25, 0.0])
    np.testing.assert_array_equal(per["fine"], [0, 1, 2, 3])
    np.testing.assert_allclose(result.total, -1 - 0.25 + 0.5 + per["one_nan"] + 2 * per["fine"])
    ev = result.events
    assert (ev["reward_errors"], ev["reward_timeouts"], ev["reward_invalid"]) == (2, 1, 2)
    assert ev["reward_errors/raises"] == ev["reward_errors/wrong_length"] == 1
    assert ev["reward_timeouts/sleeps"] == 1 and ev["reward_invalid/one_nan"] == 2
    assert ev["reward_errors/fine"] == ev["reward_invalid/fine"] == 0
    assert len(lines) == 4
    assert "RuntimeError: boom" in lines[0] and "timeout" in lines[1]
    assert "1 values for 4" in lines[2] and "2 of 4" in lines[3]


def test_functions_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(completions, completion_tokens, **kw):\n"
        "    return [-n / 100 for n in completion_tokens]\n"
        "class Holder:\n"
        "    @staticmethod\n"
        "    def first_prompt(prompts, completions, answer, **kw):\n"
        "        return [float(a == '7') for a in answer]\n"
        "VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = build_rewards([{"name": "my_rewards:brevity", "weight": 2.0},
                             {"name": "my_rewards:Holder.first_prompt"}])
    result = score(rewards)
    np.testing.assert_allclose(result.per_function["my_rewards:brevity"], [-0.8, -0.9, -1, -1.5])
    np.testing.assert_allclose(result.per_function["my_rewards:Holder.first_prompt"], [1, 0, 0, 0])
    np.testing.assert_allclose(result.total, [-0.6, -1.8, -2, -3])
    for name, says in [("no_such_module_x:f", "cannot import"), ("my_rewards:nope", "no 'nope'"),
                       ("my_rewards:VALUE", "not a function")]:
        with pytest.raises(InputError, match=rf"'rewards\[1\]\.name'.*{says}"):
            build_rewards([{"name": "answer_match"}, {"name": name}])


@pytest.mark.parametrize("spec, key, says", [
    ({"name": "nope"}, "rewards[0].name", "unknown reward 'nope'"),
    ({"weight": 1.0}, "rewards[0].name", "reward name"),
    ({"name": "format"}, "rewards[0].pattern", "needs this key"),
    ({"name": "format", "pattern": "(unclosed"}, "rewards[0].pattern", "regular expression"),
    ({"name": "format", "pattern": "x", "scor": 1}, "rewards[0].scor", "unknown key"),
    ({"name": "answer_match", "weight": "high"}, "rewards[0].weight", "a number"),
    ({"name": "answer_match", "timeout_s": 0}, "rewards[0].timeout_s", "> 0"),
    ({"name": "length", "target_tokens": 1.5}, "rewards[0].target_tokens", "integer"),
    ({"name": "overlong", "max_tokens": 10, "cache_tokens": 20}, "rewards[0].cache_tokens", "<="),
    ({"name": "json:dumps", "x": 1}, "rewards[0].x", "unknown key"),
    ({"name": "reward_model", "path": "/no/such/dir"}, "rewards[0].path", "no such"),
])
def test_spec_errors_name_the_key(spec, key, says):
    with pytest.raises(InputError, match=says) as err:
        build_rewards([spec])
    assert err.value.key == key


def test_spec_list_and_columns_checked():
    with pytest.raises(InputError, match="non-empty list"):
        build_rewards([])
    rewards = build_rewards([{"name": "format", "pattern": "x"},
                             {"name": "answer_match", "column": "solution"}], key="grpo.rewards")
    rewards.check_columns(["answer", "solution"])
    with pytest.raises(InputError, match="column 'solution'") as err:
        rewards.check_columns(["answer"])
    assert err.value.key == "grpo.rewards[1].column"


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory):
    model = RewardModel(Transformer(PRESETS["tiny"], dtype=jnp.float32, rngs=nnx.Rngs(0)),
                        rngs=nnx.Rngs(1))
    model.head.kernel[...] = jnp.asarray(np.random.default_rng(0).normal(size=(64, 1)),
                                       jnp.float32)  # spread scores well apart from zero
    folder = save_reward_model(model, tmp_path_factory.mktemp("rm") / "rm",
                               tokenizer=Tokenizer.byte_level())
    return model, folder


def test_reward_model_scores_match_the_model_and_compile_once(tiny_reward_model):
    model, folder = tiny_reward_model
    lines, log = quiet()
    rewards = build_rewards([{"name": "reward_model", "path": str(folder), "batch_size": 4,
                              "max_length": 64}], log=log)
    tok = Tokenizer.byte_level()
    prompts = ["<|im_start|>user\n3 + 4?<|im_end|>\n<|im_start|>assistant\n", "Ben has 5 coins.",
               "12 - 2 =", "Tom", "Anna has 7 books and buys 2 more."]
    completions = ["The answer is 7.", " He gives 2 away.", " 10", " and Leo", " She has 9."]

    forward = nnx.jit(lambda m, tokens: m(tokens))  # RewardModel.__call__, unpadded [1, T]

    def expected(ps, cs):
        return [float(forward(model, np.asarray([tok.encode(p + c)], np.int32))[0])
                for p, c in zip(ps, cs)]

    reward_model_scorer.score_batch.clear_cache()  # other tests in this process traced it
    before = reward_model_scorer.TRACES["score_batch"]
    first = rewards(prompts, completions, {}, [1] * 5)
    np.testing.assert_allclose(first.per_function["reward_model"], expected(prompts, completions),
                               atol=1e-5, rtol=0)
    assert first.events["reward_errors"] == 0 and lines == []
    traced = reward_model_scorer.TRACES["score_batch"]
    assert traced - before == 1  # both chunks (4 + 1 padded rows) share one 64-token bucket
    # Other texts and another count, lengths in the same bucket: no new trace.
    others = ["What is 2 + 2? Think step by step, then answer.", "x", "Mia has 3 cards"]
    more = [" 4", " y", "."]
    again = rewards(["p"] * 3, [o + m for o, m in zip(others, more)], {}, [1] * 3)
    assert reward_model_scorer.TRACES["score_batch"] == traced
    np.testing.assert_allclose(again.total, expected(["p"] * 3, [o + m for o, m in
                                                                   zip(others, more)]), atol=1e-5)
    assert len(set(np.round(first.total, 4))) == 5  # really different scores


def test_reward_model_truncates_to_the_end(tiny_reward_model):
    model, folder = tiny_reward_model
    rewards = build_rewards([{"name": "reward_model", "path": str(folder), "max_length": 16}])
    text = "a long prompt that goes past sixteen bytes, ending here"
    result = rewards([text], [""], {}, [0])
    tail = Tokenizer.byte_level().encode(text)[-16:]
    np.testing.assert_allclose(result.total, np.asarray(model(np.asarray([tail], np.int32))),
                               atol=1e-5)
    assert rewards.entries[0].fn.truncated == 1 and rewards.entries[0].timeout_s == 600.0
