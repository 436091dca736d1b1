"""The memory planner behind `hone plan`: per-device bytes of a training run from its config,
before anything is allocated.

- inputs.py: PlanInput, the settings that change bytes, read from a config or a preset.
- weights.py: parameters, gradients, Adam state, frozen bases (QLoRA), reference/teacher/critic.
- activations.py: saved activations per remat policy, the LM head's chunk, attention, the
  scan's stacked weights, fsdp's gathered weights.
- rollout.py: an RL rollout's KV cache and prefill.
- budget.py: the phases, the peak, the fit and the smallest changes that fit.
- command.py: the command line and its text/JSON report.
"""

from hone.plan.budget import Plan, make_plan, suggestions
from hone.plan.inputs import PlanInput, from_config

__all__ = ["Plan", "PlanInput", "from_config", "make_plan", "suggestions"]
