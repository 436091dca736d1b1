"""Two models compared under a reward model: the win rate of A's greedy answers over B's.

Design choices:
- Each model answers each prompt greedily through its own chat template (`hone.eval.
  generation`); the reward model then scores both answers the way RL's `reward_model` reward
  does (`RewardModelScorer`: the prompt in the reward model's own chat template, followed by the
  answer text). So the comparison is "which policy would RL with this reward model prefer", and
  two models with different templates are judged on the same prompt text.
- A wins a prompt when its score is higher, loses when lower; a tie (equal scores, or the same
  answer text) counts half. win rate = (wins + ties / 2) / prompts.
- The models are loaded one at a time by the caller (`greedy_answers` per model), so two large
  models never sit in memory together.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompareReport:
    win_rate: float   # (wins + ties / 2) / prompts, for model A
    wins: int         # prompts where A's answer scores higher
    ties: int         # equal scores, or the same answer text
    losses: int       # prompts where B's answer scores higher
    reward_a: float   # A's mean reward
    reward_b: float   # B's mean reward
    prompts: int
    questions: list[str] = field(default_factory=list)
    answers_a: list[str] = field(default_factory=list)
    answers_b: list[str] = field(default_factory=list)
    rewards_a: list[float] = field(default_factory=list)
    rewards_b: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        keys = ("win_rate", "wins", "ties", "losses", "reward_a", "reward_b", "prompts")
        return {k: getattr(self, k) for k in keys}


def win_rate(rewards_a: list[float], rewards_b: list[float],
             same: list[bool] | None = None) -> tuple[float, int, int, int]:
    """(win rate of A with ties counted half, wins, ties, losses). same[i]: the two answers are
    the same text, a tie whatever the scores (a scorer need not be bitwise repeatable)."""
    same = same or [False] * len(rewards_a)
    ties = sum(s or a == b for a, b, s in zip(rewards_a, rewards_b, same, strict=True))
    wins = sum(not s and a > b for a, b, s in zip(rewards_a, rewards_b, same))
    losses = len(rewards_a) - wins - ties
    return (wins + ties / 2) / max(len(rewards_a), 1), wins, ties, losses


def greedy_answers(model, tokenizer, path: str, *, max_new_tokens: int = 64,
                   limit: int | None = None, batch_size: int = 32,
                   records: list[dict] | None = None) -> tuple[list[str], list[str]]:
    """(the records' prompts, the model's greedy answer to each)."""
    from hone.eval.generation import complete, load_prompts
    data = load_prompts(tokenizer, path, context=model.config.max_position_embeddings,
                        max_new_tokens=max_new_tokens, limit=limit, records=records)
    outs = complete(model, tokenizer, data.ids, max_new_tokens=max_new_tokens,
                    batch_size=batch_size)
    return [r["prompt"] for r in data.records], [o.text for o in outs]


def compare_answers(questions: list[str], answers_a: list[str], answers_b: list[str],
                    scorer) -> CompareReport:
    """Score both models' answers with `scorer` (`fn(prompts, completions) -> list[float]`,
    e.g. `hone.eval.models.reward_scorer`) and count wins."""
    from hone.rl.prompts import prompt_text
    tokenizer = getattr(scorer, "tokenizer", None)
    chat = getattr(tokenizer, "chat_template", None) is not None
    prompts = [prompt_text(tokenizer, q, chat) for q in questions]
    rewards_a = [float(x) for x in scorer(prompts, answers_a)]
    rewards_b = [float(x) for x in scorer(prompts, answers_b)]
    rate, wins, ties, losses = win_rate(rewards_a, rewards_b,
                                        [a == b for a, b in zip(answers_a, answers_b)])
    n = max(len(questions), 1)
    return CompareReport(rate, wins, ties, losses, sum(rewards_a) / n, sum(rewards_b) / n,
                         len(questions), questions, answers_a, answers_b, rewards_a, rewards_b)
