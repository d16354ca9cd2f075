"""Reward functions: the protocol in base.py, names and the weighted combination in registry.py, one module
per built-in reward (``format``, ``iou`` in detection.py, ``affordance``, ``trajectory``, ``manipulation``)."""

from vlm_grpoma.rewards.base import Completion, Reward, RewardResult
from vlm_grpoma.rewards.registry import build_reward, build_rewards, register_reward, registered_rewards

__all__ = [
    "Completion",
    "Reward",
    "RewardResult",
    "build_reward",
    "build_rewards",
    "register_reward",
    "registered_rewards",
]
