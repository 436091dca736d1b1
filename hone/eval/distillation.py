"""Held-out evaluation of a distillation run: the summed token metrics of `make_eval_loss`
(KL(teacher || student), the student's perplexity, top-1 agreement, cosine of the final hidden
states) plus agreement of greedy answers on held-out prompts.

The teacher is frozen, so its greedy answers are generated once and reused at every evaluation;
only the student answers again. Two answers agree when their texts are equal; their final
answers agree when `hone.grading.extract_answer` reads the same number from both
(the bundled tasks), and accuracy compares with the reference completion the same way.
"""

from __future__ import annotations

import numpy as np

from hone.grading import extract_answer


class GreedyAgreement:
    """student model -> {"eval_answer_agree", "eval_text_agree", "eval_accuracy",
    "eval_teacher_accuracy"} over the first `count` held-out prompts."""

    def __init__(self, teacher, teacher_tokenizer, teacher_prompts: list[str], tokenizer,
                 prompts: list[str], refs: list[str | None], max_new_tokens: int):
        """Each model reads the prompts rendered by its own tokenizer (chat template)."""
        from hone.sampling.generate import generate
        self.generate = generate
        self.tokenizer, self.prompts, self.refs = tokenizer, prompts, refs
        self.max_new_tokens = max_new_tokens
        self.teacher = self._answers(teacher, teacher_tokenizer, teacher_prompts)

    def _answers(self, model, tokenizer, prompts) -> list[str]:
        outs = self.generate(model, tokenizer, prompts, max_new_tokens=self.max_new_tokens,
                             temperature=0.0)
        return [o.text for o in outs]

    def __call__(self, student) -> dict:
        mine = self._answers(student, self.tokenizer, self.prompts)
        finals = [extract_answer(t) for t in mine]
        teacher_finals = [extract_answer(t) for t in self.teacher]
        out = {"eval_text_agree": float(np.mean([a == b for a, b in zip(mine, self.teacher)])),
               "eval_answer_agree": float(np.mean([a is not None and a == b for a, b in
                                                   zip(finals, teacher_finals)]))}
        scored = [(f, t, extract_answer(r)) for f, t, r in zip(finals, teacher_finals, self.refs)
                  if r is not None]
        if scored:
            out["eval_accuracy"] = float(np.mean([f is not None and f == r
                                                  for f, _, r in scored]))
            out["eval_teacher_accuracy"] = float(np.mean([t is not None and t == r
                                                          for _, t, r in scored]))
        return out


def distill_eval_means(total: dict) -> dict:
    """Held-out means from summed eval metrics (keys prefixed eval_)."""
    targets = max(float(total.get("eval_targets", 0.0)), 1.0)
    out = {"eval_kl": total["eval_kl_sum"] / targets,
           "eval_top1_agree": total["eval_top1_agree_sum"] / targets}
    nll = total["eval_nll_sum"] / targets
    out["eval_loss"], out["eval_ppl"] = nll, float(np.exp(min(nll, 50.0)))
    t_nll = total["eval_teacher_nll_sum"] / targets
    out["eval_teacher_ppl"] = float(np.exp(min(t_nll, 50.0)))
    if "eval_cos_sum" in total:
        out["eval_cos"] = total["eval_cos_sum"] / targets
    return out
