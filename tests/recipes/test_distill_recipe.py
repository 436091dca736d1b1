"""`hone distill` end to end on the tiny preset, with a teacher trained for a few seconds (a random
tiny model is nearly uniform: nothing to distil). Each mode lowers the held-out KL(teacher ||
student); the cached top-k logits give the online top-k loss exactly; sequence-level writes the
teacher's answers once; on-policy replaces completions by the student's samples reproducibly;
a resumed run continues exactly; a distilled student exports as a Hugging Face folder."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from hone.config import DistillConfig, SFTConfig, load_config
from hone.errors import InputError
from hone.recipes.distill import run_distill

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/tiny/distill.yaml")
QUIET = dict(log=lambda s: None)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    """A tiny model fine-tuned on the arithmetic set for 40 steps, as a Hugging Face folder."""
    from hone.weights.hf import save_hf
    from hone.tokenizer import load_tokenizer
    from hone.recipes.sft import run_sft
    root = tmp_path_factory.mktemp("teacher")
    cfg = load_config(SFTConfig, str(ROOT / "configs/tiny/sft.yaml"), [
        f"run_dir={root / 'run'}", "log.sinks=[jsonl]", "train.max_steps=40",
        "train.eval_every=0", "data.eval_path=null", "checkpoint.every_steps=0",
        "checkpoint.async_save=false"])
    model, _ = run_sft(cfg, **QUIET)
    return str(save_hf(model, root / "hf", load_tokenizer("tiny")))


def config(tmp_path, teacher, *overrides):
    return load_config(DistillConfig, TINY, [
        f"run_dir={tmp_path}", f"teacher.source={teacher}", f"model.source={teacher}",
        "log.sinks=[jsonl]", "checkpoint.async_save=false", *overrides])


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def evals(run_dir) -> list[dict]:
    return [r for r in rows(run_dir) if "eval_kl" in r]


def test_online_distillation_halves_held_out_kl(tmp_path, teacher):
    run_distill(config(tmp_path, teacher), **QUIET)
    e = evals(tmp_path)
    assert [r["step"] for r in e] == [0, 20, 40]
    assert e[-1]["eval_kl"] <= 0.5 * e[0]["eval_kl"], e
    assert e[-1]["eval_top1_agree"] > e[0]["eval_top1_agree"]
    assert e[0]["eval_teacher_ppl"] == e[-1]["eval_teacher_ppl"]  # the teacher never moves
    train = [r for r in rows(tmp_path) if "distill" in r]
    # Every configured term is live: attention transfer and feature matching are non-zero.
    assert train[0]["attention"] > 0 and train[-1]["feature_cos"] > train[0]["feature_cos"]
    assert {"eval_answer_agree", "eval_text_agree", "eval_cos", "eval_ppl"} <= set(e[-1])


def test_offline_cache_gives_the_online_top_k_loss_and_is_reused(tmp_path, teacher):
    common = ["distill.top_k=16", "distill.attention_weight=0", "distill.feature_weight=0",
              "train.max_steps=3", "train.eval_every=0", "data.eval_path=null"]
    run_distill(config(tmp_path / "online", teacher, *common), **QUIET)
    logs = []
    run_distill(config(tmp_path / "offline", teacher, *common, "distill.mode=offline"),
                log=logs.append)
    assert any("wrote" in line for line in logs)
    online, offline = rows(tmp_path / "online"), rows(tmp_path / "offline")
    for a, b in zip(online, offline):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    assert (tmp_path / "offline/teacher_topk/meta.json").exists()
    # Resuming (more steps) reuses the cache; other data rebuilds it.
    logs.clear()
    run_distill(config(tmp_path / "offline", teacher, *common, "distill.mode=offline",
                       "train.max_steps=4"), log=logs.append)
    assert any("reusing" in line for line in logs)


def test_offline_mode_needs_top_k_and_pairs_must_match():
    with pytest.raises(InputError, match="distill.top_k"):
        DistillConfig(distill=DistillConfig().distill.__class__(mode="offline"))
    with pytest.raises(InputError, match="teacher layers"):
        load_config(DistillConfig, TINY, ["distill.attention_teacher_layers=[0, 1]"])
    with pytest.raises(InputError, match="data.pack"):
        load_config(DistillConfig, TINY, ["distill.mode=on_policy", "data.pack=true"])


def test_student_layer_out_of_range_is_named(tmp_path, teacher):
    with pytest.raises(InputError, match="distill.student_layers"):
        run_distill(config(tmp_path, teacher, "distill.student_layers=[0, 5]"), **QUIET)


def test_sequence_level_trains_on_the_teachers_answers(tmp_path, teacher):
    cfg = config(tmp_path, teacher, "distill.mode=sequence", "distill.attention_weight=0",
                 "teacher.dtype=bfloat16",
                 "distill.feature_weight=0", "data.max_records=32", "distill.gen_temperature=0",
                 "distill.max_new_tokens=16")
    run_distill(cfg, **QUIET)
    written = [json.loads(line) for line in
               (tmp_path / "teacher_data.jsonl").read_text().splitlines()]
    assert len(written) == 32 and written[0]["messages"][-1]["role"] == "assistant"
    e = evals(tmp_path)
    # The student learns to answer as the teacher does (the held-out KL on the data's own
    # completions is not what sequence-level distillation optimises).
    assert e[-1]["eval_answer_agree"] > e[0]["eval_answer_agree"] + 0.25
    assert not (tmp_path / "teacher_data.jsonl.partial").exists()


def test_on_policy_samples_reproducibly_and_lowers_kl(tmp_path, teacher):
    from hone.distill.on_policy import split_prompts
    cfg = config(tmp_path, teacher, "distill.mode=on_policy", "distill.lmbda=0.5",
                 "distill.kind=jsd", "distill.attention_weight=0", "distill.feature_weight=0",
                 "distill.max_new_tokens=16")
    run_distill(cfg, **QUIET)
    r = rows(tmp_path)
    flags = [x["on_policy"] for x in r if "on_policy" in x]
    assert 0 < sum(flags) < len(flags)  # both kinds of batch happen
    e = evals(tmp_path)
    assert e[-1]["eval_kl"] < 0.5 * e[0]["eval_kl"]
    batch = {"tokens": np.array([[5, 6, 7, 8, 0]]), "loss_mask": np.array([[0, 1, 1, 0, 0.]])}
    assert split_prompts(batch) == [[5, 6]]


def test_on_policy_samples_on_the_rollout_engine(tmp_path, teacher):
    """The student's samples come from the engine distill.engine names: on the paged engine
    they do not depend on how many sequences decode at once, and they are not the static
    sampler's draws (each paged sequence has a key of its own)."""
    from hone.data.collate import pad_rows
    from hone.data.sft import Example
    from hone.distill.on_policy import OnPolicy
    from hone.tokenizer import load_tokenizer
    from hone.weights.loading import load_model
    model, tok = load_model(teacher), load_tokenizer(teacher)
    width, rows = 24, []
    for question in ("12 + 7 =", "3 * 4 =", "9 - 2 ="):
        ids = tok.encode(question) + [5, 6]  # a two-token data completion
        rows.append(Example(np.asarray(ids, np.int32), np.arange(len(ids)) >= len(ids) - 2))
    batch = pad_rows(rows, width, 0)

    def sampled(*overrides):
        cfg = config(tmp_path, teacher, "distill.mode=on_policy", "distill.lmbda=1.0",
                     "distill.max_new_tokens=12", *overrides)
        out, metrics = OnPolicy(cfg, tok, lambda params: model, width, 0)({"params": None},
                                                                          batch, 1)
        assert metrics["on_policy"] == 1.0
        return out["tokens"].tolist()

    one = sampled("distill.engine=paged", "distill.max_seqs=1")
    assert sampled("distill.engine=paged", "distill.max_seqs=3") == one
    assert sampled("distill.engine=static") != one
    assert sampled("distill.engine=auto") == one  # paged on a CPU


