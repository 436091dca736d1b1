"""`hone eval accuracy --config` (hone.eval.agent): a model scored as an agent on the tiny preset
with the bundled guess-the-number game of configs/tiny/agent_grpo.yaml.

The tiny model is made to answer "777777777777" at every turn (every token's embedding gets a
large component along one dimension, the digit 7's a larger one, so the tied head's logit of 7
wins at every position): each episode's outcome is then known by hand.
"""

from __future__ import annotations

import json

import pytest

from hone.errors import InputError
from hone.eval.agent import agent_accuracy, agent_config
from hone.tokenizer import load_tokenizer
from hone.weights.loading import load_model

CONFIG = "configs/tiny/agent_grpo.yaml"  # GuessNumber, 3 turns of 12 tokens
SEVENS = "777777777777"  # 12 tokens: one whole turn
# (record, correct final reply, reward, turns): a guess of SEVENS ends the game when it is the
# secret (1 turn, reward 1); else the game answers "lower" until the 3 turns are spent.
CASES = [({"lo": 1, "hi": 10**12, "secret": int(SEVENS), "answer": SEVENS}, True, 1.0, 1),
         ({"lo": 1, "hi": 9, "secret": 1, "answer": "1"}, False, 0.0, 3),
         ({"lo": 1, "hi": 9, "secret": 1, "answer": SEVENS}, True, 0.0, 3),
         ({"lo": 1, "hi": 10**12, "secret": int(SEVENS), "answer": "5"}, False, 1.0, 1)]


@pytest.fixture(scope="module")
def sevens():
    model, tokenizer = load_model("tiny"), load_tokenizer("tiny")
    table = model.embedder.embedding[...]  # [V, D]
    seven = tokenizer.encode("7", add_special_tokens=False)[0]
    model.embedder.embedding[...] = table.at[:, 0].set(20.0).at[seven, 0].set(24.0)
    return model, tokenizer


def test_scores_each_greedy_episode_by_its_final_reply(sevens):
    model, tokenizer = sevens
    cfg = agent_config(CONFIG)
    r = agent_accuracy(model, tokenizer, cfg, [c[0] for c in CASES], batch_size=2)  # 2 calls
    assert r.replies == [SEVENS] * 4
    assert r.correct == [c[1] for c in CASES]
    assert r.accuracy == 0.5
    assert r.reward == 0.5
    assert r.episodes == 4
    assert r.metrics["agent/turns_mean"] == 2.0  # (1 + 3 + 3 + 1) / 4
    assert r.metrics["agent/done_fraction"] == 0.5  # found: the game ended it
    assert r.metrics["agent/model_tokens_mean"] == 12 * 2.0


def test_the_command_line_reads_model_limits_and_data_from_the_config(sevens, tmp_path,
                                                                      monkeypatch, capsys):
    from hone.cli import main
    data = tmp_path / "games.jsonl"
    data.write_text("".join(json.dumps(c[0]) + "\n" for c in CASES))
    loaded = []

    def load_policy(source, dtype="float32", flag="--model"):
        loaded.append(source)
        return sevens

    monkeypatch.setattr("hone.eval.models.load_policy", load_policy)
    assert main(["eval", "accuracy", "--config", CONFIG, "--data", str(data), "--limit", "2",
                 "--batch-size", "2"]) == 0  # the shapes of the test above: no compile
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert loaded == ["tiny"]  # the config's model.source
    assert out["episodes"] == 2  # the first two cases: one right in 1 turn, one wrong in 3
    assert (out["accuracy"], out["reward_mean"], out["agent/turns_mean"]) == (0.5, 0.5, 2.0)


def test_bad_uses_are_input_errors(tmp_path):
    plain = tmp_path / "grpo.yaml"
    plain.write_text("grpo:\n  group_size: 4\n")
    with pytest.raises(InputError, match="no agent"):
        agent_config(str(plain))
    from hone.cli import main
    assert main(["eval", "accuracy", "--config", CONFIG, "--samples", "2"]) == 2
    assert main(["eval", "accuracy", "--limit", "2"]) == 2  # no --model and no --config
