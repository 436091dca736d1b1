"""`hone dpo`: preference tuning (DPO, IPO, hinge, robust DPO, SimPO, ORPO) wired from a config.

Chosen and rejected sequences go through the policy in one forward pass ([2B, T] batches: rows
0..B-1 chosen, B..2B-1 rejected). The reference log-probabilities come from one of:
- "copy": a frozen copy of the starting weights, passed to the jitted step as an argument;
- "adapters_off": the same model with every LoRA adapter zeroed (the frozen base), so the
  reference costs a second forward pass but no second copy of the weights;
- "precomputed": one pass over the training pairs before the first step, cached next to the run
  (run_dir/reference_logps.npz) and carried through shuffling with the pairs.
SimPO and ORPO need no reference model, and none is built or run. The mode and the reference
model come from `hone.train.reference`, the one rule DPO, GRPO and PPO share.

Per-pair losses are computed under vmap and summed over real pairs, divided by the number of
real pairs in the whole batch, so gradient accumulation equals one large batch here too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import DPOConfig
from hone.data.preference import load_pairs
from hone.data.shared_prefix import work_tokens
from hone.data.vision_pairs import load_vision_pairs
from hone.losses.preference import pair_count
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, compile_steps, make_layout, open_run, summed_eval
from hone.train.dpo_objective import make_dpo_loss, means, sequence_logps
from hone.train.loop import LoopSpec, run_loop
from hone.train.reference import cached_halves, reference_mode, reference_model
from hone.train.state import tree_bytes, unflatten
from hone.weights.hf_vision import vision_family
from hone.train.step import pair_split










def _fingerprint(data, source: str) -> str:
    """Identifies the pairs (tokens and masks) and the model the cache was computed for."""
    digest = hashlib.sha256(source.encode())
    for key in ("tokens", "score_mask" if data.shared_prompt else "loss_mask"):
        digest.update(np.ascontiguousarray(data.pairs[key]).tobytes())
    return digest.hexdigest()


def precompute_reference(model, mode_model_fn, data, run_dir: Path, log, source: str) -> None:
    """Reference log-probs of every training pair, computed once and cached in the run folder."""
    cache = run_dir / "reference_logps.npz"
    graphdef, state = nnx.split(mode_model_fn(model))

    @jax.jit
    def score(state, batch):
        seq, _, _ = sequence_logps(nnx.merge(graphdef, state), batch)
        return seq

    got, reused = cached_halves(cache, _fingerprint(data, source),
                                lambda batch: score(state, batch), data.batches(),
                                data.num_pairs, ("chosen", "rejected"))
    data.add_pair_arrays(ref_chosen_logp=got["chosen"], ref_rejected_logp=got["rejected"])
    log(f"reference log-probs: reusing {cache}" if reused else
        f"reference log-probs: computed for {data.num_pairs} pairs, cached in {cache}")


def run_dpo(cfg: DPOConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state, reference bytes)."""
    tokenizer = load_tokenizer(cfg.model.source)
    if vision_family(cfg.model.source) is None:
        train_data, eval_data = load_pairs(cfg, tokenizer, log,
                                           shared_prompt=cfg.dpo.shared_prompt)
    else:  # pairs whose prompts carry images (hone/data/vision_pairs.py)
        train_data, eval_data = load_vision_pairs(cfg, tokenizer, log)
    layout = make_layout(cfg, rows_per_example=2)
    model, trainable = build_model(cfg, layout=layout)
    run_dir = open_run(cfg)

    mode = reference_mode(cfg)
    graphdef, params, frozen, state, step, eval_step = compile_steps(
        cfg, model, trainable, make_dpo_loss(cfg, mode), pair_count,
        split=pair_split, layout=layout)
    # The starting weights, never updated: a real copy, since the train state's own buffers
    # are donated to (and overwritten by) every step.
    aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
    if mode == "precomputed":
        off = (lambda m: reference_model(m, "adapters_off", None)) if cfg.model.lora.rank else (
            lambda m: m)
        precompute_reference(model, off, train_data, run_dir, log, cfg.model.source)
        if eval_data is not None:
            precompute_reference(model, off, eval_data, run_dir / "eval", log, cfg.model.source)
    log(f"reference: {mode or 'none'} ({tree_bytes(aux) / 2**20:.1f} MiB of extra weights)")
    eval_fn = None
    if eval_data is not None:
        eval_fn = summed_eval(eval_step, frozen, eval_data, place=layout.place_batch,
                              aux=aux, max_batches=cfg.train.eval_batches, means=lambda t: means(
            t, "eval_") | {"eval_pairs": t.get("eval_pairs", 0.0)})
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=train_data.iterator(),
        eval_fn=eval_fn, place_batch=layout.place_batch,
        tokens_per_batch=work_tokens,
        flops_per_token=getattr(model, "text", model).config.flops_per_token(cfg.data.max_length),
        extra_metrics=means)
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final, tree_bytes(aux)
