"""`hone eval`: perplexity on text, task accuracy with sampling (pass@1, pass@k, majority@k),
reward-model pairwise accuracy, and the win rate of one model over another under a reward model.

Library functions take loaded models (see `hone.eval.models` to load any source, run folders
included); `hone.eval.command` is the command line.
"""

from hone.eval.accuracy import AccuracyReport, accuracy, majority_answer, pass_at_k
from hone.eval.compare import CompareReport, compare_answers, greedy_answers, win_rate
from hone.eval.models import load_policy, load_reward, reward_scorer
from hone.eval.pairs import PairsReport, pair_accuracy
from hone.eval.perplexity import PerplexityReport, perplexity

__all__ = ["AccuracyReport", "CompareReport", "PairsReport", "PerplexityReport", "accuracy",
           "compare_answers", "greedy_answers", "load_policy", "load_reward", "majority_answer",
           "pair_accuracy", "pass_at_k", "perplexity", "reward_scorer", "win_rate"]
