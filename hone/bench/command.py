"""`hone bench ROW`: the command's options, the per-row default shapes, the matmul ceiling MFU
divides by, and the one JSON line printed last.

The default shapes are the benchmark rows of benchmarks/RESULTS.md, so `hone bench sft` times
what `benchmarks/train.py` times for hone (one process, one row):
- sft, lora: --batch 4 rows x --seq 128 tokens;
- dpo: --batch 4 pairs, --seq 128 = prompt + completion (--prompt-len, default half of --seq);
- decode: --batch 8 prompts of --prompt-len 32 tokens, --seq 64 new tokens, greedy;
- grpo: --batch 2 prompts x --generations 4, --seq 64 = prompt + new tokens (--prompt-len,
  default half), KL --beta 0.04;
- rollout: --batch 32 prompts of --prompt-len 64 x --generations 8 samples of up to --seq new
  tokens (long-tail 512, uniform 128), --engine static or paged (--max-seqs 64 slots);
  hone/bench/rollout.py says how lengths are drawn and what is counted.
tokens_per_s counts the tokens one step processes (tokens_per_step): B x T for sft and lora,
2 x pairs x T for dpo, B x new tokens for decode, prompts x generations x T for grpo.
The training rows take --remat (train.remat, default none as in the benchmark rows) so long
rows fit; the JSON's "remat" is read back from the model the row built.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from typing import Callable

from hone.bench.timing import first_and_median, peak_rss_mb
from hone.config.schema import TrainSection
from hone.errors import InputError

ROWS = ("sft", "lora", "dpo", "decode", "grpo", "rollout")
TRAINING_ROWS = ("sft", "lora", "dpo", "grpo")  # the rows with a backward pass: --remat
# train.remat's settings, from the config schema so the two never differ.
REMATS = next(f.metadata["choices"] for f in dataclasses.fields(TrainSection)
              if f.name == "remat")
# row -> (batch, seq, prompt_len or None = half of seq); see the module docstring.
SHAPES = {"sft": (4, 128, None), "lora": (4, 128, None), "dpo": (4, 128, None),
          "decode": (8, 64, 32), "grpo": (2, 64, None), "rollout": (32, None, 64)}
GENERATIONS = {"grpo": 4, "rollout": 8}  # --generations' default per row
ROLLOUT_LIMITS = {"long-tail": 512, "uniform": 128}  # rollout: --seq's default per workload
MATMUL_SIZE = 2048  # the ceiling's square matmul on a CPU: 2 x 2048^3 FLOPs a call
# On an accelerator: a 2048^3 bf16 product is ~0.1 ms of a TPU v5e, less than a call's dispatch,
# and measured 23 TFLOP/s there, below what the bench's own rows reached (38 TFLOP/s).
ACCELERATOR_MATMUL_SIZE = 8192

DESCRIPTION = """\
Time one step of a row on a random-init model and print, last, one JSON line:
median_s, tokens_per_s, first_step_s (trace + compile + run), peak_rss_mb, flops_per_step and
mfu = flops_per_step / median_s / ceiling_gflops (a jitted 2048^3 matmul timed in the same
process; bf16: bf16 inputs, fp32 accumulation). The FLOP formulas are in hone/bench/flops.py.

rows and default shapes (those of benchmarks/RESULTS.md):
  sft, lora   --batch 4 rows, --seq 128 tokens (lora: rank 16 on q/k/v/o/gate/up/down)
  dpo         --batch 4 pairs, --seq 128 = 64 prompt + 64 completion tokens
  decode      --batch 8 prompts of --prompt-len 32, --seq 64 new tokens, greedy
  grpo        --batch 2 prompts x --generations 4, --seq 64 = 32 prompt + 32 new tokens
  rollout     --batch 32 prompts of --prompt-len 64 x --generations 8, up to --seq new tokens
              (--workload long-tail: 512, lengths long-tailed; uniform: 128), --engine

