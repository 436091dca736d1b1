"""`hone eval perplexity|accuracy|pairs|compare`: the parsers and what each command prints.

Every command prints a short table, then, as the last line on stdout, one JSON object with the
numbers (so a script can read `tail -n 1`); `--out FILE` writes the same JSON to a file.
Progress notes go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_RAW = argparse.RawDescriptionHelpFormatter
_ACCURACY_DATA = "builtin:arithmetic-rl-eval"  # without --config
_MODEL_HELP = ("a preset (tiny, smollm2-135m-instruct, ...), a Hugging Face folder, a .gguf "
               "file, or a run folder (config.yaml + checkpoints/)")
_RM_HELP = "a reward-model folder from `hone export`, or the run folder of `hone reward`"
_HELP = {"perplexity": "mean NLL per token and perplexity on text",
         "accuracy": "task accuracy: greedy pass@1, or pass@1/pass@K/majority@K over K samples",
         "pairs": "reward-model pairwise accuracy and margin on preference pairs",
         "compare": "win rate of one model over another under a reward model"}
_DESCRIPTIONS = {
    "perplexity": (
        "Token-weighted mean negative log-likelihood and perplexity of a model on records.\n"
        "text records: every token is scored; messages and prompt + completion records: the\n"
        "completion tokens only (as `hone sft` with data.loss_on=completion).\n\nexamples:\n"
        "  hone eval perplexity --model tiny --data builtin:arithmetic-eval --max-records 32\n"
        "  hone eval perplexity --model runs/tiny-sft --data notes.jsonl --max-length 256"),
    "accuracy": (
        "Task accuracy on prompt + answer records, checked by the final number of each\n"
        "completion. --samples 1 at temperature 0 is greedy pass@1; with K > 1 samples it\n"
        "reports pass@1 (mean correctness), pass@K and majority@K.\n\nexamples:\n"
        "  hone eval accuracy --model smollm2-135m-instruct --limit 64\n"
        "  hone eval accuracy --model runs/tiny-grpo --samples 8 --temperature 0.7 --limit 32\n"
        "\nWith --config RL_CONFIG whose `agent:` section is set, the model plays one greedy\n"
        "episode per record as that agent (environment, tools, turn and token limits) and is\n"
        "scored on its final reply; --model and --data default to the config's model.source\n"
        "and data.eval_path:\n"
        "  hone eval accuracy --config configs/smollm2/agent_calculator_grpo.yaml --limit 64"),
    "pairs": (
        "Pairwise accuracy of a reward model on prompt + chosen + rejected records:\n"
        "how often score(chosen) > score(rejected), and the mean margin.\n\nexamples:\n"
        "  hone eval pairs --reward-model runs/tiny-reward\n"
        "  hone eval pairs --reward-model exported-rm/ --data my-pairs.jsonl --limit 100"),
    "compare": (
        "Greedy answers of two models to the same prompts, scored by a reward model:\n"
        "the win rate of --model over --against (ties count half) and each mean reward.\n\n"
        "examples:\n"
        "  hone eval compare --model runs/tiny-grpo --against tiny "
        "--reward-model runs/tiny-reward --limit 32\n"
        "  hone eval compare --model runs/dpo --against smollm2-135m-instruct "
        "--reward-model rm/ --data prompts.jsonl"),
}


def add_eval_parser(sub) -> argparse.ArgumentParser:
    """The `eval` command and its four sub-commands, on the top-level subparsers `sub`."""
    ev = sub.add_parser("eval", help="evaluate models: perplexity, task accuracy, reward-model "
                        "pairwise accuracy, win rate of one model over another",
                        description="Evaluate a model. Each command prints a table and, last on "
                        "stdout, one JSON line.\n\nexamples:\n"
                        + "\n".join(d.split("examples:\n")[1].splitlines()[0]
                                    for d in _DESCRIPTIONS.values()),
                        formatter_class=_RAW)
    cmds = ev.add_subparsers(dest="eval_command", required=True, metavar="COMMAND")
    parsers = {name: cmds.add_parser(name, help=_HELP[name], description=text,
                                     formatter_class=_RAW)
               for name, text in _DESCRIPTIONS.items()}
    for name in ("perplexity", "compare"):
        parsers[name].add_argument("--model", required=True, help=_MODEL_HELP)
    # Required unless --config names it (checked in _accuracy).
    parsers["accuracy"].add_argument("--model", default=None, help=_MODEL_HELP
                                     + " (default with --config: its model.source)")
    parsers["compare"].add_argument("--against", required=True, help="model B: " + _MODEL_HELP)
    for name in ("pairs", "compare"):
        parsers[name].add_argument("--reward-model", required=True, help=_RM_HELP)
    defaults = {"perplexity": None, "accuracy": _ACCURACY_DATA,
                "pairs": "builtin:arithmetic-pref-eval", "compare": "builtin:arithmetic-rl-eval"}
    for name, p in parsers.items():
        default = "" if defaults[name] is None else f" (default {defaults[name]}"
        default += ("; with --config: its data.eval_path)" if name == "accuracy"
                    else ")" if default else "")
        p.add_argument("--data", required=defaults[name] is None,
                       default=None if name == "accuracy" else defaults[name],
                       help=f"a .jsonl/.json/.parquet file, a saved datasets folder or "
                       f"builtin:NAME{default}")
        p.add_argument("--out", default=None, help="also write the JSON result to this file")
        batch = 8 if name in ("perplexity", "pairs") else 32
        p.add_argument("--batch-size", type=int, default=batch,
                       help=f"rows per forward pass or generate call (default {batch})")
    for name in ("perplexity", "pairs"):
        parsers[name].add_argument("--max-length", type=int, default=512,
                                   help="tokens per record; longer ones are cut (default 512)")
    parsers["perplexity"].add_argument("--max-records", type=int, default=None,
                                       help="score only the first N records")
    for name in ("accuracy", "pairs", "compare"):
        parsers[name].add_argument("--limit", type=int, default=None,
                                   help="use only the first N records")
    for name in ("accuracy", "compare"):
        parsers[name].add_argument("--max-new-tokens", type=int, default=64,
                                   help="answer length budget (default 64)")
    acc = parsers["accuracy"]
    acc.add_argument("--config", default=None,
                     help="an RL config with an `agent:` section: score the model as that agent "
                     "(one greedy episode per record)")
    acc.add_argument("--samples", type=int, default=1, help="K completions per prompt")
    acc.add_argument("--temperature", type=float, default=None,
                     help="0 = greedy; default 0 with --samples 1, else 1.0")
    acc.add_argument("--seed", type=int, default=0, help="sampling seed")
    for name in ("perplexity", "accuracy", "compare"):
        parsers[name].add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                                   help="parameter dtype of a model that is not a run folder")
    return ev


def run_eval(args) -> int:
    """Run the sub-command in args.eval_command; print its table and JSON line."""
    result = _COMMANDS[args.eval_command](args)
    line = json.dumps({"command": f"eval {args.eval_command}", **result})
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)
    return 0


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _table(rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {f'{value:.4f}' if isinstance(value, float) else value}")


def _perplexity(args) -> dict:
    from hone.eval.models import load_policy
    from hone.eval.perplexity import perplexity
    _note(f"loading {args.model} ...")
    model, tokenizer = load_policy(args.model, args.dtype)
    r = perplexity(model, tokenizer, args.data, max_length=args.max_length,
                   batch_size=args.batch_size, max_records=args.max_records)
    _table([("model", args.model), ("data", f"{args.data} ({r.format}: {r.scored} scored)"),
            ("records", f"{r.records} ({r.truncated} truncated, {r.skipped} skipped)"),
            ("tokens", r.tokens), ("nll/token", r.nll), ("perplexity", r.perplexity)])
    return {"model": args.model, "data": args.data, **r.as_dict()}


def _accuracy(args) -> dict:
    from hone.eval.accuracy import accuracy, sampling_temperature
    from hone.eval.models import load_policy
    if args.config:
        return _agent_accuracy(args)
    if args.model is None:
        from hone.errors import InputError
        raise InputError("the model to evaluate is required (or --config, whose model.source "
                         "is the default)", key="--model")
    args.data = args.data or _ACCURACY_DATA
    temperature = sampling_temperature(args.samples, args.temperature)  # before any loading
    _note(f"loading {args.model} ...")
    model, tokenizer = load_policy(args.model, args.dtype)
    r = accuracy(model, tokenizer, args.data, samples=args.samples, temperature=temperature,
                 max_new_tokens=args.max_new_tokens, limit=args.limit, seed=args.seed,
                 batch_size=args.batch_size)
    k = r.samples
    rows = [("model", args.model), ("data", f"{args.data} ({r.prompts} prompts)"),
            ("sampling", "greedy" if r.temperature == 0 else f"temperature {r.temperature:g}, "
             f"{k} samples, seed {args.seed}"), ("pass@1", r.pass_at_1)]
    if k > 1:
        rows += [(f"pass@{k}", r.pass_at_k), (f"majority@{k}", r.majority_at_k)]
    _table(rows)
    return {"model": args.model, "data": args.data, **r.as_dict()}


def _agent_accuracy(args) -> dict:
    from hone.data.loader import load_records
    from hone.errors import InputError
    from hone.eval.agent import agent_accuracy, agent_config
    from hone.eval.models import load_policy
    cfg = agent_config(args.config)  # before any loading
    if args.samples != 1 or args.temperature not in (None, 0.0):
        raise InputError("an agent is scored on one greedy episode per record; drop --samples "
                         "and --temperature", key="--config")
    args.model = args.model or cfg.model.source
    args.data = args.data or cfg.data.eval_path or cfg.data.path
    records = load_records(args.data, None, args.limit)
    _note(f"loading {args.model} ...")
    model, tokenizer = load_policy(args.model, args.dtype)
    r = agent_accuracy(model, tokenizer, cfg, records, batch_size=args.batch_size,
                       seed=args.seed, log=_note)
    m = r.metrics
    _table([("model", args.model), ("agent", args.config),
            ("data", f"{args.data} ({r.episodes} episodes, greedy)"),
            ("accuracy", "n/a (no answers)" if r.accuracy is None else r.accuracy),
            ("mean reward", r.reward), ("turns", m["agent/turns_mean"]),
            ("tool calls", m.get("agent/tool_calls", 0.0) / max(r.episodes, 1))])
    return {"model": args.model, "config": args.config, "data": args.data, **r.as_dict()}


def _pairs(args) -> dict:
    from hone.eval.models import load_reward
    from hone.eval.pairs import pair_accuracy
    _note(f"loading {args.reward_model} ...")
    model, tokenizer = load_reward(args.reward_model)
    r = pair_accuracy(model, tokenizer, args.data, max_length=args.max_length,
                      batch_size=args.batch_size, limit=args.limit)
    _table([("reward model", args.reward_model),
            ("data", f"{args.data} ({r.pairs} pairs; {r.truncated} truncated, "
             f"{r.skipped} skipped)"), ("accuracy", r.accuracy), ("margin", r.margin),
            ("chosen reward", r.chosen_reward), ("rejected reward", r.rejected_reward)])
    return {"reward_model": args.reward_model, "data": args.data, **r.as_dict()}


def _compare(args) -> dict:
    import gc

    from hone.eval.compare import compare_answers, greedy_answers
    from hone.eval.models import check_reward_source, load_policy, reward_scorer
    check_reward_source(args.reward_model)  # fail before minutes of generation
    answers = {}
    for flag, source in (("--model", args.model), ("--against", args.against)):
        _note(f"answering with {source} ...")
        model, tokenizer = load_policy(source, args.dtype, flag=flag)
        answers[flag] = greedy_answers(model, tokenizer, args.data, limit=args.limit,
                                       max_new_tokens=args.max_new_tokens,
                                       batch_size=args.batch_size)
        del model
        gc.collect()  # one policy in memory at a time
    _note(f"scoring with {args.reward_model} ...")
    scorer = reward_scorer(args.reward_model)
    questions = answers["--model"][0]
    r = compare_answers(questions, answers["--model"][1], answers["--against"][1], scorer)
    _table([("A (--model)", args.model), ("B (--against)", args.against),
            ("reward model", args.reward_model), ("data", f"{args.data} ({r.prompts} prompts)"),
            ("A wins/ties/losses", f"{r.wins}/{r.ties}/{r.losses}"), ("win rate of A", r.win_rate),
            ("mean reward A", r.reward_a), ("mean reward B", r.reward_b)])
    return {"model": args.model, "against": args.against, "reward_model": args.reward_model,
            "data": args.data, **r.as_dict()}


_COMMANDS = {"perplexity": _perplexity, "accuracy": _accuracy, "pairs": _pairs,
             "compare": _compare}
