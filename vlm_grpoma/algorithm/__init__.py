"""Pure tensor math of GRPO-MA: advantages, the clipped policy objective, training diagnostics."""

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.diagnostics import GradientSpikeTracker, thought_advantage_variance
from vlm_grpoma.algorithm.loss import LossOutput, LossStats, Segments, grpo_ma_token_weights, policy_loss

__all__ = [
    "GradientSpikeTracker",
    "LossOutput",
    "LossStats",
    "Segments",
    "grpo_ma_advantages",
    "grpo_ma_token_weights",
    "policy_loss",
    "thought_advantage_variance",
]
