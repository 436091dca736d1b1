"""`hone eval`: perplexity, sampled accuracy, reward-model pairs and model comparison, each
checked against numbers computed by hand; the command line's output and its exit code 2."""

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import hone
from hone.cli import main
from hone.data.preference import tokenize_pair
from hone.eval import accuracy, compare_answers, pair_accuracy, pass_at_k, perplexity, win_rate
from hone.eval.accuracy import majority_answer, score
from hone.sampling.generate import Completion

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [{"prompt": "2 + 2?", "chosen": "The answer is 4.", "rejected": "The answer is 5."},
         {"prompt": "3 * 3?", "chosen": "9", "rejected": "It is 6"},
         {"prompt": "7 - 1?", "chosen": "6.", "rejected": "The answer is 8."}]


@pytest.fixture(scope="module")
def tiny():
    return hone.load_model("tiny"), hone.load_tokenizer("tiny")


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    """A random-init reward model on the tiny backbone, saved as `hone export` writes one."""
    from flax import nnx

    from hone.models.reward import RewardModel
    from hone.weights.hf_reward import save_reward_model
    model = RewardModel(hone.load_model("tiny", seed=3), rngs=nnx.Rngs(1))
    return save_reward_model(model, tmp_path_factory.mktemp("rm") / "rm",
                             hone.load_tokenizer("tiny"))


def _jitted(module, method="__call__"):
    """tokens -> module(tokens) (or module.method(tokens)) under jit, without attention mask."""
    from flax import nnx
    graphdef, state = nnx.split(module)
    fn = jax.jit(lambda st, t: getattr(nnx.merge(graphdef, st), method)(t))
    return lambda tokens: fn(state, tokens)


def _jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# ---- perplexity ------------------------------------------------------------------------------

def test_perplexity_is_exp_of_the_token_mean_nll(tiny):
    model, tok = tiny
    records = [{"text": "hello there"}, {"text": "12 + 7 = 19"}]
    report = perplexity(model, tok, "<hand>", records=records, batch_size=4)
    # By hand: one causal forward of both records right-padded (padding after a token cannot
    # change its logits), log_softmax, and the NLL of every next token.
    docs = [tok.encode(r["text"]) + [tok.eos_id] for r in records]  # SFT appends EOS to text
    tokens = np.zeros((2, 32), np.int32)
    for row, ids in enumerate(docs):
        tokens[row, :len(ids)] = ids
    logp = np.asarray(jax.nn.log_softmax(_jitted(model)(tokens), axis=-1))  # [2, 32, V]
    nll = -sum(logp[row, t, ids[t + 1]] for row, ids in enumerate(docs)
               for t in range(len(ids) - 1))
    count = sum(len(ids) - 1 for ids in docs)
    assert report.tokens == count and report.records == 2 and report.scored == "all tokens"
    assert report.nll == pytest.approx(nll / count, rel=1e-5)
    assert report.perplexity == pytest.approx(np.exp(nll / count), rel=1e-5)

    # prompt + completion records: only the completion (and its EOS) is scored.
    pc = perplexity(model, tok, "<hand>", records=[{"prompt": "Q: 1+1?", "completion": " 2"}])
    assert pc.scored == "completion tokens" and pc.tokens == len(tok.encode(" 2")) + 1


# ---- accuracy --------------------------------------------------------------------------------