def test_resume_continues_exactly_and_exports(tmp_path, teacher):
    """A run resumed from its step-3 checkpoint (the step-6 one deleted, as if killed) ends
    with bit-identical parameters; the student exports with its one block."""
    import shutil

    import transformers
    from hone.export import export_run
    cfg = config(tmp_path, teacher, "train.max_steps=6", "train.eval_every=0",
                 "data.eval_path=null", "checkpoint.every_steps=3")
    _, straight = run_distill(cfg, **QUIET)
    shutil.rmtree(tmp_path / "checkpoints" / "6")
    _, resumed = run_distill(cfg, **QUIET)
    assert int(resumed["step"]) == 6
    for x, y in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    out = export_run(tmp_path, tmp_path / "export")
    hf = transformers.AutoConfig.from_pretrained(str(out))
    assert hf.num_hidden_layers == 1


def other_model(tmp_path, **changes) -> str:
    """A random tiny-family model with some config fields changed, as a Hugging Face folder."""
    import dataclasses

    from hone.models.config import preset
    from hone.weights.hf import save_hf
    from hone.tokenizer import load_tokenizer
    from hone.models.transformer import Transformer
    base = preset("tiny")
    layers = changes.get("num_layers", base.num_layers)
    model = Transformer(dataclasses.replace(base, layer_types=("global",) * layers, **changes))
    return str(save_hf(model, tmp_path / "student", load_tokenizer("tiny")))


