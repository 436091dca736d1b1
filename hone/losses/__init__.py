"""Losses: pure functions of arrays returning (loss, metrics). They never see a model or config."""

from hone.losses.common import masked_mean, token_logprobs
from hone.losses.distill import attention_transfer_loss, distill_loss, feature_loss, topk_logits
from hone.losses.kto import kto_loss
from hone.losses.preference import dpo_loss, orpo_loss, reward_loss, sequence_logprobs, simpo_loss
from hone.losses.rl import (cispo_loss, gae, gae_over_mask, grpo_advantages, kl_penalty,
                            policy_loss, policy_loss_denominator, value_loss, whiten)
from hone.losses.sft import sft_loss

__all__ = ["attention_transfer_loss", "cispo_loss", "distill_loss", "dpo_loss", "feature_loss",
           "gae", "gae_over_mask", "grpo_advantages", "kl_penalty", "kto_loss", "masked_mean",
           "orpo_loss", "policy_loss", "policy_loss_denominator", "reward_loss", "sequence_logprobs",
           "sft_loss", "simpo_loss", "token_logprobs", "topk_logits", "value_loss", "whiten"]
