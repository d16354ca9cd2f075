"""Reward functions: protocol and registry in base.py, one module per reward.

Importing this package registers the grounding rewards (``format``, ``iou``, ``affordance``,
``trajectory``) so that :func:`build_reward` finds them by name.
"""

from vlm_grpoma.rewards import affordance, detection, format, trajectory  # noqa: F401  (registration)
from vlm_grpoma.rewards.base import (
    Completion,
    Reward,
    RewardResult,
    build_reward,
    register_reward,
    registered_rewards,
)

__all__ = ["Completion", "Reward", "RewardResult", "build_reward", "register_reward", "registered_rewards"]
