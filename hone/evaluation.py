"""Task accuracy by generation: ask each held-out question through the chat template, decode
greedily, and score the answer with the task's checker (pass@1 under greedy decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hone.sampling.generate import generate


@dataclass
class AccuracyReport:
    accuracy: float  # fraction of questions answered correctly
    correct: list[bool]
    questions: list[str]
    answers: list[str]  # the model's completions
    references: list[str]


def chat_prompt(tokenizer, question: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True)


def task_accuracy(model, tokenizer, records: list[dict], check: Callable[[str, str], bool], *,
                  max_new_tokens: int = 32, batch_size: int = 32) -> AccuracyReport:
    """records: {"prompt": question, "answer": reference}; check(completion, reference)."""
    questions = [r["prompt"] for r in records]
    references = [str(r["answer"]) for r in records]
    answers: list[str] = []
    for i in range(0, len(questions), batch_size):
        prompts = [chat_prompt(tokenizer, q) for q in questions[i:i + batch_size]]
        outs = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
        answers.extend(o.text for o in outs)
    correct = [check(a, r) for a, r in zip(answers, references)]
    return AccuracyReport(sum(correct) / max(len(correct), 1), correct, questions, answers,
                          references)
