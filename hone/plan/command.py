"""`hone plan`: the command line of the memory planner and its report (a text table, or JSON).

Two ways in, one path through: `--config FILE` loads a training config as `hone <command>`
would; `--preset NAME` starts from the command's defaults with model.source = NAME. Both take
the same dotted key=value overrides, and --seq / --batch are shorthands for the row length
(data.max_length; RL: grpo/ppo.max_new_tokens) and train.batch_size. The architecture comes from
a preset name or a Hugging Face folder's config.json.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from hone.errors import InputError
from hone.plan.budget import HEADROOM, Plan, make_plan, suggestions
from hone.plan.inputs import COMMANDS, PlanInput, from_config
from hone.plan.weights import transfer_bytes

DESCRIPTION = """\
Per-device bytes of a training run before running it: parameters, gradients, Adam state,
activations under train.remat, the LM head's logits chunk, the attention working set, an RL
rollout's KV cache, reference/teacher copies and QLoRA bases, on the configured mesh; whether it
fits a device's memory, and the smallest changes that make it fit.

examples:
  hone plan --config configs/tiny/sft.yaml
  hone plan --preset llama3.1-8b --command sft --seq 2048 --batch 8 --device-memory 80GiB
  hone plan --preset llama3.1-8b --command sft --seq 2048 --batch 8 --devices 8 \\
      mesh.fsdp=8 train.remat=full --device-memory 16GiB
  hone plan --preset qwen3-30b-a3b --command grpo --batch 64 grpo.group_size=8 --json"""

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2 ** 10,
          "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SECTIONS = ("dpo", "kto", "reward", "grpo", "ppo", "distill")


def parse_bytes(text: str) -> float:
    """"80GB" (10^9), "80GiB" (2^30), "16e9" -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"not a memory size: {text!r} (e.g. 80GB, 80GiB, 16e9)",
                         key="--device-memory")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def detected_memory() -> tuple[float, str]:
    """(bytes, where from): the first JAX device's bytes_limit, else host RAM / devices."""
    import os

    import jax
    devices = jax.devices()
    stats = devices[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return float(stats["bytes_limit"]), f"{devices[0].device_kind} bytes_limit"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram / len(devices), f"host RAM / {len(devices)} {devices[0].platform} device(s)"


def _command_of(path: str | None, given: str | None) -> str:
    if given:
        return given
    if path:
        from hone.config.yaml_io import read_yaml
        keys = set(read_yaml(Path(path)) or {})
        named = [s for s in _SECTIONS if s in keys]
        if len(named) == 1:
            return named[0]
    return "sft"


def _architecture(source: str):
    """(the language model's ModelConfig, its vision tower's and connector's parameters: 0 for
    a text model)."""
    from hone.models.config import PRESETS
    if source in PRESETS:
        return PRESETS[source], 0
    folder = Path(source)
    if (folder / "config.json").is_file():
        from hone.weights.hf_config import config_from_hf
        from hone.weights.hf_vision import vision_family, vision_model_config
        if vision_family(folder):  # counted on the model built abstractly: no weights read
            return _vision_architecture(vision_model_config(folder))
        return config_from_hf(json.loads((folder / "config.json").read_text()),
                              str(folder / "config.json")), 0
    raise InputError("the planner needs a preset name or a Hugging Face folder with a "
                     "config.json", path=source, key="model.source")


def _vision_architecture(build):
    """(text config, parameters outside the language model) of a vision-language model, from
    its modules' shapes (`build` makes the model; nnx.eval_shape allocates nothing)."""
    import jax
    from flax import nnx
    model = nnx.eval_shape(build)
    every = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    text = sum(x.size for x in jax.tree.leaves(nnx.state(model.text, nnx.Param)))
    return model.text.config, every - text


def build_input(args) -> PlanInput:
    from hone.config import COMMANDS as CLASSES, load_config
    command = _command_of(args.config, args.plan_command)
    overrides = list(args.overrides)
    if args.preset:
        overrides.insert(0, f"model.source={args.preset}")
    if args.batch:
        overrides.append(f"train.batch_size={args.batch}")
    if args.seq:
        key = f"{command}.max_new_tokens" if command in ("grpo", "ppo") else "data.max_length"
        overrides.append(f"{key}={args.seq}")
    cfg = load_config(CLASSES[command], args.config, overrides)
    fixed = [getattr(cfg.mesh, a) for a in ("data", "fsdp", "tp", "seq")]
    devices = args.devices or math.prod(s for s in fixed if s != -1)
    arch, vision = _architecture(cfg.model.source)
    teacher = _architecture(cfg.teacher.source)[0] if command == "distill" else None
    return from_config(command, cfg, arch=arch, devices=devices, teacher=teacher,
                       vision_params=vision)


def _unit(peak: float) -> tuple[str, float]:
    """GiB, or MiB for a plan under 1 GiB (the tiny configs)."""
    return ("GiB", 2 ** 30) if peak >= 2 ** 30 else ("MiB", 2 ** 20)


def describe(p: PlanInput) -> str:
    how = ("QLoRA " + p.quantize if p.quantize != "none" else "LoRA") + f" rank {p.lora_rank}" \
        if p.lora_rank else "full fine-tuning"
    def count(n: int) -> str:
        return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"

    # Mixture of experts: every expert is resident; a token's activations see the active ones.
    active = f" ({count(p.arch.num_params(active=True))} active)" if p.arch.moe else ""
    tower = (f" (+ {count(p.vision_params)} in the vision tower and connector"
             f"{', frozen' if p.vision_frozen else ''})" if p.vision_params else "")
    return (f"{p.command}: {count(p.arch.num_params())} parameters{active}{tower}, {how}; "
            f"{p.rows} rows x {p.row_len} tokens per step, grad_accum {p.grad_accum}; "
            f"remat {p.remat}{' (scan)' if p.scan else ' (loop)'}, precision {p.precision}, "
            f"weights {p.param_dtype}; mesh data={p.data} fsdp={p.fsdp} tp={p.tp} seq={p.seq}")


def text_report(plan: Plan, memory: float, source: str, fixes) -> str:
    unit, scale = _unit(plan.peak)
    out = [describe(plan.input), "", f"{'per device':<56}{unit:>9}"]
    for title, lines in (("persistent", plan.persistent), ("update", plan.update),
                         ("update working sets (only the largest counts)", plan.working),
                         ("rollout", plan.rollout), ("host memory", plan.host)):
        lines = {k: v for k, v in lines.items() if v}
        if not lines:
            continue
        out.append(f"{title}:")
        out += [f"  {k:<54}{v / scale:9.2f}" for k, v in lines.items()]
    both = plan.input.staleness > 0  # asynchronous RL: rollout and update alive at once
    title = "peak (persistent + update + rollout)" if both else "peak (persistent + larger phase)"
    out.append(f"{title:<56}{plan.peak / scale:9.2f}")
    if plan.input.rollout_rows:
        out.append(f"weights sent to rollout hosts per update: "
                   f"{transfer_bytes(plan.input) / 2 ** 20:,.1f} MiB")
    limit = HEADROOM * memory
    verdict = "fits" if plan.fits(memory) else "does NOT fit"
    out.append(f"device memory {memory / 2 ** 30:.2f} GiB ({source}): {verdict} "
               f"({int(HEADROOM * 100)}% = {limit / 2 ** 30:.2f} GiB usable)")
    if not plan.fits(memory):
        if fixes:
            out.append("smallest changes that fit:")
            out += [f"  {name:<50} -> {peak / 2 ** 30:.2f} GiB" for name, peak in fixes]
        else:
            out.append("no combination of up to three changes fits; more devices (mesh.fsdp) "
                       "or a smaller model")
    return "\n".join(out)


def json_report(plan: Plan, memory: float, source: str, fixes) -> str:
    p = plan.input
    return json.dumps({
        "command": p.command, "rows": p.rows, "row_len": p.row_len,
        "vision_params": p.vision_params,
        "mesh": {"data": p.data, "fsdp": p.fsdp, "tp": p.tp, "seq": p.seq},
        "persistent": plan.persistent, "update": plan.update, "working": plan.working,
        "rollout": plan.rollout, "staleness": p.staleness,
        "transfer_bytes": transfer_bytes(p) if p.rollout_rows else 0,
        "host": plan.host, "peak_bytes": plan.peak, "device_bytes": memory,
        "device_source": source, "headroom": HEADROOM, "fits": plan.fits(memory),
        "suggestions": [{"set": name, "peak_bytes": peak} for name, peak in fixes]}, indent=1)


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--config", default=None, help="a training config (YAML)")
    parser.add_argument("--preset", default=None, help="a model preset (sets model.source)")
    # dest: `command` is the subcommand's own name (the error messages print it)
    parser.add_argument("--command", dest="plan_command", default=None, choices=COMMANDS,
                        help="the training command (default: from the config's sections, "
                        "else sft)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per row: "
                        "data.max_length (grpo/ppo: max_new_tokens)")
    parser.add_argument("--batch", type=int, default=None, help="train.batch_size")
    parser.add_argument("--devices", type=int, default=None, help="devices the mesh spans "
                        "(default: the product of its fixed axes)")
    parser.add_argument("--device-memory", default=None, help="bytes per device, e.g. 80GiB, "
                        "16GB (default: detected from JAX's devices, else host RAM)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. train.remat=full mesh.fsdp=8")
    return parser


def run_plan(args) -> int:
    if not args.config and not args.preset:
        raise InputError("give --config FILE or --preset NAME", key="--config")
    plan = make_plan(build_input(args))
    if args.device_memory:
        memory, source = parse_bytes(args.device_memory), "given"
    else:
        memory, source = detected_memory()
    fixes = [] if plan.fits(memory) else suggestions(plan.input, memory)
    print((json_report if args.json else text_report)(plan, memory, source, fixes))
    return 0