def test_pass_and_majority_arithmetic():
    assert pass_at_k(3, 2, 1) == pytest.approx(2 / 3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(3, 0, 3) == 0.0 and pass_at_k(3, 1, 3) == 1.0
    assert majority_answer(["no idea", "The answer is 7.", "3", "7"]) == "7"
    assert majority_answer(["3", "7"]) == "3"  # a tie goes to the answer seen first
    assert majority_answer(["none", "here"]) is None
    r = score([["7", "7", "3"]], ["7"])
    assert (r["pass@1"], r["pass@k"], r["majority@k"]) == (pytest.approx(2 / 3), 1.0, 1.0)
    r = score([["3", "3", "7"], ["no", "number", "here"]], ["7", "1"])
    assert r["pass@1"] == pytest.approx(1 / 6) and r["pass@k"] == 0.5 and r["majority@k"] == 0
    assert r["correct"] == [[False, False, True], [False, False, False]]


def test_accuracy_with_fixed_samples(monkeypatch):
    """generate replaced by fixed texts: k = 3 samples of 2 prompts, batch 2: a call per
    prompt (a prompt's samples share one call, and its prefill)."""
    import hone.sampling.generate as gen
    texts = iter(["The answer is 7.", "7", "3",   # prompt 1, reference 7
                  "5", "4", "5"])                 # prompt 2, reference 3
    calls = []

    def fake(model, tokenizer, prompts, **kw):
        calls.append((len(prompts), kw["n"], kw["temperature"], kw["seed"]))
        return [Completion(text=next(texts), tokens=[], logprobs=[])
                for _ in range(len(prompts) * kw["n"])]

    monkeypatch.setattr(gen, "generate", fake)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    records = [{"prompt": "Tom has 3 + 4 apples?", "answer": "7"},
               {"prompt": "Anna has 6 - 3?", "answer": 3}]
    r = accuracy(model, hone.load_tokenizer("tiny"), "<hand>", records=records, samples=3,
                 temperature=0.5, batch_size=2)
    assert calls == [(1, 3, 0.5, 0), (1, 3, 0.5, 1)]
    assert r.completions == [["The answer is 7.", "7", "3"], ["5", "4", "5"]]
    assert (r.pass_at_1, r.pass_at_k, r.majority_at_k) == (pytest.approx(1 / 3), 0.5, 0.5)


def test_greedy_accuracy_is_the_existing_greedy_evaluation(tiny):
    from hone.datasets import BUILTIN, is_correct
    from hone.eval.accuracy import task_accuracy
    model, tok = tiny
    records = BUILTIN["arithmetic-rl-eval"]()[:2]
    ours = accuracy(model, tok, "<hand>", records=records, max_new_tokens=8)
    theirs = task_accuracy(model, tok, records, is_correct, max_new_tokens=8)
    assert [c[0] for c in ours.completions] == theirs.answers
    assert ours.pass_at_1 == theirs.accuracy and ours.samples == 1 and ours.temperature == 0


# ---- reward model: pairs and compare ---------------------------------------------------------

def test_pair_accuracy_matches_direct_scores_and_the_recipe(reward_dir):
    from hone.data.preference import PreferenceData
    from hone.eval.models import load_reward
    from hone.recipes.reward import make_reward_loss
    from hone.train.state import flatten, split_model
    from hone.train.step import make_eval_step
    model, tok = load_reward(reward_dir)
    report = pair_accuracy(model, tok, "<hand>", records=PAIRS, max_length=64, batch_size=2)
    # By hand: each side alone, its reward read off the hidden state of its last token.
    head = np.asarray(model.head.kernel[...])[:, 0]  # [D]
    hidden_of = _jitted(model.backbone, "hidden")
    direct = []
    for record in PAIRS:
        sides = []
        for example in tokenize_pair(record, tok, max_length=64).examples():
            tokens = np.zeros((1, 64), np.int32)
            tokens[0, :len(example)] = example.tokens
            hidden = np.asarray(hidden_of(tokens))  # [1, 64, D]
            sides.append(float(hidden[0, len(example) - 1] @ head))
        direct.append(sides)
    direct = np.array(direct)
    np.testing.assert_allclose(report.chosen, direct[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(report.rejected, direct[:, 1], rtol=1e-5, atol=1e-6)
    assert report.pairs == 3
    assert report.accuracy == np.mean(direct[:, 0] > direct[:, 1])
    assert report.margin == pytest.approx(np.mean(direct[:, 0] - direct[:, 1]), abs=1e-6)

    # The numbers `hone reward` logs as eval_accuracy / eval_margin on the same pairs.
    cfg = SimpleNamespace(reward=SimpleNamespace(margin=None, center_coef=0.0))
    from flax import nnx
    graphdef, params, frozen = split_model(model, nnx.Param)
    step = make_eval_step(graphdef, params, make_reward_loss(cfg))
    data = PreferenceData("<hand>", tok, max_length=64, batch_size=2, records=PAIRS)
    sums = {}
    for batch in data.batches():
        for k, v in step(flatten(params), frozen, batch).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    assert report.accuracy == sums["accuracy_sum"] / sums["pairs"]
    assert report.margin == pytest.approx(sums["margin_sum"] / sums["pairs"], abs=1e-5)


def test_win_rate_counts_ties_half():
    rate, wins, ties, losses = win_rate([1.0, 2.0, 3.0, 0.9], [0.5, 2.0, 4.0, 0.5],
                                        [False, False, False, True])
    assert (wins, ties, losses) == (1, 2, 1) and rate == 0.5
    assert win_rate([1.0, 1.0, 0.0], [0.0, 0.0, 0.0])[0] == pytest.approx(5 / 6)


def test_compare_scores_both_answers_on_the_reward_models_template():
    tok = hone.load_tokenizer("tiny")
    seen = []

    def scorer(prompts, completions):
        seen.append(prompts)
        return [float(len(c)) for c in completions]  # longer answers score higher

    scorer.tokenizer = tok
    r = compare_answers(["q1", "q2", "q3"], ["aaa", "b", "same"], ["a", "bbb", "same"], scorer)
    assert seen[0] == seen[1] == [tok.apply_chat_template([{"role": "user", "content": q}])
                                  for q in ("q1", "q2", "q3")]
    assert (r.wins, r.ties, r.losses, r.win_rate) == (1, 1, 1, 0.5)
    assert r.reward_a == pytest.approx(8 / 3) and r.reward_b == pytest.approx(8 / 3)


# ---- the command line ------------------------------------------------------------------------

def test_cli_perplexity_and_out_file(tmp_path, capsys):
    out = tmp_path / "ppl.json"
    assert main(["eval", "perplexity", "--model", "tiny", "--data", "builtin:arithmetic-eval",
                 "--max-records", "3", "--max-length", "128", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = _last_json(printed)
    assert "perplexity" in printed and result == json.loads(out.read_text())
    assert result["records"] == 3 and result["scored"] == "completion tokens"
    assert result["perplexity"] == pytest.approx(np.exp(result["nll"]))


def test_cli_accuracy(capsys):
    assert main(["eval", "accuracy", "--model", "tiny", "--limit", "2", "--max-new-tokens", "8"
                 ]) == 0
    printed = capsys.readouterr().out
    result = _last_json(printed)
    assert "greedy" in printed and (result["k"], result["prompts"]) == (1, 2)
    assert result["pass@1"] == result["pass@k"] == result["majority@k"] in (0.0, 0.5, 1.0)


def test_cli_pairs(reward_dir, capsys):
    assert main(["eval", "pairs", "--reward-model", str(reward_dir), "--limit", "4",
                 "--max-length", "128"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["pairs"] == 4 and 0 <= result["accuracy"] <= 1


def test_cli_compare_of_a_model_with_itself_is_all_ties(reward_dir, capsys):
    assert main(["eval", "compare", "--model", "tiny", "--against", "tiny", "--reward-model",
                 str(reward_dir), "--limit", "2", "--max-new-tokens", "8"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert (result["ties"], result["win_rate"]) == (2, 0.5)
    assert result["reward_a"] == result["reward_b"]


def _run_folder(run: Path, command: str, model) -> Path:
    """A run folder as `hone <command>` leaves it (config.yaml, a checkpoint of `model`'s
    parameters), without training: the tiny config of the command, step 1."""
    from flax import nnx

    from hone.checkpoint import Checkpointer
    from hone.config import COMMANDS, load_config
    from hone.train.build import open_run
    from hone.train.state import flatten, split_model
    open_run(load_config(COMMANDS[command], str(ROOT / f"configs/tiny/{command}.yaml"),
                         [f"run_dir={run}"]))
    _, params, _ = split_model(model, nnx.Param)
    ckpt = Checkpointer(run / "checkpoints", keep=1, async_save=False, exclusive=True)
    ckpt.save(1, {"params": flatten(params)}, {})
    ckpt.close()
    return run


def test_cli_run_folders(tmp_path, reward_dir, capsys):
    """Run folders are sources: a policy run for --model, a reward run for --reward-model;
    each refused in the other's place."""
    from flax import nnx

    from hone.models.reward import RewardModel
    policy = _run_folder(tmp_path / "sft", "sft", hone.load_model("tiny", seed=5))
    assert main(["eval", "perplexity", "--model", str(policy), "--data",
                 "builtin:arithmetic-eval", "--max-records", "3", "--max-length", "128"]) == 0
    ours = _last_json(capsys.readouterr().out)
    trained = perplexity(hone.load_model("tiny", seed=5), hone.load_tokenizer("tiny"),
                         "builtin:arithmetic-eval", max_records=3, max_length=128)
    assert ours["nll"] == pytest.approx(trained.nll, rel=1e-6)  # the run's weights, not tiny's

    # The same reward model as reward_dir, as a run: the same pair scores.
    rm = RewardModel(hone.load_model("tiny", seed=3), rngs=nnx.Rngs(1))
    reward_run = _run_folder(tmp_path / "reward", "reward", rm)
    results = []
    for source in (reward_run, reward_dir):
        assert main(["eval", "pairs", "--reward-model", str(source), "--limit", "4",
                     "--max-length", "128"]) == 0
        results.append(_last_json(capsys.readouterr().out))
    assert results[0]["margin"] == pytest.approx(results[1]["margin"], abs=1e-6)

    assert main(["eval", "pairs", "--reward-model", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "trained a policy, not a reward model" in err and "hone reward" in err
    assert main(["eval", "accuracy", "--model", str(reward_run)]) == 2
    assert "give it to --reward-model" in capsys.readouterr().err


def _bad(tmp_path):
    no_answer = _jsonl(tmp_path / "q.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    no_rejected = _jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "b"}])
    no_text = _jsonl(tmp_path / "t.jsonl", [{"body": "x"}])
    no_prompt = _jsonl(tmp_path / "c.jsonl", [{"question": "x"}])
    acc = ["eval", "accuracy", "--model", "tiny"]
    return [
        (["eval", "perplexity", "--model", "nope", "--data", "builtin:arithmetic-eval"],
         ["'--model'", "run folder"]),
        (["eval", "perplexity", "--model", "tiny", "--data", str(tmp_path / "none.jsonl")],
         ["no such file"]),
        (["eval", "perplexity", "--model", "tiny", "--data", no_text],
         ["record 0", "'text'"]),
        (acc + ["--data", no_answer], ["record 1", "'answer'"]),
        (acc + ["--samples", "0"], ["'--samples'", ">= 1"]),
        (acc + ["--temperature", "-1"], ["'--temperature'", ">= 0"]),
        (acc + ["--samples", "4", "--temperature", "0"], ["--temperature above 0"]),
        (["eval", "pairs", "--reward-model", str(tmp_path / "nothing")],
         ["'--reward-model'", "hone export"]),
        (["eval", "pairs", "--reward-model", "{rm}", "--data", no_rejected],
         ["record 0", "'rejected'"]),
        (["eval", "compare", "--model", "tiny", "--against", "tiny", "--reward-model", "{rm}",
          "--data", no_prompt], ["record 0", "'prompt'"]),
    ]


def test_cli_bad_input_exits_two_with_one_paragraph(tmp_path, reward_dir, capsys):
    for argv, needles in _bad(tmp_path):
        argv = [str(reward_dir) if a == "{rm}" else a for a in argv]
        assert main(argv) == 2, argv
        *notes, err = capsys.readouterr().err.strip().splitlines()
        assert all(n.endswith(" ...") for n in notes), notes  # progress notes, then the error
        assert err.startswith("hone eval: error:"), err
        for needle in needles:
            assert needle in err, (argv, err)
