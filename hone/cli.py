"""`hone <command> ...`: the command-line dispatch table.

Exit codes: 0 success; 2 bad input (an InputError, printed as one paragraph); 1 anything else.
"""

from __future__ import annotations

import argparse
import sys
import time

from hone.errors import InputError

def _stream_printer(tokenizer, out=sys.stdout):
    """An on_step callback that prints the new text of row 0 as it grows."""
    shown = [0]

    def on_step(tokens):
        ids = [int(t) for t in tokens[0] if int(t) not in tokenizer.eos_ids]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            return
        out.write(text[shown[0]:])
        out.flush()
        shown[0] = len(text)

    return on_step


def _answer(model, tokenizer, prompt: str, *, chat: bool, max_new_tokens: int,
            temperature: float, top_k=None, top_p=None, seed: int = 0):
    from hone.sampling.generate import generate
    if chat:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                               add_generation_prompt=True)
    start = time.perf_counter()
    out = generate(model, tokenizer, [prompt], max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   on_step=_stream_printer(tokenizer))[0]
    seconds = time.perf_counter() - start
    print(f"\n[{len(out.tokens)} tokens in {seconds:.1f} s, finish: {out.finish_reason}]")
    return out


def cmd_generate(args) -> int:
    import hone
    model = hone.load_model(args.model, dtype=args.dtype)
    tokenizer = hone.load_tokenizer(args.model)
    _answer(model, tokenizer, args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    return 0


def cmd_demo(args) -> int:
    from hone.recipes.demo import run_demo
    run_demo(steps=args.steps, questions=args.questions)
    return 0


def cmd_train(args) -> int:
    """sft, dpo, kto, reward, grpo, ppo, distill: load the command's config class and run its recipe."""
    import jax

    from hone.config import COMMANDS, load_config
    from hone.parallel import initialize
    from hone.train.loop import Interrupted
    cfg = load_config(COMMANDS[args.command], args.config, args.overrides)
    # Join a multi-process run before JAX touches a device; only process 0 prints.
    main = not initialize(cfg.distributed) or jax.process_index() == 0
    log = print if main else (lambda *a, **k: None)
    from hone.recipes import recipe
    run = recipe(args.command)
    try:
        run(cfg, log=log)
    except Interrupted as e:
        print(f"hone {args.command}: {e}", file=sys.stderr)
        return 1
    log(f"done: {cfg.run_dir} (metrics.jsonl, checkpoints/, config.yaml)")
    return 0


def cmd_pipeline(args) -> int:
    """Stages of training commands in order, each from an earlier stage's exported model."""
    from hone.pipeline import run_pipeline
    from hone.train.loop import Interrupted
    try:
        run_pipeline(args.config, args.overrides)
    except Interrupted as e:
        print(f"hone pipeline: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_export(args) -> int:
    from hone.export import export_model, export_run
    if args.run is not None:
        out = export_run(args.run, args.out, args.format, args.quant, args.step)
    else:
        if args.step is not None:
            print("error: --step names a checkpoint of --run", file=sys.stderr)
            return 2
        out = export_model(args.model, args.out, args.format, args.quant)
    kind = args.format + (f", {args.quant}" if args.quant else "")
    print(f"exported {args.run or args.model} -> {out} ({kind})")
    return 0


def cmd_serve(args) -> int:
    """An OpenAI-compatible chat-completions server on the rollout engine (hone/serve/)."""
    from hone.serve import Server
    if args.run is not None:
        from hone.export import load_run_model
        model, tokenizer, _ = load_run_model(args.run)
    else:
        from hone.tokenizer import load_tokenizer
        from hone.weights.loading import load_model
        model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    server = Server(model, tokenizer, name=args.name or args.run or args.model, host=args.host,
                    port=args.port, seed=args.seed, max_seqs=args.max_seqs, max_len=args.max_len)
    print(f"serving {server.name} at {server.url} (POST /chat/completions, GET /models)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def cmd_eval(args) -> int:
    """perplexity, accuracy, pairs, compare: see hone/eval/command.py."""
    from hone.eval.command import run_eval
    return run_eval(args)


def cmd_report(args) -> int:
    from hone.report import report_files, write_report
    out = write_report(args.run, args.out)
    for path in report_files(out.parent):
        print(path)
    return 0


def cmd_bench(args) -> int:
    """sft, lora, dpo, decode, grpo: see hone/bench/command.py."""
    from hone.bench.command import run_bench
    return run_bench(args)


def cmd_doctor(args) -> int:
    """Backend, devices, memory, kernels, attention path, versions: see hone/doctor.py."""
    from hone.doctor import run_doctor
    return run_doctor(args)


def cmd_plan(args) -> int:
    """Per-device memory of a run before running it: see hone/plan/command.py."""
    from hone.plan.command import run_plan
    return run_plan(args)


def _add_train_command(sub, name: str, func, what: str) -> None:
    p = sub.add_parser(name, help=what, description=(
        f"{what}.\n\nRunning the same command again with the same run_dir resumes from the "
        f"newest checkpoint.\n\nexamples:\n  hone {name} --config configs/tiny/{name}.yaml\n"
        f"  hone {name} --config configs/tiny/{name}.yaml train.max_steps=200 train.lr=3e-4"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="a YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides of config keys, e.g. train.lr=3e-4")
    p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hone", description=(
        "Post-train large language models in JAX.\n\nexamples:\n"
        "  hone demo\n"
        "  hone sft --config configs/tiny/sft.yaml\n"
        "  hone generate --model smollm2-135m-instruct --chat --prompt 'Hi!'\n"
        "  hone generate --model ./my-hf-folder --prompt 'Once upon a time' --temperature 0.8\n"
        "  hone bench sft --model tiny --steps 2"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete a prompt, streaming tokens as they come",
                         description="Complete one prompt with a model, streaming the answer.\n\n"
                         "example:\n  hone generate --model smollm2-135m-instruct --chat "
                         "--prompt 'What is the capital of France?'",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("--model", required=True,
                     help="a Hugging Face folder, a .gguf file or a preset name")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt in the model's chat template as a user turn")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    gen.set_defaults(func=cmd_generate)

    srv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible "
                         "/v1/chat/completions", description="An OpenAI-compatible server "
                         "(chat completions with tools and streaming) on the rollout engine; "
                         "every choice also carries the sampled token ids and log-probs "
                         "(`hone`).\n\nexamples:\n"
                         "  hone serve --model smollm2-135m-instruct --port 8000\n"
                         "  hone serve --run runs/demo",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    what = srv.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a Hugging Face folder, a .gguf file or a preset name")
    what.add_argument("--run", help="a run folder: its newest checkpoint's model")
    srv.add_argument("--host", default="127.0.0.1", help="no authentication: keep it local")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--name", default=None, help="the model id clients see (default: the "
                     "--model or --run given)")
    srv.add_argument("--max-seqs", type=int, default=8, help="sequences decoding at once")
    srv.add_argument("--max-len", type=int, default=2048,
                     help="tokens of one conversation at most (prompt and reply)")
    srv.add_argument("--seed", type=int, default=0,
                     help="keys of requests that give no seed of their own")
    srv.set_defaults(func=cmd_serve)

    _add_train_command(sub, "sft", cmd_train, "Supervised fine-tuning (full, LoRA or QLoRA)")
    _add_train_command(sub, "dpo", cmd_train,
                       "Preference tuning: DPO, IPO, hinge, robust DPO, SimPO or ORPO")
    _add_train_command(sub, "kto", cmd_train, "Preference tuning from unpaired examples "
                       "labelled desirable or undesirable (KTO)")
    _add_train_command(sub, "reward", cmd_train, "A reward model trained on preference pairs")
    _add_train_command(sub, "grpo", cmd_train,
                       "RL with group advantages: GRPO, Dr.GRPO, DAPO, GSPO, RLOO")
    _add_train_command(sub, "ppo", cmd_train, "RL with a critic: PPO, GAE, KL-shaped rewards")
    _add_train_command(sub, "distill", cmd_train, "Knowledge distillation from a frozen teacher: "
                       "logits (online, cached top-k), attention, features, sequence-level, "
                       "on-policy (GKD)")

    exp = sub.add_parser("export", help="write a run's trained model as a Hugging Face folder, "
                         "a PEFT adapter or a GGUF file",
                         description="Export the newest checkpoint of a run (or the one of "
                         "--step), or any model.\n\n"
                         "examples:\n"
                         "  hone export --run runs/tiny-sft --out exported/\n"
                         "  hone export --run runs/smollm2-sft-lora --out adapter/ --format peft\n"
                         "  hone export --run runs/demo --out model.gguf --format gguf "
                         "--quant q8_0\n"
                         "  hone export --model smollm2-135m-instruct --out smol.gguf "
                         "--format gguf --quant q4_k_m",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    what = exp.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", help="the run folder (run_dir of the config)")
    what.add_argument("--model", help="any model source load_model takes (a preset, a shipped "
                      "model, a Hugging Face folder, a .gguf file)")
    exp.add_argument("--out", required=True, help="the folder (hf, peft) or .gguf file to write")
    exp.add_argument("--format", default="hf", choices=["hf", "peft", "gguf"],
                     help="hf: merged weights transformers loads as-is (default); "
                     "peft: adapter_config.json + adapter_model.safetensors; "
                     "gguf: one llama.cpp file, adapters merged, tokenizer embedded")
    exp.add_argument("--quant", default=None,
                     help="GGUF tensor type: f32 (default), f16, bf16, q8_0, q4_k_m")
    exp.add_argument("--step", type=int, default=None,
                     help="with --run: the checkpoint of this step (one the run kept, "
                     "checkpoint.keep) instead of the newest")
    exp.set_defaults(func=cmd_export)

    rep = sub.add_parser("report", help="plot a run's metrics: PNGs and a self-contained HTML "
                         "page", description="Plot a run's metrics.jsonl (loss, reward, KL, "
                         "accuracy, learning rate,\nthroughput, gradient norm, guard events) as "
                         "PNGs and one self-contained report.html.\n\nexamples:\n"
                         "  hone report runs/tiny-sft\n"
                         "  hone report runs/tiny-grpo --out grpo-report/",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("run", help="the run folder (run_dir of the config)")
    rep.add_argument("--out", default=None, help="the folder to write (default RUN/report)")
    rep.set_defaults(func=cmd_report)

    from hone.eval.command import add_eval_parser
    add_eval_parser(sub).set_defaults(func=cmd_eval)  # hone eval perplexity|accuracy|pairs|compare

    from hone.bench.command import DESCRIPTION as BENCH_DESCRIPTION, add_bench_arguments
    bench = sub.add_parser("bench", help="time one sft, lora, dpo, decode or grpo step on a "
                           "random-init model: seconds, tokens/s, memory, MFU",
                           description=BENCH_DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(bench).set_defaults(func=cmd_bench)

    pipe = sub.add_parser("pipeline", help="training stages in order (e.g. sft -> reward -> "
                          "ppo), each from an earlier stage's model; resumable",
                          description="Run the stages of a pipeline file in order: each is a "
                          "training command\nwith its own config, started from the model an "
                          "earlier stage exported\n(<run_dir>/<stage>/export). Running the same "
                          "command again skips finished\nstages and resumes the interrupted one "
                          "from its newest checkpoint.\n\nexamples:\n"
                          "  hone pipeline --config configs/tiny/pipeline.yaml\n"
                          "  hone pipeline --config configs/tiny/pipeline_dpo.yaml "
                          "run_dir=runs/my-pipeline\n"
                          "  hone pipeline --config configs/tiny/pipeline.yaml "
                          "ppo.train.max_steps=20   # STAGE.key=value",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    pipe.add_argument("--config", required=True, help="a pipeline YAML file (run_dir:, stages:)")
    pipe.add_argument("overrides", nargs="*", metavar="key=value",
                      help="run_dir=FOLDER, or STAGE.section.key=value for one stage")
    pipe.set_defaults(func=cmd_pipeline)

    demo = sub.add_parser("demo", help="fine-tune the shipped SmolLM2-135M-Instruct and show "
                          "held-out accuracy before and after",
                          description="LoRA fine-tuning of the real SmolLM2-135M-Instruct on "
                          "bundled arithmetic problems, with held-out accuracy before and after."
                          "\n\nexample:\n  hone demo --steps 30",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    demo.add_argument("--questions", type=int, default=64,
                      help="held-out problems to score before and after (default 64)")
    demo.set_defaults(func=cmd_demo)

    doc = sub.add_parser("doctor", help="what this machine gives hone: backend, devices, memory, "
                         "kernels, attention path, versions against the tested set",
                         description="Print the JAX backend, its devices and their memory, "
                         "whether hone's CPU\nkernels run, which attention path "
                         "model.attention=auto takes here, and the\ninstalled versions against "
                         "requirements/lock.txt and hone's ranges. Exits 0.\n\nexamples:\n"
                         "  hone doctor\n  hone doctor --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    from hone.doctor import DEFAULT_LOCK
    doc.add_argument("--lock", default=DEFAULT_LOCK,
                     help="the tested set to compare with (default: the checkout's "
                     "requirements/lock.txt, where hone is installed from a checkout)")
    doc.set_defaults(func=cmd_doctor)

    from hone.plan.command import DESCRIPTION as PLAN_DESCRIPTION, add_plan_arguments
    plan = sub.add_parser("plan", help="per-device memory of a training run before running "
                          "it: does it fit, and what would make it fit",
                          description=PLAN_DESCRIPTION,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(plan).set_defaults(func=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"hone {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