def test_feature_projection_between_widths_trains_and_lowers_its_loss(tmp_path, teacher):
    """A 32-wide, 4-block student against the 64-wide teacher: the learned [32, 64] projection
    trains with the student and the feature and attention terms fall (heads 2 vs 4: maps are
    compared head-averaged)."""
    student = other_model(tmp_path, hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=4,
                          intermediate_size=64)
    cfg = config(tmp_path / "run", teacher, f"model.source={student}",
                 "distill.student_layers=[]", "distill.feature_weight=1.0",
                 "distill.feature_kind=l2", "distill.feature_layers=[2, 4]",
                 "distill.feature_teacher_layers=[1, 2]", "distill.attention_weight=1.0",
                 "distill.attention_layers=[1, 3]", "distill.attention_teacher_layers=[0, 1]",
                 "train.max_steps=30", "train.eval_every=0", "data.eval_path=null")
    run_distill(cfg, **QUIET)
    train = [r for r in rows(tmp_path / "run") if "feature_sum" in r]
    first, last = train[0], train[-1]
    assert last["feature_sum"] / last["rows"] < 0.5 * first["feature_sum"] / first["rows"]
    assert last["attention"] < first["attention"]
    from hone.checkpoint import Checkpointer
    ckpt = Checkpointer(tmp_path / "run" / "checkpoints", keep=2, async_save=False)
    state, _ = ckpt.read()
    ckpt.close()
    kernels = [k for k in state["params"] if k.startswith("projections/")]
    assert len(kernels) == 2 and state["params"][kernels[0]].shape == (32, 64)


def test_vocabulary_mismatch_and_pairs_out_of_range_are_named(tmp_path, teacher):
    student = other_model(tmp_path, vocab_size=300)
    with pytest.raises(InputError, match="vocabulary"):
        run_distill(config(tmp_path / "a", teacher, f"model.source={student}",
                           "distill.student_layers=[]"), **QUIET)
    with pytest.raises(InputError, match="distill.attention_layers"):
        run_distill(config(tmp_path / "b", teacher, "distill.attention_layers=[3]"), **QUIET)
    with pytest.raises(InputError, match="teacher.devices"):  # one device: none to spare
        run_distill(config(tmp_path / "c", teacher, "teacher.devices=1"), **QUIET)
    assert not any((tmp_path / n).exists() for n in "abc")  # nothing written


