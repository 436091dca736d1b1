"""`hone bench ROW --model tiny`: progress lines, then one JSON line with sane values.

Performance itself is never asserted (it is measured in benchmarks/, never held to a wall-clock
limit in a test): only that the numbers are consistent with each other and with
hone/bench/flops.py.
"""

from __future__ import annotations

import json

import pytest

from hone.bench import flops
from hone.cli import main
from hone.config.schema import ModelSection, TrainSection
from hone.models.config import PRESETS

REQUIRED = {"row", "model", "batch", "seq", "steps", "median_s", "tokens_per_s", "first_step_s",
            "peak_rss_mb", "mfu", "flops_per_step", "ceiling_gflops", "tokens_per_step"}
TINY = PRESETS["tiny"]


def bench(capsys, *argv) -> tuple[list[str], dict]:
    assert main(["bench", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) > 1 and not any(line.startswith("{") for line in lines[:-1])
    return lines[:-1], json.loads(lines[-1])


# remat: the --remat each training row runs with (no extra runs: the rows below run anyway);
# lora keeps the default, which must stay "none"; decode has no backward pass, so no remat.
@pytest.mark.parametrize("row, remat, tokens, formula", [
    ("sft", "full", lambda b, t: b * t, lambda b, t: flops.sft_flops(TINY, b, t)),
    ("lora", None, lambda b, t: b * t, lambda b, t: flops.sft_flops(TINY, b, t,
                                                                    flops.lora_params(TINY, 16))),
    ("dpo", "save_dots", lambda b, t: 2 * b * t,
     lambda b, t: flops.shared_dpo_flops(TINY, b, t // 2, t // 2)),
    ("decode", None, lambda b, t: b * t, lambda b, t: flops.decode_flops(TINY, b, 32, t)),
    ("grpo", "full", lambda b, t: 4 * b * t,
     lambda b, t: flops.grpo_flops(TINY, b, 4, t // 2, t // 2, shared_prompt=True)),
])
def test_each_row_prints_a_last_json_line(capsys, row, remat, tokens, formula):
    flags = ["--remat", remat] if remat else []
    progress, got = bench(capsys, row, "--model", "tiny", "--steps", "2", *flags)
    assert all(line.startswith("hone bench: ") for line in progress)
    assert REQUIRED <= set(got), REQUIRED - set(got)
    assert (got["row"], got["model"], got["steps"]) == (row, "tiny", 2)
    # read back from the model the step's graphdef rebuilds, not echoed from the option
    assert got.get("remat") == (None if row == "decode" else remat or "none")
    if row != "decode":
        assert list(got)[5:7] == ["precision", "remat"]  # beside the other settings
    b, t = got["batch"], got["seq"]
    assert (b, t) == {"sft": (4, 128), "lora": (4, 128), "dpo": (4, 128), "decode": (8, 64),
                      "grpo": (2, 64)}[row]
    assert got["median_s"] > 0 and got["first_step_s"] > 0 and got["peak_rss_mb"] > 0
    assert got["tokens_per_step"] == tokens(b, t)
    assert got["tokens_per_s"] == pytest.approx(got["tokens_per_step"] / got["median_s"],
                                                rel=1e-4)
    if row in ("sft", "lora", "decode"):
        assert got["tokens_per_s"] == pytest.approx(b * t / got["median_s"], rel=1e-4)
    assert got["flops_per_step"] == round(formula(b, t))
    assert got["ceiling_gflops"] > 0
    assert 0 < got["mfu"] < 1
    assert got["mfu"] == pytest.approx(
        got["flops_per_step"] / got["median_s"] / (got["ceiling_gflops"] * 1e9), rel=1e-3)
    if row in ("sft", "lora"):  # set as build_model sets them, read back from the step's model
        assert (got["attention"], got["head_chunk"]) == (ModelSection().attention,
                                                         TrainSection().head_chunk)
    if row == "dpo":
        assert got["first_loss"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference
    if row == "grpo":
        assert got["ref_in_update"] and got["update_s"] > 0 and got["rollout_s"] > 0


def test_bad_shape_is_an_input_error(capsys):
    assert main(["bench", "dpo", "--model", "tiny", "--seq", "8", "--prompt-len", "8"]) == 2
    assert "--prompt-len" in capsys.readouterr().err
    assert main(["bench", "sft", "--model", "tiny", "--batch", "0"]) == 2
    assert main(["bench", "decode", "--model", "tiny", "--remat", "full"]) == 2
    assert "--remat applies to sft, lora, dpo, grpo" in capsys.readouterr().err
    # Tunix's sampler runs the rollout row of SmolLM2's shape in fp32 only
    assert main(["bench", "grpo", "--tunix"]) == 2
    assert main(["bench", "rollout", "--tunix", "--model", "tiny"]) == 2
    assert main(["bench", "rollout", "--tunix", "--precision", "bf16"]) == 2
    assert "--tunix times the rollout row" in capsys.readouterr().err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "hone bench sft" in out


def test_rollout_row_counts_the_drawn_lengths_on_either_engine(capsys):
    """`hone bench rollout`: both engines make every sample's drawn length (the long-tail
    draw), the paged pool is the smaller cache, and a pool too small for the sequences at once
    preempts and still makes every token."""
    from hone.bench.rollout import sample_lengths
    args = ["rollout", "--model", "tiny", "--batch", "2", "--generations", "3", "--seq", "40",
            "--steps", "0"]
    drawn = sum(sample_lengths("long-tail", 6, 40))
    _, static = bench(capsys, *args, "--engine", "static")
    _, paged = bench(capsys, *args, "--engine", "paged", "--max-seqs", "6")
    _, tight = bench(capsys, *args, "--engine", "paged", "--max-seqs", "6", "--num-pages", "5")
    for got in (static, paged, tight):
        assert REQUIRED <= set(got) and got["tokens_per_step"] == drawn
        assert got["mean_length"] == pytest.approx(drawn / 6, abs=1e-4)  # printed rounded
    assert paged["kv_bytes"] < static["kv_bytes"] and paged["preempted"] == 0
    assert paged["num_pages"] == 2 + 6 * 2  # 64-token prompts + 40 tokens: two pages each
    assert tight["num_pages"] == 5 and tight["preempted"] > 0 and tight["peak_pages"] <= 4
    assert main(["bench", *args, "--num-pages", "0"]) == 2