examples:
  hone bench sft
  hone bench lora --precision bf16 --steps 10
  hone bench decode --batch 32
  hone bench dpo --two-rows
  hone bench sft --seq 2048 --batch 1 --remat full
  hone bench grpo --model tiny --steps 2 --beta 0
  hone bench rollout --workload long-tail --engine paged --steps 0   (one rollout, compile
                                                                       included)
  hone bench rollout --workload uniform --tunix   (Tunix's vanilla sampler; source checkout)"""


def add_bench_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("row", choices=ROWS, help="what to time")
    p.add_argument("--model", default="smollm2-135m",
                   help="anything hone.load_model takes; a preset is random init "
                   "(smollm2-135m, the default; tiny)")
    p.add_argument("--batch", type=int, default=None,
                   help="rows (sft, lora), pairs (dpo), prompts (decode, grpo)")
    p.add_argument("--seq", type=int, default=None,
                   help="tokens per sequence; decode: new tokens")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="prompt tokens (decode 32; dpo, grpo: half of --seq)")
    p.add_argument("--generations", type=int, default=None,
                   help="grpo (default 4), rollout (default 8): samples per prompt")
    p.add_argument("--workload", default="long-tail", choices=("long-tail", "uniform"),
                   help="rollout: the samples' lengths (hone/bench/rollout.py)")
    p.add_argument("--engine", default="paged", choices=("static", "paged"),
                   help="rollout: the lockstep sampler or the paged rollout engine")
    p.add_argument("--tunix", action="store_true",
                   help="rollout: Tunix's vanilla sampler on the same workload instead of "
                   "--engine (benchmarks/rollout_tunix.py in the Tunix venv; source checkout)")
    p.add_argument("--max-seqs", type=int, default=64,
                   help="rollout, paged engine: sequences decoded at once")
    p.add_argument("--num-pages", type=int, default=None,
                   help="rollout, paged engine: pages in the pool (default: room for "
                   "--max-seqs sequences of the longest length; fewer preempt when full)")
    p.add_argument("--window", type=int, default=None,
                   help="rollout, paged engine: decode steps a window (default: the engine's "
                   "for this backend)")
    p.add_argument("--overlap", default=None, choices=("on", "off"),
                   help="rollout, paged engine: dispatch each window before reading the one "
                   "before (default: the engine's for this backend)")
    p.add_argument("--prompt-lens", default=None, metavar="LO-HI",
                   help="rollout: each prompt's length drawn between LO and HI tokens, anew for "
                   "every rollout (RL prompts vary), instead of --prompt-len for all")
    p.add_argument("--attention", default=None,
                   choices=("xla", "loop", "dense", "ragged", "tpu", "gpu", "ragged-interpret"),
                   help="rollout, paged engine: the attention over pages (PagedEngine's "
                   "`attention`; xla: attend_step's loop of sums; loop, dense: XLA's products over "
                   "pages, a page column at a time or all gathered; default: the engine's for "
                   "this backend)")
    p.add_argument("--warmup", action="store_true",
                   help="rollout, paged engine: compile the engine's programs before the first "
                   "rollout (`PagedEngine.warmup`; reported as warmup_s, warmup_programs)")
    p.add_argument("--beta", type=float, default=0.04,
                   help="grpo: KL coefficient (0: no reference model)")
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps after the first (compiling) one (default 5)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="bf16: bf16 compute, fp32 weights (decode: bf16 weights)")
    p.add_argument("--remat", default=None, choices=REMATS,
                   help="sft, lora, dpo, grpo: train.remat, the gradient checkpointing of "
                   "each block (memory for recompute, for long rows); default none")
    p.add_argument("--two-rows", action="store_true",
                   help="dpo, grpo: a row per sequence (prompt + chosen, prompt + rejected; "
                   "prompt + sample), as Tunix and PyTorch run it, instead of one row per "
                   "pair or prompt group with the prompt computed once")
    p.add_argument("--seed", type=int, default=0)
    return p


