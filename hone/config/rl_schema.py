"""The configuration of the RL commands: `hone grpo` and `hone ppo`.

Design choices:
- `train.batch_size` counts completions per step (prompts x group_size), as TRL's generation
  batch does, so `train.grad_accum` splits completions into micro-batches exactly as in SFT.
- One step is one rollout (generate, score, compute advantages) followed by
  `iterations x minibatches` optimizer updates on it; the learning-rate schedule counts updates.
- Rewards are a fixed, typed section (each built-in with its weight; 0 = off) plus user
  functions by import path, rather than a free-form list, so every key is checked on load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.config.agent_schema import AgentSection
from hone.config.schema import DataSection, TrainConfig
from hone.errors import InputError

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _rl_data() -> DataSection:
    return DataSection(path="builtin:arithmetic-rl", eval_path="builtin:arithmetic-rl-eval",
                       overlong="drop")


@dataclass(frozen=True)
class RolloutKeys:
    # Completions sampled per prompt (G); advantages compare the samples of one prompt.
    group_size: int = field(default=4, metadata={"min": 1})
    # Prompt tokens after the chat template; longer prompts follow data.overlong
    # (drop = skip the record, truncate = keep the last tokens).
    max_prompt_tokens: int = field(default=64, metadata={"min": 1})
    # Tokens generated per completion (the end-of-sequence token included).
    max_new_tokens: int = field(default=32, metadata={"min": 1})
    # Sampling temperature of the rollouts (> 0: RL needs samples, not greedy answers).
    temperature: float = field(default=1.0, metadata={"gt": 0.0})
    # Nucleus sampling; None = off.
    top_p: float | None = field(default=None, metadata={"gt": 0.0, "max": 1.0})
    # Top-k sampling; None = off.
    top_k: int | None = field(default=None, metadata={"min": 1})
    # Wrap each prompt in the tokenizer's chat template as a user message.
    chat: bool = True
    # The sampler's KV-cache dtype: auto = the model's parameter dtype; bfloat16 halves the
    # cache (log-prob drift measured in docs/guides/_sampler_long.md).
    cache_dtype: str = field(default="auto", metadata={"choices": ("auto", "float32", "bfloat16")})
    # What samples single-turn completions: paged = the rollout engine
    # (docs/guides/rollouts.md): at most max_seqs sequences at once over a paged cache, a
    # finished one's place taken by the next; static = the lockstep sampler over a preallocated
    # cache (every row decodes until the longest ends); auto = paged on a CPU, static on a GPU
    # or TPU (where the paged engine is slower so far). Agent episodes always run paged.
    engine: str = field(default="auto", metadata={"choices": ("auto", "paged", "static")})
    # Sequences the paged engine decodes at once; None = every sample of the step, at most 64.
    max_seqs: int | None = field(default=None, metadata={"min": 1})
    # Held-out prompts answered greedily at each evaluation (accuracy, mean reward).
    eval_prompts: int = field(default=64, metadata={"min": 1})
    # Asynchronous RL (docs/guides/async.md): the rollout of step t is sampled with the policy
    # of step t - max_staleness exactly, while the update of step t - 1 runs; 0 = the rollout
    # waits for the update (synchronous). The lag is fixed, so a run is reproducible and resumes
    # bit for bit with its rollout in flight.
    max_staleness: int = field(default=0, metadata={"min": 0})
    # Seconds a step waits for its rollout before the run stops with an error naming the step
    # (a hung reward function, environment or sampler); None = no limit.
    rollout_timeout_s: float | None = field(default=3600.0, metadata={"gt": 0.0})


@dataclass(frozen=True)
class RewardsSection:
    # Weight of the numeric answer match (1 when the final answer equals the `answer` column).
    answer_match: float = 1.0
    # The record field holding the reference answer.
    answer_column: str = "answer"
    # Weight of the format reward: 1 when the completion matches format_pattern (re.search).
    format: float = 0.0
    # The regular expression of the format reward.
    format_pattern: str = r"The answer is -?\d+"
    # Weight of the length penalty: -(tokens beyond length_target) / 100 per completion.
    length: float = 0.0
    # Completion tokens allowed before the length penalty starts.
    length_target: int = field(default=32, metadata={"min": 0})
    # Weight of DAPO's soft overlong penalty (0 up to max_new_tokens - overlong_cache tokens,
    # then linear down to -1 at max_new_tokens).
    overlong: float = 0.0
    # Tokens of the overlong penalty's linear zone.
    overlong_cache: int = field(default=8, metadata={"min": 1})
    # A reward-model folder written by `hone export` of a `hone reward` run; None = none.
    reward_model: str | None = None
    # Weight of the reward model's score.
    reward_model_weight: float = 1.0
    # User reward functions "package.module:function", called as fn(prompts, completions,
    # **columns) -> list[float].
    functions: tuple[str, ...] = ()
    # Weight of each user function, in order; empty = 1 each.
    function_weights: tuple[float, ...] = ()
    # Seconds a reward function may take before its samples get `fallback`.
    timeout_s: float = field(default=30.0, metadata={"gt": 0.0})
    # Reward given to samples whose reward function raised, hung or returned junk.
    fallback: float = 0.0


@dataclass(frozen=True)
class GRPOSection(RolloutKeys):
    # Advantage scaling: group std, batch std, or none (mean-centred only; Dr.GRPO).
    scale: str = field(default="group", metadata={"choices": ("group", "batch", "none")})
    # RLOO: the baseline is the mean of the other samples of the group.
    leave_one_out: bool = False
    # Loss aggregation (token-mean = DAPO; seq-mean-token-mean = GRPO paper;
    # seq-mean-token-sum-norm = Dr.GRPO).
    loss_agg: str = field(default="token-mean", metadata={"choices": AGGREGATIONS})
    # Importance ratio per token, or per sequence (GSPO).
    ratio: str = field(default="token", metadata={"choices": ("token", "sequence")})
    # The policy loss: policy = the clipped surrogate (PPO/GRPO/DAPO/GSPO by the keys here);
    # cispo = CISPO (MiniMax-M1): -sg(min(ratio, 1 + clip_eps_high)) * A * logp, the weight
    # detached so no token loses its gradient to clipping.
    loss_type: str = field(default="policy", metadata={"choices": ("policy", "cispo")})
    # Clipping range below 1 (policy loss only).
    clip_eps: float = field(default=0.2, metadata={"gt": 0.0})
    # Clipping range above 1 (DAPO clip-higher); None = clip_eps. With loss_type cispo: the
    # cap of the importance weight, 1 + clip_eps_high; None = 5 (hone.losses.cispo_loss).
    clip_eps_high: float | None = field(default=None, metadata={"gt": 0.0})
    # KL coefficient; 0 = no reference model is loaded or run.
    beta: float = field(default=0.0, metadata={"min": 0.0})
    # KL estimator: k1, k2 or k3.
    kl_kind: str = field(default="k3", metadata={"choices": ("k1", "k2", "k3")})
    # The reference: copy of the starting weights, the base with adapters off, or auto.
    reference: str = field(default="auto", metadata={
        "choices": ("auto", "copy", "adapters_off")})
    # Devices of the reference's own: the last N of this host's (its weights split over them,
    # its forward a separate program); 0 = the reference runs inside the policy's step.
    reference_devices: int = field(default=0, metadata={"min": 0})
    # Devices of the rollout's own: the last N of those the reference leaves (the frozen
    # weights placed there once, the trained ones sent before each rollout); 0 = the rollout
    # samples on the policy's devices. With max_staleness > 0 the two phases then overlap on
    # separate devices.
    rollout_devices: int = field(default=0, metadata={"min": 0})
    # Optimisation passes over each rollout (mu); > 1 uses stored old log-probabilities.
    iterations: int = field(default=1, metadata={"min": 1})
    # DAPO dynamic sampling: drop groups whose rewards are all equal and refill with new
    # prompts (agent episodes too), up to this many extra generation rounds per step; 0 = off.
    dynamic_sampling_rounds: int = field(default=0, metadata={"min": 0})
    # Withhold an update whose gradient is exactly zero (every group's rewards equal, no KL
    # or other term): the weights and the optimizer's moments stay, where Adam would still
    # move the weights by its momentum; the step counter and data move on, and the row logs
    # update_skipped. Off: the update is applied as optax computes it.
    skip_zero_updates: bool = False
    # Truncated importance sampling: weight tokens by min(pi_trainer / pi_sampler, cap);
    # None = off.
    tis_cap: float | None = field(default=None, metadata={"gt": 0.0})
    # IcePop-style token masking: tokens whose ratio pi_trainer / pi_sampler lies outside
    # [low, high] get no gradient, e.g. [0.5, 2.0]; [] = off.
    icepop_band: tuple[float, ...] = field(default=(), metadata={"gt": 0.0})
    # Sequence masking: every token of a sample whose geometric-mean ratio pi_trainer /
    # pi_sampler lies outside [low, high] gets no gradient, e.g. [0.9, 1.1]; [] = off.
    seq_mask_band: tuple[float, ...] = field(default=(), metadata={"gt": 0.0})
    # Score each prompt once for its group: one row [prompt | sample 1 | ... | sample G] in
    # which the samples cannot see each other (the same log-probabilities as a row per sample,
    # to float rounding, for fewer FLOPs). Used unless the groups do not split evenly over the
    # mesh's data shards and train.grad_accum micro-batches; false: a row per sample.
    shared_prompt: bool = True


@dataclass(frozen=True)
class PPOSection(RolloutKeys):
    # One completion per prompt is classic PPO; more are allowed.
    group_size: int = field(default=1, metadata={"min": 1})
    # The critic: a value head on the policy's backbone (shared) or on its own copy.
    critic: str = field(default="shared", metadata={"choices": ("shared", "separate")})
    # Initial per-token KL penalty coefficient folded into the reward.
    kl_coef: float = field(default=0.05, metadata={"min": 0.0})
    # Adaptive KL controller target (per sequence); None = fixed kl_coef.
    kl_target: float | None = field(default=None, metadata={"gt": 0.0})
    # Adaptive controller horizon, in completions.
    kl_horizon: int = field(default=10000, metadata={"min": 1})
    # Discount of future rewards (and values) in GAE and the returns.
    gamma: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    # GAE lambda: 1 = discounted return minus the value, 0 = one-step TD error.
    lam: float = field(default=0.95, metadata={"min": 0.0, "max": 1.0})
    # Normalise advantages over the rollout's completion tokens.
    whiten_advantages: bool = True
    # Policy clipping range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps].
    clip_eps: float = field(default=0.2, metadata={"gt": 0.0})
    # Value clipping range: new values are clipped to within this of the rollout's values.
    value_clip: float = field(default=0.2, metadata={"gt": 0.0})
    # Weight of the value loss in the total loss.
    vf_coef: float = field(default=0.1, metadata={"min": 0.0})
    # Passes over each rollout.
    epochs: int = field(default=2, metadata={"min": 1})
    # Minibatches (optimizer updates) per pass; train.batch_size must split into
    # minibatches x train.grad_accum micro-batches.
    minibatches: int = field(default=1, metadata={"min": 1})
    # The reference: copy of the starting weights, the base with adapters off, an EMA of the
    # policy (updated after every step), or auto (adapters_off with LoRA, else copy).
    reference: str = field(default="auto", metadata={
        "choices": ("auto", "copy", "adapters_off", "ema")})
    # EMA reference decay: ref <- decay * ref + (1 - decay) * policy.
    ema_decay: float = field(default=0.99, metadata={"min": 0.0, "lt": 1.0})
    # Devices of the reference's own: the last N of this host's (its weights split over them,
    # its forward a separate program; an EMA reference's weights are sent there every step);
    # 0 = the reference runs inside the policy's step.
    reference_devices: int = field(default=0, metadata={"min": 0})
    # Devices of the rollout's own (as grpo.rollout_devices); 0 = the policy's devices.
    rollout_devices: int = field(default=0, metadata={"min": 0})
    # Score each prompt once for its group (as grpo.shared_prompt): one row [prompt | sample 1 |
    # ... | sample G], the policy, critic and reference read at the samples' slots only. Used
    # unless the groups do not split evenly over the mesh's data shards, minibatches and
    # train.grad_accum micro-batches; false: a row per sample.
    shared_prompt: bool = True


@dataclass(frozen=True)
class RLConfig(TrainConfig):
    """What `hone grpo` and `hone ppo` share: prompt data and rewards. Subclasses add their
    section, named by SECTION."""

    SECTION = ""  # the algorithm's section (a class attribute, not a config key)
    # Prompts with reference answers: `prompt` + `answer` (+ any columns rewards read).
    data: DataSection = field(default_factory=_rl_data)
    # The reward functions and their weights.
    rewards: RewardsSection = field(default_factory=RewardsSection)
    # Multi-turn episodes with tools or an environment (hone.agents); off by default.
    agent: AgentSection = field(default_factory=AgentSection)

    def __post_init__(self):
        super().__post_init__()
        name = self.SECTION
        s = getattr(self, name)
        if self.train.batch_size % s.group_size:
            raise InputError(f"{self.train.batch_size} completions per step are not a whole "
                             f"number of groups of {name}.group_size ({s.group_size})",
                             key="train.batch_size")
        if s.reference == "adapters_off" and self.model.lora.rank == 0:
            raise InputError("switching adapters off needs adapters: set model.lora.rank > 0, "
                             f"or {name}.reference to copy", key=f"{name}.reference")
        a = self.agent
        if a.enabled and s.max_prompt_tokens + s.max_new_tokens > a.max_episode_tokens:
            raise InputError(f"an opening of {name}.max_prompt_tokens ({s.max_prompt_tokens}) "
                             f"and one turn of {name}.max_new_tokens ({s.max_new_tokens}) do not "
                             f"fit agent.max_episode_tokens ({a.max_episode_tokens})",
                             key="agent.max_episode_tokens")
        if a.enabled and a.env_timeout_s <= a.tool_timeout_s:
            raise InputError(f"an environment step that runs tools needs more time than one tool "
                             f"call: agent.env_timeout_s ({a.env_timeout_s}) must exceed "
                             f"agent.tool_timeout_s ({a.tool_timeout_s})",
                             key="agent.env_timeout_s")
        if a.switch_turn is not None and (not a.enabled or not s.max_staleness
                                          or a.switch_turn >= a.max_turns):
            raise InputError(f"partial episodes need an agent, {name}.max_staleness > 0 (else "
                             f"the weights never change during a rollout) and a turn below "
                             f"agent.max_turns ({a.max_turns}), got {a.switch_turn}",
                             key="agent.switch_turn")
        a.template_kwargs()  # each name=value well formed
        if a.endpoint is not None and (a.environment is not None or a.tools):
            raise InputError("an endpoint process is the environment: give no agent.environment "
                             "or agent.tools beside it", key="agent.endpoint")
        if a.endpoint is not None and getattr(s, "dynamic_sampling_rounds", 0):
            raise InputError("dynamic sampling is not available with an endpoint process: it "
                             "plays the episodes it is given once; set "
                             f"{name}.dynamic_sampling_rounds=0",
                             key=f"{name}.dynamic_sampling_rounds")
        if a.environment is not None and a.tools:
            raise InputError("give an environment or tools, not both (an environment brings "
                             "its own tools)", key="agent.tools")
        w = self.rewards.function_weights
        if w and len(w) != len(self.rewards.functions):
            raise InputError(f"{len(w)} weights for {len(self.rewards.functions)} functions",
                             key="rewards.function_weights")


@dataclass(frozen=True)
class GRPOConfig(RLConfig):
    """`hone grpo`: GRPO and its variants (Dr.GRPO, DAPO, GSPO, RLOO)."""

    SECTION = "grpo"
    # Rollouts, advantages and the policy loss.
    grpo: GRPOSection = field(default_factory=GRPOSection)

    def __post_init__(self):
        super().__post_init__()
        g = self.grpo
        if g.group_size < 2 and (g.scale == "group" or g.leave_one_out):
            raise InputError("group advantages need at least 2 samples per prompt",
                             key="grpo.group_size")
        if g.loss_type == "cispo":
            for key, bad, why in (
                    ("loss_agg", g.loss_agg == "seq-mean-token-sum-norm",
                     "aggregates by token-mean or seq-mean-token-mean"),
                    ("ratio", g.ratio != "token", "weights each token by its own ratio"),
                    ("beta", g.beta > 0, "has no KL term; set grpo.beta = 0"),
                    ("tis_cap", g.tis_cap is not None, "has no importance-sampling correction"),
                    ("icepop_band", bool(g.icepop_band), "has no token masking"),
                    ("seq_mask_band", bool(g.seq_mask_band), "has no sequence masking")):
                if bad:
                    raise InputError(f"grpo.loss_type = cispo {why}", key=f"grpo.{key}")
        for key in ("icepop_band", "seq_mask_band"):
            band = getattr(g, key)
            if band and not (len(band) == 2 and band[0] < 1.0 < band[1]):
                raise InputError(f"grpo.{key} is [low, high] with low < 1 < high, got "
                                 f"{list(band)}", key=f"grpo.{key}")
        if g.reference_devices and g.beta == 0:
            raise InputError("grpo.beta = 0 runs no reference model, so there is none to put "
                             "on devices of its own", key="grpo.reference_devices")


@dataclass(frozen=True)
class PPOConfig(RLConfig):
    """`hone ppo`: PPO with a critic, GAE and a KL penalty in the reward."""

    SECTION = "ppo"
    # Rollouts, the critic, the KL-shaped reward, GAE and the clipped losses.
    ppo: PPOSection = field(default_factory=PPOSection)

    def __post_init__(self):
        super().__post_init__()
        if self.train.batch_size % (self.ppo.minibatches * self.train.grad_accum):
            raise InputError(f"{self.train.batch_size} completions do not split into "
                             f"{self.ppo.minibatches} minibatches of {self.train.grad_accum} "
                             "micro-batches", key="ppo.minibatches")
        p = self.ppo
        if p.reference_devices and p.kl_coef == 0 and p.kl_target is None:
            raise InputError("ppo.kl_coef = 0 with no kl_target runs no reference model, so "
                             "there is none to put on devices of its own",
                             key="ppo.reference_devices")
