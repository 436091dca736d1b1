"""The configuration of `hone dpo`: the preference loss, its reference model, and online DPO.

Design choices:
- Offline (the default), the data are preference pairs and `train.batch_size` counts pairs.
- Online DPO (Guo et al. 2024) is the same command with `dpo.online: true`, since it is the same
  loss, reference and trained model (export, pipeline stages and `hone eval` treat it as any DPO
  run); only where the pairs come from differs. Its data are prompts (as `hone grpo` reads them),
  its sampling keys are the RL commands' (`RolloutKeys`, here in the `dpo:` section) and its
  judge is the RL commands' `rewards:` section (reward functions and/or a reward model).
  `train.batch_size` still counts pairs: prompts per step, each sampled `group_size` times.
- The online keys are errors in an offline config (and the offline-only choices in an online
  one), so a setting that would be silently ignored is named instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hone.config.rl_schema import RewardsSection, RolloutKeys
from hone.config.schema import DataSection, TrainConfig, preference_data
from hone.errors import InputError

# Losses online DPO trains with: those of hone.losses.dpo_loss (all read a reference).
ONLINE_LOSSES = ("sigmoid", "ipo", "hinge", "robust")


@dataclass(frozen=True)
class DPOSection(RolloutKeys):
    # Online only: completions sampled per prompt; the judge's best and worst of them form the
    # prompt's pair (2: the two samples, as in the paper).
    group_size: int = field(default=2, metadata={"min": 2})
    # The preference loss: DPO variants compare with a reference model; simpo and orpo need none.
    loss_type: str = field(default="sigmoid", metadata={
        "choices": ("sigmoid", "ipo", "hinge", "robust", "simpo", "orpo")})
    # Strength of the preference (DPO/IPO/hinge/robust/ORPO); SimPO's own default is 2.0.
    beta: float = field(default=0.1, metadata={"gt": 0.0})
    # Label noise for sigmoid (conservative DPO) and robust: probability a pair is flipped.
    label_smoothing: float = field(default=0.0, metadata={"min": 0.0, "lt": 0.5})
    # SimPO's target reward margin.
    simpo_gamma: float = 0.5
    # Where reference log-probabilities come from: "copy" (a frozen copy of the starting
    # weights), "adapters_off" (the base with LoRA switched off: no second copy; needs
    # model.lora.rank > 0), "precomputed" (one pass over the data before training, cached in
    # run_dir/reference_logps.npz; offline only), or "auto" (adapters_off with LoRA, else copy).
    reference: str = field(default="auto", metadata={
        "choices": ("auto", "copy", "adapters_off", "precomputed")})
    # Score each pair's prompt once: one row [prompt | chosen | rejected] in which the answers
    # cannot see each other, and the LM head only where answer tokens are predicted. The same
    # log-probabilities as two rows per pair (to float rounding) for fewer FLOPs; false: two rows.
    # Online DPO always does.
    shared_prompt: bool = True
    # Online DPO: each step samples group_size completions of each of train.batch_size prompts
    # of data.path from the current weights, the judge (rewards:) scores them, and the loss
    # trains on the best against the worst; a prompt whose samples all score the same is
    # skipped (counted). false: fixed pairs (prompt + chosen + rejected) from data.path.
    online: bool = False


# The keys only online DPO reads (RolloutKeys' sampling keys).
_ONLINE_KEYS = tuple(f.name for f in fields(RolloutKeys))


@dataclass(frozen=True)
class DPOConfig(TrainConfig):
    """`hone dpo`: preference tuning (DPO, IPO, hinge, robust, SimPO, ORPO), offline or online."""

    # Preference pairs: `prompt` + `chosen` + `rejected`; with dpo.online, prompts (+ the
    # columns the judge reads, e.g. `answer`).
    data: DataSection = field(default_factory=preference_data)
    # The preference loss and its reference model; online DPO's sampling.
    dpo: DPOSection = field(default_factory=DPOSection)
    # Online DPO's judge: the reward functions (and reward model) that rank the samples, as
    # `hone grpo` reads them; online only (an offline config that sets it is an error).
    rewards: RewardsSection = field(default_factory=RewardsSection)

    def __post_init__(self):
        super().__post_init__()
        d = self.dpo
        if d.label_smoothing and d.loss_type not in ("sigmoid", "robust"):
            raise InputError(f"label smoothing applies to the sigmoid and robust losses only, "
                             f"not {d.loss_type!r}", key="dpo.label_smoothing")
        if d.reference == "adapters_off" and self.model.lora.rank == 0:
            raise InputError("switching adapters off needs adapters: set model.lora.rank > 0, "
                             "or dpo.reference to copy or precomputed", key="dpo.reference")
        if d.online:
            self._check_online()
            return
        default, judge = DPOSection(), RewardsSection()
        for name in _ONLINE_KEYS:
            if getattr(d, name) != getattr(default, name):
                raise InputError("samples completions, which only online DPO does: set "
                                 "dpo.online: true, or remove this key", key=f"dpo.{name}")
        for f in fields(RewardsSection):
            if getattr(self.rewards, f.name) != getattr(judge, f.name):
                raise InputError("the judge of online DPO; offline pairs come ranked: set "
                                 "dpo.online: true, or remove this key",
                                 key=f"rewards.{f.name}")

    def _check_online(self) -> None:
        d = self.dpo
        if d.loss_type not in ONLINE_LOSSES:
            raise InputError(f"online DPO trains with {', '.join(ONLINE_LOSSES)} (losses with a "
                             f"reference), not {d.loss_type!r}", key="dpo.loss_type")
        if d.reference == "precomputed":
            raise InputError("online DPO's completions are new every step, so their reference "
                             "log-probabilities cannot be computed up front: use auto, copy or "
                             "adapters_off", key="dpo.reference")
        if not d.shared_prompt:
            raise InputError("online DPO always scores a prompt once with its samples (the "
                             "sampler's shared prefill, then one row per prompt); remove "
                             "dpo.shared_prompt: false", key="dpo.shared_prompt")
        if self.data.pack:
            raise InputError("online DPO lays out one row per prompt and its samples; packing "
                             "is not supported", key="data.pack")
        w = self.rewards.function_weights
        if w and len(w) != len(self.rewards.functions):
            raise InputError(f"{len(w)} weights for {len(self.rewards.functions)} functions",
                             key="rewards.function_weights")
