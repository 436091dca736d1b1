"""Task accuracy with sampling: pass@1, pass@k and majority@k over `prompt` + `answer` records.

Definitions, for one prompt with n = k samples of which c are correct:
- pass@1 = c / n, the unbiased estimate of one sample's chance to be right (Chen et al. 2021,
  1 - C(n-c, 1) / C(n, 1)); with k = 1 and temperature 0 it is greedy accuracy;
- pass@k = 1 - C(n-c, k) / C(n, k): 1 when any of the k samples is right;
- majority@k: the most common final answer among the k samples (each read by the task's
  `extract`, samples without one not voting; a tie goes to the answer seen first) is right.
Each is averaged over the prompts.

`task_accuracy` is the plain greedy form for callers that hold the records and a checker
(`hone demo`): no prompt file, no truncation, one greedy answer per question. `accuracy` with
one sample at temperature 0 answers alike (tests/eval/test_eval.py compares the two).

The task checker is arithmetic's `is_correct` (the last "The answer is N", else the last
number, equals the reference as a number), for the bundled sets and for user files with
`prompt` and `answer` fields alike; majority@k reads answers with the same `extract_answer`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import comb
from typing import Callable

from hone.errors import InputError
from hone.grading import extract_answer, is_correct


@dataclass
class AccuracyReport:
    pass_at_1: float      # mean over prompts of c / k
    pass_at_k: float      # mean over prompts of 1 - C(k-c, k) / C(k, k)
    majority_at_k: float  # fraction of prompts whose majority answer is right
    prompts: int          # prompts scored
    samples: int          # k, completions per prompt
    temperature: float    # 0 = greedy
    truncated: int = 0    # prompts cut to leave room for max_new_tokens
    questions: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    completions: list[list[str]] = field(default_factory=list)  # [prompts][samples]
    correct: list[list[bool]] = field(default_factory=list)     # [prompts][samples]

    def as_dict(self) -> dict:
        return {"pass@1": self.pass_at_1, "pass@k": self.pass_at_k,
                "majority@k": self.majority_at_k, "k": self.samples, "prompts": self.prompts,
                "temperature": self.temperature, "truncated": self.truncated}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (k <= n)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_answer(texts: list[str], extract: Callable[[str], str | None] = extract_answer
                    ) -> str | None:
    """The most common extracted answer (first seen wins a tie), or None if none has one."""
    votes = Counter(a for a in map(extract, texts) if a is not None)
    return votes.most_common(1)[0][0] if votes else None


def score(completions: list[list[str]], references: list[str], *,
          check: Callable[[str, str], bool] = is_correct,
          extract: Callable[[str], str | None] = extract_answer) -> dict:
    """{"pass@1", "pass@k", "majority@k", "correct"} of k completions per prompt.
    check(text, reference) must accept an extracted answer as its text (is_correct does)."""
    correct = [[bool(check(t, r)) for t in texts] for texts, r in zip(completions, references)]
    k = len(completions[0])
    voted = [majority_answer(texts, extract) for texts in completions]
    n = max(len(completions), 1)
    return {"pass@1": sum(pass_at_k(k, sum(c), 1) for c in correct) / n,
            "pass@k": sum(pass_at_k(k, sum(c), k) for c in correct) / n,
            "majority@k": sum(v is not None and bool(check(v, r))
                              for v, r in zip(voted, references)) / n,
            "correct": correct}


def sampling_temperature(samples: int, temperature: float | None) -> float:
    """The temperature to sample k = `samples` completions at (None: 0, greedy, for one sample,
    1.0 for more); an InputError unless k >= 1, temperature >= 0, and k > 1 is not greedy."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise InputError(f"must be an integer >= 1 (completions per prompt), got {samples!r}",
                         key="--samples")
    if temperature is None:
        temperature = 0.0 if samples == 1 else 1.0
    if not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise InputError(f"must be >= 0 (0 = greedy), got {temperature!r}", key="--temperature")
    if samples > 1 and temperature == 0:
        raise InputError(f"{samples} samples at temperature 0 are {samples} copies of the greedy "
                         "answer, so pass@k and majority@k would say nothing new; set "
                         "--temperature above 0 (e.g. 0.7), or use --samples 1 for greedy "
                         "accuracy", key="--temperature")
    return float(temperature)


def accuracy(model, tokenizer, path: str, *, samples: int = 1, temperature: float | None = None,
             max_new_tokens: int = 64, limit: int | None = None, seed: int = 0,
             batch_size: int = 32, records: list[dict] | None = None,
             check: Callable[[str, str], bool] = is_correct,
             extract: Callable[[str], str | None] = extract_answer) -> AccuracyReport:
    """Sample `samples` completions per prompt and score them. temperature None: 0 (greedy)
    for one sample, 1.0 for more."""
    from hone.eval.generation import complete, load_prompts
    temperature = sampling_temperature(samples, temperature)
    data = load_prompts(tokenizer, path, context=model.config.max_position_embeddings,
                        max_new_tokens=max_new_tokens, limit=limit, records=records)
    for index, record in enumerate(data.records):
        if record.get("answer") is None:
            raise InputError(f"record {index}: no 'answer' field (fields present: "
                             f"{', '.join(map(repr, record))}); accuracy needs records with "
                             "'prompt' and 'answer', the reference the final number of a "
                             "completion is checked against (as in builtin:arithmetic-rl-eval)",
                             path=data.path, key="answer")
    references = [str(r["answer"]) for r in data.records]
    outs = complete(model, tokenizer, data.ids, max_new_tokens=max_new_tokens,  # prompt-major
                    temperature=temperature, seed=seed, batch_size=batch_size, n=samples)
    texts = [o.text for o in outs]
    completions = [texts[i * samples:(i + 1) * samples] for i in range(data.num_prompts)]
    result = score(completions, references, check=check, extract=extract)
    return AccuracyReport(result["pass@1"], result["pass@k"], result["majority@k"],
                          data.num_prompts, samples, temperature, data.truncated,
                          [r["prompt"] for r in data.records], references, completions,
                          result["correct"])


@dataclass
class TaskAccuracyReport:
    """What task_accuracy() found, question by question."""

    accuracy: float  # fraction of questions answered correctly
    correct: list[bool]
    questions: list[str]
    answers: list[str]  # the model's completions
    references: list[str]


def chat_prompt(tokenizer, question: str) -> str:
    """The question as one user turn of the tokenizer's chat template, ready for the answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True)


def task_accuracy(model, tokenizer, records: list[dict], check: Callable[[str, str], bool], *,
                  max_new_tokens: int = 32, batch_size: int = 32) -> TaskAccuracyReport:
    """Greedy pass@1 of `records` ({"prompt": question, "answer": reference}), each completion
    scored by check(completion, reference)."""
    from hone.sampling.generate import generate
    questions = [r["prompt"] for r in records]
    references = [str(r["answer"]) for r in records]
    answers: list[str] = []
    for i in range(0, len(questions), batch_size):
        prompts = [chat_prompt(tokenizer, q) for q in questions[i:i + batch_size]]
        outs = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
        answers.extend(o.text for o in outs)
    correct = [check(a, r) for a, r in zip(answers, references)]
    return TaskAccuracyReport(sum(correct) / max(len(correct), 1), correct, questions, answers,
                              references)