@functools.cache
def matmul_ceiling(precision: str = "fp32", n: int | None = None, calls: int = 5) -> float:
    """GFLOP/s of a jitted n x n x n matmul (median of `calls` after a compiling one; n: default
    matmul_size()); bf16: bf16 inputs accumulated in fp32. Cached: measured once per process."""
    import jax
    import jax.numpy as jnp
    n = n or matmul_size()
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = jax.random.normal(kb, (n, n), dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    _, med, _ = first_and_median(lambda: matmul(a, b), calls, wait=jax.block_until_ready)
    return 2.0 * n ** 3 / med / 1e9


def matmul_size() -> int:
    """The ceiling's matmul size on this backend."""
    import jax
    return MATMUL_SIZE if jax.default_backend() == "cpu" else ACCELERATOR_MATMUL_SIZE


def _shape(args) -> tuple[int, int, int]:
    """(batch, seq, prompt_len) from the options and the row's defaults, checked."""
    batch, seq, prompt = SHAPES[args.row]
    if args.generations is None:
        args.generations = GENERATIONS.get(args.row, 4)
    if args.row == "rollout":
        seq = ROLLOUT_LIMITS[args.workload]
    batch = args.batch if args.batch is not None else batch
    seq = args.seq if args.seq is not None else seq
    prompt = args.prompt_len if args.prompt_len is not None else (prompt or seq // 2)
    if args.row == "rollout" and args.steps < 0 or args.row != "rollout" and args.steps < 1:
        raise InputError(f"--steps must be at least {0 if args.row == 'rollout' else 1}, got "
                         f"{args.steps}")
    for name, value in (("--batch", batch), ("--seq", seq),
                        ("--generations", args.generations), ("--max-seqs", args.max_seqs),
                        ("--num-pages", 1 if args.num_pages is None else args.num_pages)):
        if value < 1:
            raise InputError(f"{name} must be at least 1, got {value}")
    if args.row in ("dpo", "grpo") and not 0 < prompt < seq:
        raise InputError(f"--prompt-len must be between 1 and --seq - 1 ({seq - 1}) for "
                         f"{args.row}, got {prompt}")
    if args.row in ("decode", "rollout") and prompt < 1:
        raise InputError(f"--prompt-len must be at least 1, got {prompt}")
    if args.tunix and (args.row != "rollout" or args.model != "smollm2-135m"
                       or args.precision != "fp32"):
        raise InputError("--tunix times the rollout row of smollm2-135m's shape in fp32 "
                         "(benchmarks/rollout_tunix.py builds that model)")
    if args.row not in TRAINING_ROWS and args.remat is not None:
        raise InputError(f"--remat applies to {', '.join(TRAINING_ROWS)} (a backward pass); "
                         f"{args.row} has none")
    return batch, seq, prompt


def prompt_range(text: str | None) -> tuple[int, int] | None:
    """--prompt-lens "LO-HI" as (LO, HI), 1 <= LO <= HI."""
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise InputError(f"must be LO-HI with 1 <= LO <= HI, got {text!r}", key="--prompt-lens")
    return lo, hi


def measure(args, log: Callable = print):
    """Run the row the options name; returns (Measured, batch, seq, prompt_len)."""
    from hone.bench.grpo import grpo_row
    from hone.bench.rollout import rollout_row, tunix_row
    from hone.bench.rows import decode_row, dpo_row, train_row
    batch, seq, prompt = _shape(args)
    common = dict(model=args.model, repeats=args.steps, precision=args.precision,
                  seed=args.seed, log=log)
    if args.row in TRAINING_ROWS:
        common["remat"] = args.remat or "none"
    if args.row in ("sft", "lora"):
        got = train_row(args.row, batch=batch, seq=seq, **common)
    elif args.row == "dpo":
        got = dpo_row(pairs=batch, prompt_len=prompt, completion_len=seq - prompt,
                      shared_prompt=not args.two_rows, **common)
    elif args.row == "decode":
        got = decode_row(batch=batch, prompt_len=prompt, new_tokens=seq, **common)
    elif args.row == "rollout" and args.tunix:
        got = tunix_row(args.workload, prompts=batch, generations=args.generations,
                        prompt_len=prompt, limit=seq, repeats=args.steps, seed=args.seed,
                        log=log)
    elif args.row == "rollout":
        got = rollout_row(args.model, args.workload, args.engine, prompts=batch,
                          generations=args.generations, prompt_len=prompt, limit=seq,
                          max_seqs=args.max_seqs, num_pages=args.num_pages,
                          window=args.window, overlap=None if args.overlap is None
                          else args.overlap == "on", prompt_lens=prompt_range(args.prompt_lens),
                          warmup=args.warmup, attention=args.attention,
                          **{k: v for k, v in common.items()
                                                     if k != "model"})
    else:
        got = grpo_row(prompts=batch, generations=args.generations, prompt_len=prompt,
                       new_tokens=seq - prompt, beta=args.beta,
                       shared_prompt=not args.two_rows, **common)
    return got, batch, seq, prompt


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def result(args, got, batch: int, seq: int, prompt: int, ceiling_gflops: float) -> dict:
    """The JSON object `hone bench` prints."""
    out = {"row": args.row, "model": args.model, "batch": batch, "seq": seq, "steps": args.steps,
           "precision": args.precision}
    if "remat" in got.extra:  # what the row's model was built with, beside the other settings
        out["remat"] = got.extra["remat"]
    out |= {"median_s": _sig(got.median_s),
            "tokens_per_step": got.tokens, "tokens_per_s": _sig(got.tokens / got.median_s),
            "first_step_s": _sig(got.first_s),
            "peak_rss_mb": round(got.peak_mb if got.peak_mb is not None else peak_rss_mb(), 1),
            "flops_per_step": round(got.flops),
            "achieved_gflops": _sig(got.flops / got.median_s / 1e9),
            "ceiling_gflops": _sig(ceiling_gflops),
            "mfu": _sig(got.flops / got.median_s / (ceiling_gflops * 1e9), 4)}
    if args.row in ("dpo", "decode", "grpo", "rollout"):
        out["prompt_len"] = prompt
    if args.row in ("dpo", "grpo"):
        out["shared_prompt"] = not args.two_rows
    if args.row in ("grpo", "rollout"):
        out["generations"] = args.generations
    if got.first_loss is not None:
        out["first_loss"] = _sig(got.first_loss)
    out.update({k: _sig(v) if isinstance(v, float) else v for k, v in got.extra.items()})
    return out


def run_bench(args) -> int:
    """`hone bench`: progress lines, then the JSON line."""
    log = lambda msg: print(f"hone bench: {msg}", flush=True)  # noqa: E731
    got, batch, seq, prompt = measure(args, log)
    if got.peak_mb is None:
        got.peak_mb = peak_rss_mb()  # before the ceiling's arrays
    log(f"measuring the {args.precision} matmul ceiling ({matmul_size()}^3, jitted)")
    ceiling = matmul_ceiling(args.precision)
    log(f"ceiling {ceiling:.1f} GFLOP/s")
    print(json.dumps(result(args, got, batch, seq, prompt, ceiling)), flush=True)
    return 0
