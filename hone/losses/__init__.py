"""Losses: pure functions of arrays returning (loss, metrics). They never see a model or config."""

from hone.losses.common import masked_mean, token_logprobs
from hone.losses.sft import sft_loss

__all__ = ["masked_mean", "sft_loss", "token_logprobs"]