SUB_MESH = """
import json, sys
from pathlib import Path
import jax
assert jax.device_count() == 2, jax.devices()
from hone.config import DistillConfig, load_config
from hone.recipes.distill import run_distill
root, teacher, config = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for devices in (0, 1):
    cfg = load_config(DistillConfig, config, [
        f"run_dir={root / str(devices)}", f"teacher.source={teacher}", f"model.source={teacher}",
        f"teacher.devices={devices}", "log.sinks=[jsonl]", "checkpoint.async_save=false",
        "train.max_steps=3", "train.eval_every=3", "train.eval_batches=1",
        "distill.eval_prompts=0"])
    run_distill(cfg, log=lambda s: None)
"""


def test_teacher_on_its_own_device_gives_the_same_run(tmp_path, teacher):
    """Two host devices: the teacher on device 1 (its own program, its outputs moved to the
    student's device 0) trains the same as the teacher inside the student's step."""
    import os
    import subprocess
    import sys
    from hostenv import host_devices_env
    env = host_devices_env(2)
    subprocess.run([sys.executable, "-c", SUB_MESH, str(tmp_path), teacher, TINY], env=env,
                   check=True, cwd=ROOT, timeout=600)
    same, remote = rows(tmp_path / "0"), rows(tmp_path / "1")
    assert len(same) == len(remote) == 4
    for a, b in zip(same, remote):
        for key in ("loss", "distill", "attention", "feature_cos", "eval_kl", "eval_cos"):
            if key in a:
                # The student starts as the teacher, so the losses are small differences of
                # log-probabilities of size log V (5.6): float32 rounding in two programs fused
                # differently leaves a few ulps of those (6.7e-7 each; 1.7e-6 measured on an
                # AVX2 CPU), beyond 1e-5 of a loss of 0.15.
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=5e-6, err_msg=key)


def test_vocabulary_map_lets_a_larger_vocabulary_learn_from_the_teacher(tmp_path, teacher):
    """A student with 300 token ids (the tiny tokenizer uses the first 264) distils through a
    map of the ids the two share; a map missing a token the data uses is refused, naming it."""
    import jax.numpy as jnp
    from flax import nnx

    import hone
    from hone.distill.loss import teacher_forward
    student = other_model(tmp_path, vocab_size=300)
    full = tmp_path / "map.json"
    full.write_text(json.dumps({str(i): i for i in range(264)}))
    run_distill(config(tmp_path / "run", teacher, f"model.source={student}",
                       "distill.student_layers=[]", f"distill.vocab_map={full}",
                       "train.max_steps=20", "train.eval_every=20", "distill.eval_prompts=2",
                       "train.eval_batches=1"), **QUIET)
    e = evals(tmp_path / "run")
    assert e[-1]["eval_kl"] < 0.5 * e[0]["eval_kl"]
    # The teacher's logits come back over the student's ids: the mapped entries, -inf elsewhere.
    model = hone.load_model(teacher)
    graphdef, state = nnx.split(model)
    vocab = np.full(300, -1, np.int32)
    vocab[:264] = np.arange(264)[::-1]
    tokens = np.array([[5, 70, 100]], np.int32)
    mb = {"tokens": tokens, "positions": np.arange(3)[None], "attention_mask": np.ones((1, 3)),
          "segment_ids": np.ones((1, 3), np.int32)}
    mapped, _, _ = teacher_forward(graphdef, state, mb, {"hidden": (), "attention": ()}, vocab)
    plain = model(jnp.asarray(vocab[tokens]))
    np.testing.assert_array_equal(np.asarray(mapped[..., :264]), np.asarray(plain[..., ::-1]))
    assert np.all(np.isneginf(np.asarray(mapped[..., 264:])))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({str(i): i for i in range(200)}))
    with pytest.raises(InputError, match="no teacher id"):
        run_distill(config(tmp_path / "bad", teacher, f"model.source={student}",
                           "distill.student_layers=[]", f"distill.vocab_map={partial}"),
                    **QUIET)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"7": 999}))
    with pytest.raises(InputError, match="not a teacher token id"):
        run_distill(config(tmp_path / "bad2", teacher, f"model.source={student}",
                           "distill.student_layers=[]", f"distill.vocab_map={bad}"), **QUIET)
